// checkpoint_tool end to end, the real binary from runfiles: a checkpoint saved by 2 ranks
// (Shard(0) uneven, Shard(1) bf16, Replicate int64, 3-D float16, 0-d, bool) lists every
// tensor and chunk; to-full gives the full tensors bit for bit; to-sharded at 3 ranks, then
// to-full again, and a load at 2 ranks give the same tensors; an existing OUT or checkpoint
// is replaced only with --force, and never an output inside the checkpoint read or (export
// --hf) a directory that is not an earlier export; list prints a missing mesh as ?; bad input
// (overlapping chunks among them) exits non-zero with one line on stderr.
#include <fmt/format.h>

#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/full_state_dict.h"
#include "checkpoint/full_state_dict_file.h"
#include "checkpoint/load.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/save.h"
#include "collectives/init.h"
#include "dtensor/dtensor.h"
#include "dtensor/dtensor_spec.h"
#include "kernels/fill.h"
#include "nn/fully_shard.h"
#include "nn/init.h"
#include "nn/transformer.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kTool = "tools/checkpoint_tool/checkpoint_tool";  // runfiles path

struct Case {
  std::string name;
  Shape shape;
  DType dtype;
  Placement placement;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {
      {"layers.0.w", {7, 5}, kFloat32, Shard(0)}, {"layers.0.v", {5, 7}, kBFloat16, Shard(1)},
      {"ids", {6, 3}, kInt64, Replicate()},       {"cube", {4, 6, 3}, kFloat16, Shard(1)},
      {"step", {}, kInt64, Replicate()},          {"mask", {5, 3}, kBool, Shard(0)},
  };
  return kCases;
}

Tensor full_value(const Case& c) {
  const uint64_t seed = static_cast<uint64_t>(&c - cases().data()) + 7;
  if (c.dtype == kBool) return testing::random_tensor(c.shape, kBool, seed, 0.0, 2.0);
  return testing::random_tensor(c.shape, c.dtype, seed, is_floating(c.dtype) ? -1.0 : -1e12,
                                is_floating(c.dtype) ? 1.0 : 1e12);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Run {
  int exit_code;
  std::string out, err;
};

// Runs the tool with `args` (already shell-quoted), capturing its output.
Run run_tool(const fs::path& scratch, const std::string& args) {
  const fs::path out = scratch / "stdout", err = scratch / "stderr";
  const int status = std::system(fmt::format("{} {} >{} 2>{}", kTool, args, out.string(), err.string()).c_str());
  REQUIRE(status != -1);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), read_text(out), read_text(err)};
}

void check_full_file(const fs::path& path) {
  const TensorMap tensors = safetensors::load_file(path.string());
  CHECK(tensors.size() == cases().size());
  for (const Case& c : cases()) {
    INFO("tensor " << c.name << " of " << path);
    REQUIRE(tensors.contains(c.name));
    CHECK(same_bits(tensors.at(c.name), full_value(c)));
  }
}

// The cases saved by 2 ranks into `dir`.
void save_cases(const fs::path& dir) {
  testing::run_ranks(2, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    checkpoint::State s;
    for (const Case& c : cases()) {
      DTensorSpec spec(mesh, {c.placement}, c.shape, c.dtype);
      s.tensors[c.name] = DTensor(chunk_of(full_value(c), spec.local_chunk()).contiguous(), spec);
    }
    checkpoint::save(s, dir.string());
  });
}

