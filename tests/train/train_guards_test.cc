// What keeps a user's run and checkpoints from being mixed up, started as users start train:
// a second run on a directory another run uses is refused at its start; --resume refuses a
// checkpoint of other model flags, or whose `extra` is malformed, with one line before any
// tensor is read; a checkpoint at --steps trains nothing and says so; resuming an earlier
// step sets the later checkpoints aside instead of leaving --resume latest to them; a
// checkpoint's tensors that the run would not read are named.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_descriptor.h"
#include "tests/train/train_runner.h"

namespace dtr {
namespace {

namespace fs = std::filesystem;

using testing::CommandResult;
using testing::kTrain;

// The tiny model without --heads, which the cases vary.
const std::string kFlags =
    "--dim 16 --layers 1 --seq-len 16 --batch-size 4 --eval-every 0 --log-every 5 --warmup 0 --threads 1 "
    "--use-dcp-checkpointing";

CommandResult run(const std::string& command, const fs::path& dir) {
  return testing::run_command(command, dir / "output.txt");
}

// Rewrites the checkpoint's metadata with `edit` applied to its `extra`.
template <class Edit>
void edit_extra(const fs::path& checkpoint, Edit edit) {
  const fs::path path = checkpoint / ".metadata.json";
  nlohmann::json metadata = nlohmann::json::parse(testing::read_file(path));
  edit(metadata["extra"]);
  std::ofstream(path) << metadata.dump();
}

TEST_CASE("a second run on an --out another run holds is refused at its start, naming that run's pid",
          "[train][checkpoint]") {
  const fs::path dir = testing::fresh_dir("guards_lock");
  const fs::path out = dir / "out";
  fs::create_directories(out);
  // This process stands for the other run: it holds the lock file as train's rank 0 does.
  const FileDescriptor held(::open((out / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  REQUIRE(held.valid());
  REQUIRE(::flock(held.get(), LOCK_EX | LOCK_NB) == 0);
  const std::string pid = std::to_string(::getpid());
  REQUIRE(::write(held.get(), pid.data(), pid.size()) == static_cast<ssize_t>(pid.size()));
  const CommandResult r = run(fmt::format("{} {} --heads 2 --steps 3 --out {}", kTrain, kFlags, out.string()), dir);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output == fmt::format("[rank 0] train: --out {}: another train run (pid {}) is using this directory; give "
                                "each run its own --out\n",
                                out.string(), pid));
  CHECK_FALSE(fs::exists(out / "metrics.jsonl"));
  // Once that run ends (its lock dropped), the directory is free again.
  ::flock(held.get(), LOCK_UN);
  const CommandResult after = run(fmt::format("{} {} --heads 2 --steps 3 --out {}", kTrain, kFlags, out.string()), dir);
  INFO(after.output);
  CHECK(after.exit_code == 0);
}

TEST_CASE(
    "--resume refuses other model flags and a malformed extra in one line, trains nothing at --steps, and "
    "sets later checkpoints aside",
    "[train][checkpoint]") {
  const fs::path dir = testing::fresh_dir("guards_resume");
  const fs::path out = dir / "out";
  const CommandResult saved = run(fmt::format("{} {} --heads 2 --steps 10 --checkpoint-every 5 --keep-last 5 --out {}",
                                              kTrain, kFlags, out.string()),
                                  dir);
  INFO(saved.output);
  REQUIRE(saved.exit_code == 0);
  const fs::path step5 = out / "checkpoints" / "step_00000005";
  const fs::path step10 = out / "checkpoints" / "step_00000010";
  REQUIRE(fs::exists(step10 / ".metadata.json"));
  auto resume = [&](const fs::path& from, const std::string& flags) {
    return run(
        fmt::format("{} {} {} --resume {} --out {}", kTrain, kFlags, flags, from.string(), (dir / "other").string()),
        dir);
  };

  SECTION("other model flags: each named with both values") {
    const CommandResult r = resume(step5, "--heads 4 --causal false --steps 12");
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(fmt::format("[rank 0] train: --resume {}: the checkpoint was saved with --causal true (this "
                                    "run: false), --heads 2 (this run: 4); resume with its model flags, or start a "
                                    "new run from its weights with --init-from\n",
                                    step5.string())) != std::string::npos);
  }
  SECTION("a malformed extra: the field and its legal range, before any tensor is read") {
    struct Case {
      std::function<void(nlohmann::json&)> edit;
      std::string message;
    };
    const std::vector<Case> cases = {
        {[](nlohmann::json& e) { e["window"] = -1; }, "extra.window is -1; legal: a whole number in [0, "},
        {[](nlohmann::json& e) { e["window"] = 1e30; }, "extra.window is 1e+30; legal: a whole number"},
        {[](nlohmann::json& e) { e["step"] = 5.5; }, "extra.step is 5.5; legal: a whole number"},
        {[](nlohmann::json& e) { e["optim"]["0"]["step"] = 6; },
         "extra.optim.0.step is 6; legal: a whole number in [1, 5]"},
        {[](nlohmann::json& e) { e["rng"].erase("draws"); }, "extra.rng.draws is missing"},
        {[](nlohmann::json& e) { e["optim"]["x"] = e["optim"]["0"]; },
         "extra.optim.x: the checkpoint has optimizer state for a parameter 'x'"},
        {[](nlohmann::json& e) { e["optim"]["0"]["dtypes"]["exp_avg"] = "Q8"; },
         "extra.optim.0.dtypes.exp_avg is \"Q8\"; legal: a safetensors dtype"},
        {[](nlohmann::json& e) { e = nlohmann::json::object(); }, "the checkpoint holds no training state"},
        {[](nlohmann::json& e) { e["optim"].erase("3"); },
         "the checkpoint holds 2 tensor(s) this run would not read: optim.3.exp_avg, optim.3.exp_avg_sq; "},
    };
    for (size_t i = 0; i < cases.size(); ++i) {
      const fs::path copy = dir / fmt::format("edited_{}", i);
      fs::copy(step5, copy);
      edit_extra(copy, cases[i].edit);
      const CommandResult r = resume(copy, "--heads 2 --steps 12");
      INFO(cases[i].message << "\n" << r.output);
      CHECK(r.exit_code == 1);
      CHECK(r.output.find(fmt::format("[rank 0] train: --resume {}: {}", copy.string(), cases[i].message)) !=
            std::string::npos);
      CHECK(r.output.find("loaded checkpoint") == std::string::npos);
    }
  }
  SECTION("a fresh run into the directory: refused, its checkpoints would lose to the earlier run's") {
    const CommandResult r =
        run(fmt::format("{} {} --heads 2 --steps 4 --checkpoint-every 2 --out {}", kTrain, kFlags, out.string()), dir);
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(fmt::format("--out: {} holds an earlier run's checkpoints (2 of them, step_00000005 to "
                                    "step_00000010); continue that run with --resume latest",
                                    (out / "checkpoints").string())) != std::string::npos);
    CHECK(fs::exists(step5));
    CHECK(fs::exists(step10));
  }
  SECTION("a checkpoint at --steps: nothing to train, said in a line; past --steps: refused; nothing set aside") {
    const CommandResult r = resume(step10, "--heads 2 --steps 10");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find(fmt::format("train: {} is at step 10, --steps: nothing to train", step10.string())) !=
          std::string::npos);
    const CommandResult past = run(
        fmt::format("{} {} --heads 2 --steps 5 --resume {} --out {}", kTrain, kFlags, step10.string(), out.string()),
        dir);
    INFO(past.output);
    CHECK(past.exit_code == 1);
    CHECK(past.output.find(fmt::format("--steps 5: {} is at step 10, past the run's end; give --steps 10 or more",
                                       step10.string())) != std::string::npos);
    const CommandResult at5 =
        run(fmt::format("{} {} --heads 2 --steps 5 --resume {} --out {}", kTrain, kFlags, step5.string(), out.string()),
            dir);
    INFO(at5.output);
    CHECK(at5.exit_code == 0);
    CHECK(fs::exists(step10));  // a resume that trains nothing moves nothing
  }
  SECTION("resuming an earlier step in its own directory sets the later ones aside, and latest follows the run") {
    const CommandResult r = run(fmt::format("{} {} --heads 2 --steps 7 --checkpoint-every 5 --keep-last 5 --resume {} "
                                            "--out {}",
                                            kTrain, kFlags, step5.string(), out.string()),
                                dir);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("set aside step_00000010") != std::string::npos);
    CHECK_FALSE(fs::exists(step10));
    CHECK(fs::exists(out / "checkpoints" / "step_00000010.abandoned-at-5" / ".metadata.json"));
    CHECK(fs::exists(out / "checkpoints" / "step_00000007" / ".metadata.json"));
    const CommandResult latest = run(
        fmt::format("{} {} --heads 2 --steps 8 --keep-last 5 --resume latest --out {}", kTrain, kFlags, out.string()),
        dir);
    INFO(latest.output);
    CHECK(latest.exit_code == 0);
    CHECK(latest.output.find("step_00000007: step 7") != std::string::npos);
    // Rolled back to step 5 again, past a new step 10: that one is set aside under another name.
    const CommandResult again = run(fmt::format("{} {} --heads 2 --steps 10 --checkpoint-every 5 --keep-last 5 "
                                                "--resume latest --out {}",
                                                kTrain, kFlags, out.string()),
                                    dir);
    INFO(again.output);
    REQUIRE(again.exit_code == 0);
    REQUIRE(fs::exists(step10));
    const CommandResult second =
        run(fmt::format("{} {} --heads 2 --steps 6 --resume {} --out {}", kTrain, kFlags, step5.string(), out.string()),
            dir);
    INFO(second.output);
    CHECK(second.exit_code == 0);
    CHECK(fs::exists(out / "checkpoints" / "step_00000010.abandoned-at-5-2" / ".metadata.json"));
    CHECK_FALSE(fs::exists(step10));
  }
}

TEST_CASE("a signal before the set-up is done ends train at once", "[train]") {
  const fs::path dir = testing::fresh_dir("guards_signal");
  const fs::path out = dir / "out";
  // The data is a FIFO nobody writes: train blocks opening it, after its "loading data" line,
  // until the signal. (Before, it waited on in the open: the shell's timeout killed it.)
  const fs::path fifo = dir / "data.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string command = fmt::format(
      "timeout -s KILL 60 {} --dim 16 --layers 1 --heads 2 --seq-len 16 --batch-size 4 --eval-every 0 --threads 1 "
      "--steps 2 --data {} --out {} > {} 2>&1 & pid=$!; "
      "for i in $(seq 600); do grep -q 'loading data' {} && break; sleep 0.05; done; kill -TERM $pid; wait $pid",
      kTrain, fifo.string(), out.string(), (dir / "train.txt").string(), (dir / "train.txt").string());
  const CommandResult r = run(command, dir);
  const std::string output = testing::read_file(dir / "train.txt");
  INFO(output);
  CHECK(r.exit_code == 143);
  CHECK(output.find("loading data") != std::string::npos);
  CHECK(output.find("stopped after step") == std::string::npos);
  CHECK_FALSE(fs::exists(out / "summary.json"));
}

}  // namespace
}  // namespace dtr