TEST_CASE("checkpoint_tool lists, assembles and re-shards a checkpoint", "[checkpoint_tool]") {
  const fs::path root = testing::make_temp_dir("checkpoint_tool");
  const fs::path dir = root / "ckpt", full = root / "full.safetensors", resharded = root / "resharded";
  save_cases(dir);

  const Run listed = run_tool(root, "list " + dir.string());
  INFO(listed.out << listed.err);
  REQUIRE(listed.exit_code == 0);
  CHECK_THAT(listed.out, Catch::Contains("saved by 2 ranks, 6 tensors"));
  for (const Case& c : cases()) {
    CHECK_THAT(listed.out, Catch::Contains(fmt::format("{}: {} ", c.name, dtype_name(c.dtype))));
    CHECK_THAT(listed.out, Catch::Contains(fmt::format("placements [{}]", c.placement.str())));
  }
  CHECK_THAT(listed.out, Catch::Contains("offset [4, 0] shape [3, 5] file __1_0.safetensors"));  // layers.0.w

  REQUIRE(run_tool(root, fmt::format("to-full {} {}", dir.string(), full.string())).exit_code == 0);
  check_full_file(full);

  const Run sharded = run_tool(root, fmt::format("to-sharded {} {} --ranks 3", full.string(), resharded.string()));
  INFO(sharded.out << sharded.err);
  REQUIRE(sharded.exit_code == 0);
  std::ifstream meta_in(resharded / ".metadata.json");
  const Json meta = Json::parse(meta_in);
  CHECK(meta["world_size"] == 3);
  CHECK(meta["tensors"]["layers.0.v"]["placements"] == Json::array({"S(0)"}));
  CHECK(meta["tensors"]["step"]["placements"] == Json::array({"R"}));

  const fs::path full_again = root / "full_again.safetensors";
  REQUIRE(run_tool(root, fmt::format("to-full {} {}", resharded.string(), full_again.string())).exit_code == 0);
  check_full_file(full_again);

  testing::run_ranks(2, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    checkpoint::State s;
    for (const Case& c : cases()) {
      DTensorSpec spec(mesh, {c.shape.empty() ? Placement(Replicate()) : Placement(Shard(0))}, c.shape, c.dtype);
      s.tensors[c.name] = DTensor(zeros(spec.local_shape(), c.dtype), spec);
    }
    checkpoint::load(s, resharded.string());
    for (const Case& c : cases()) {
      INFO("tensor " << c.name);
      const DTensor& t = s.tensors.at(c.name);
      CHECK(same_bits(t.to_local(), chunk_of(full_value(c), t.spec().local_chunk())));
    }
  });
}

TEST_CASE("checkpoint_tool replaces an existing OUT or checkpoint only with --force", "[checkpoint_tool]") {
  const fs::path root = testing::make_temp_dir("checkpoint_tool_force");
  const fs::path dir = root / "ckpt", full = root / "full.safetensors";
  save_cases(dir);
  std::ofstream(full) << "precious";
  const std::string metadata = read_text(dir / ".metadata.json");

  const Run to_full = run_tool(root, fmt::format("to-full {} {}", dir.string(), full.string()));
  INFO(to_full.err);
  CHECK(to_full.exit_code == 1);
  CHECK(to_full.err ==
        fmt::format("checkpoint_tool: to-full: OUT '{}' already exists; pass --force to replace it\n", full.string()));
  CHECK(read_text(full) == "precious");

  REQUIRE(run_tool(root, fmt::format("to-full {} {} --force", dir.string(), full.string())).exit_code == 0);
  check_full_file(full);
  const Run over_checkpoint = run_tool(root, fmt::format("to-sharded {} {} --ranks 3", full.string(), dir.string()));
  INFO(over_checkpoint.err);
  CHECK(over_checkpoint.exit_code == 1);
  CHECK_THAT(
      over_checkpoint.err,
      Catch::Contains(fmt::format("to-sharded: DIR '{}' already exists and is not empty; pass --force", dir.string())));
  CHECK(read_text(dir / ".metadata.json") == metadata);

  REQUIRE(run_tool(root, fmt::format("to-sharded {} {} --ranks 3 --force", full.string(), dir.string())).exit_code ==
          0);
  CHECK(Json::parse(read_text(dir / ".metadata.json"))["world_size"] == 3);
  const fs::path empty = root / "empty";
  fs::create_directories(empty);
  CHECK(run_tool(root, fmt::format("to-sharded {} {} --ranks 2", full.string(), empty.string())).exit_code == 0);
  // An input inside the directory --force would replace: refused, the input kept.
  const fs::path inside = empty / "in.safetensors";
  fs::copy_file(full, inside);
  const Run over_input =
      run_tool(root, fmt::format("to-sharded {} {} --ranks 2 --force", inside.string(), empty.string()));
  INFO(over_input.err);
  CHECK(over_input.exit_code == 1);
  CHECK_THAT(over_input.err,
             Catch::Contains(fmt::format("to-sharded: IN '{}' is inside DIR '{}'", inside.string(), empty.string())));
  CHECK(fs::exists(inside));
}

// The causal LM train --arch gpt builds (the output tied to the embedding), small.
std::unique_ptr<nn::Transformer> gpt(uint64_t seed) {
  nn::manual_seed(seed);
  return std::make_unique<nn::Transformer>(testing::small_causal_lm(32, 8));
}

// gpt(3) saved by 2 ranks into `dir` as train's Checkpointer saves it: model.<parameter> (a
// tied one once) and optimizer state.
void save_train_checkpoint(const fs::path& dir) {
  testing::run_ranks(2, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n}, {"dp"});
    std::unique_ptr<nn::Transformer> model = gpt(3);
    nn::fully_shard(*model, mesh);
    checkpoint::State s;
    for (auto& [name, p] : model->named_parameters()) s.tensors.emplace("model." + name, *p);
    s.tensors.emplace("optim.0.exp_avg", *model->named_parameters().front().second);
    checkpoint::save(s, dir.string());
  });
}

TEST_CASE("export writes a train checkpoint's model under PyTorch's names, loadable strictly", "[checkpoint_tool]") {
  const fs::path root = testing::make_temp_dir("checkpoint_tool_export");
  const fs::path ckpt = root / "step_00000010";
  save_train_checkpoint(ckpt);
  const TensorMap expected = checkpoint::full_state_dict(*gpt(3));
  REQUIRE(expected.contains("output.weight"));

  const fs::path file = root / "model.safetensors";
  const Run exported = run_tool(root, fmt::format("export {} {}", ckpt.string(), file.string()));
  INFO(exported.out << exported.err);
  REQUIRE(exported.exit_code == 0);
  const TensorMap written = safetensors::load_file(file.string());
  CHECK(written.size() == expected.size());
  for (const auto& [name, t] : expected) {
    INFO(name);
    REQUIRE(written.contains(name));
    CHECK(same_bits(written.at(name), t));
  }
  // What train --init-from does, strictly (a missing or extra name throws).
  std::unique_ptr<nn::Transformer> fresh = gpt(4);
  checkpoint::load_full_state_dict_file(*fresh, file.string());
  CHECK(
      same_bits(checkpoint::full_state_dict(*fresh).at("layers.1.ffn.2.weight"), expected.at("layers.1.ffn.2.weight")));

  // Hugging Face's layout: small shards, an index naming every tensor's file.
  const fs::path hf = root / "hf";
  REQUIRE(
      run_tool(root, fmt::format("export {} --hf {} --max-shard-size 4000", ckpt.string(), hf.string())).exit_code ==
      0);
  const Json index = Json::parse(read_text(hf / "model.safetensors.index.json"));
  CHECK(index.at("weight_map").size() == expected.size());
  std::set<std::string> files;
  for (const auto& [name, f] : index.at("weight_map").items()) files.insert(f.get<std::string>());
  CHECK(files.size() > 1);
  std::unique_ptr<nn::Transformer> from_hf = gpt(5);
  checkpoint::load_hf_checkpoint(*from_hf, hf.string());
  for (const auto& [name, t] : checkpoint::full_state_dict(*from_hf)) {
    INFO(name);
    CHECK(same_bits(t, expected.at(name)));
  }
  // Neither replaces what is there without --force; a checkpoint not from train is refused.
  CHECK(run_tool(root, fmt::format("export {} {}", ckpt.string(), file.string())).exit_code == 1);
  CHECK(run_tool(root, fmt::format("export {} --hf {}", ckpt.string(), hf.string())).exit_code == 1);
  const fs::path plain = root / "plain";
  save_cases(plain);
  const Run not_train = run_tool(root, fmt::format("export {} {}", plain.string(), (root / "x.safetensors").string()));
  CHECK(not_train.exit_code == 1);
  CHECK_THAT(not_train.err, Catch::Contains("holds no model.* tensors"));
}

// Checks that `r` failed with exactly one line on stderr holding `what`.
void check_refused(const Run& r, const std::string& what) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.exit_code == 1);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_THAT(r.err, Catch::StartsWith("checkpoint_tool: ") && Catch::Contains(what));
}

TEST_CASE("to-full refuses saved chunks that overlap, even where every file's header agrees", "[checkpoint_tool]") {
  const fs::path root = testing::make_temp_dir("checkpoint_tool_overlap");
  const fs::path dir = root / "ckpt", out = root / "full.safetensors";
  save_cases(dir);
  // layers.0.w [7, 5]: rank 1's chunk [3, 5] moved from offset [4, 0] to [0, 0], in the
  // metadata and in its file's DCP_SHARDING_INFO alike. Rows 0-2 are then held twice and rows
  // 4-6 never, with the element count still 35.
  Json meta = Json::parse(read_text(dir / ".metadata.json"));
  Json& chunk = meta["tensors"]["layers.0.w"]["chunks"][1];
  REQUIRE(chunk["offset"] == Json::array({4, 0}));
  chunk["offset"] = {0, 0};
  std::ofstream(dir / ".metadata.json", std::ios::trunc) << meta.dump();
  std::string file = read_text(dir / "__1_0.safetensors");
  const std::string saved = R"(\"layers.0.w\":{\"saved_offsets\":[4,0]})";
  const size_t at = file.find(saved);
  REQUIRE(at != std::string::npos);
  file.replace(at, saved.size(), R"(\"layers.0.w\":{\"saved_offsets\":[0,0]})");
  std::ofstream(dir / "__1_0.safetensors", std::ios::binary | std::ios::trunc) << file;

  check_refused(run_tool(root, fmt::format("to-full {} {}", dir.string(), out.string())),
                "tensor 'layers.0.w': saved chunks overlap at offset [0, 0] (corrupt metadata)");
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("list prints a tensor's informational mesh and placements as ? where missing or of another type",
          "[checkpoint_tool]") {
  const fs::path root = testing::make_temp_dir("checkpoint_tool_list_mesh");
  const fs::path dir = root / "ckpt";
  save_cases(dir);
  Json meta = Json::parse(read_text(dir / ".metadata.json"));
  meta["tensors"]["ids"].erase("mesh");
  meta["tensors"]["ids"].erase("placements");
  meta["tensors"]["mask"]["mesh"] = "x";
  meta["tensors"]["mask"]["placements"] = 7;
  std::ofstream(dir / ".metadata.json", std::ios::trunc) << meta.dump();

  const Run listed = run_tool(root, "list " + dir.string());
  INFO(listed.out << listed.err);
  CHECK(listed.exit_code == 0);
  CHECK(listed.err.empty());
  CHECK_THAT(listed.out, Catch::Contains("ids: int64 [6, 3] bytes 144 mesh ? placements ? chunks 1\n"));
  CHECK_THAT(listed.out, Catch::Contains("mask: bool [5, 3] bytes 15 mesh ? placements ? chunks 2\n"));
  CHECK_THAT(listed.out, Catch::Contains("layers.0.w: float32 [7, 5] bytes 140 mesh cpu [2] ranks [0,1] placements "
                                         "[S(0)] chunks 2\n"));
}

TEST_CASE("to-full and export refuse outputs that would destroy their input or another directory, before any work",
          "[checkpoint_tool]") {
  const fs::path root = testing::make_temp_dir("checkpoint_tool_outputs");
  const fs::path ckpt = root / "run" / "checkpoints" / "step_00000010";
  save_train_checkpoint(ckpt);
  const std::string rank0 = read_text(ckpt / "__0_0.safetensors");
  std::ofstream(root / "run" / "metrics.jsonl") << "{}\n";

  // An output inside (or at) the checkpoint it reads, --force or not.
  for (const std::string& out : {(ckpt / "__0_0.safetensors").string(), ckpt.string(), ckpt.string() + "/"}) {
    check_refused(
        run_tool(root, fmt::format("to-full {} {} --force", ckpt.string(), out)),
        fmt::format("to-full: OUT '{}' is the checkpoint directory '{}' it reads or inside it", out, ckpt.string()));
  }
  check_refused(run_tool(root, fmt::format("export {} {}", ckpt.string(), (ckpt / "model.safetensors").string())),
                "export: OUT");
  check_refused(run_tool(root, fmt::format("export {} --hf {} --force", ckpt.string(), (ckpt / "hf").string())),
                "export: --hf");
  CHECK(read_text(ckpt / "__0_0.safetensors") == rank0);
  CHECK_FALSE(fs::exists(ckpt / "model.safetensors"));
  CHECK_FALSE(fs::exists(ckpt / "hf"));

  // --hf --force replaces an earlier export, never a directory holding anything else (here
  // the training run the checkpoint is in).
  const fs::path run = root / "run";
  check_refused(run_tool(root, fmt::format("export {} --hf {} --force", ckpt.string(), run.string())),
                fmt::format("export: --hf '{}' holds '", run.string()));
  CHECK(read_text(ckpt / "__0_0.safetensors") == rank0);
  CHECK(fs::exists(run / "metrics.jsonl"));
  const fs::path hf = root / "hf";
  REQUIRE(run_tool(root, fmt::format("export {} --hf {}", ckpt.string(), hf.string())).exit_code == 0);
  const Run again =
      run_tool(root, fmt::format("export {} --hf {} --force --max-shard-size 4000", ckpt.string(), hf.string()));
  INFO(again.err);
  CHECK(again.exit_code == 0);
  CHECK(Json::parse(read_text(hf / "model.safetensors.index.json")).at("weight_map").size() > 0);
  CHECK_FALSE(fs::exists(hf / "model-00001-of-00001.safetensors"));  // the earlier export's one file

  // A file output at an existing directory, refused before anything is assembled.
  const fs::path dir_out = root / "dir_out";
  fs::create_directories(dir_out);
  for (const char* force : {"", " --force"}) {
    check_refused(run_tool(root, fmt::format("to-full {} {}{}", ckpt.string(), dir_out.string(), force)),
                  fmt::format("to-full: OUT '{}' is a directory; give the path of the .safetensors file to write",
                              dir_out.string()));
  }
  CHECK_FALSE(fs::exists(dir_out.string() + ".tmp"));
  // --max-shard-size sizes --hf's files; one OUT file has none.
  const Run one_file = run_tool(
      root, fmt::format("export {} {} --max-shard-size 100", ckpt.string(), (root / "one.safetensors").string()));
  check_refused(one_file, "--max-shard-size requires --hf");
  CHECK_FALSE(fs::exists(root / "one.safetensors"));
}

TEST_CASE("checkpoint_tool exits non-zero with one line on bad input", "[checkpoint_tool]") {
  const fs::path root = testing::make_temp_dir("checkpoint_tool_bad");
  fs::create_directories(root / "empty");
  std::ofstream(root / "junk.safetensors") << "not a safetensors file";
  const std::vector<std::string> bad = {
      "list " + (root / "missing").string(),
      "list " + (root / "empty").string(),
      fmt::format("to-full {} {}", (root / "empty").string(), (root / "out.safetensors").string()),
      fmt::format("to-sharded {} {} --ranks 2", (root / "missing.safetensors").string(), (root / "c").string()),
      fmt::format("to-sharded {} {} --ranks 2", (root / "junk.safetensors").string(), (root / "c").string()),
      "bogus",
      "list " + (root / "empty").string() + " extra",
  };
  for (const std::string& args : bad) {
    const Run r = run_tool(root, args);
    INFO(args << "\nstderr: " << r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.starts_with("checkpoint_tool: "));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  CHECK_FALSE(fs::exists(root / "c"));
  CHECK(run_tool(root, "bogus").err ==
        "checkpoint_tool: unknown command 'bogus'; the commands are list, to-full, "
        "export, to-sharded\n");
}

}  // namespace
}  // namespace dtr
