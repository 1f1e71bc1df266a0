// checkpoint_bench: checkpoint::save and load against plain file I/O of the same bytes, and
// what async_save takes away from a loop of compute steps, at 1 and 2 ranks on one host.
//
//   bazel run //tools/bench:checkpoint_bench -- --ranks 1,2 --mib 256 --dir /tmp
//
// The state is --mib MiB of float32 in 4 tensors [rows, 1024], Shard(0), so each rank
// holds mib/N. Per repeat, interleaved (alternating which goes first): save vs a sequential write + fsync of the same
// bytes per rank (one file per rank); load vs a sequential read of them, both after
// posix_fadvise(DONTNEED) of the files (fsync'ed, so their pages leave the cache and the
// reads go to the disk); times are the max over ranks, medians over repeats, GB/s per rank.
// "rd new" reads into freshly allocated memory, as load must (its locals are new tensors),
// so it pays the first touch of every page. The first load is checked against the saved values before anything is
// timed. Async: steps/s of a [256, 256] matmul loop alone, then while an async_save writes in the background for a
// window of 1.5x the measured save time (at least 0.5 s), and the blocking time of the async_save call (staging copies)
// and of its wait(). Starts its own ranks (launch_self) once per --ranks entry; rank 0 of each writes its rows to a
// file the parent prints.
#include <fcntl.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/error.h"
#include "core/temp_path.h"
#include "core/tensor.h"
#include "dtensor/device_mesh.h"
#include "dtensor/dtensor.h"
#include "dtensor/dtensor_spec.h"
#include "kernels/fill.h"
#include "kernels/matmul.h"
#include "tools/bench/bench_util.h"
#include "tools/command_line.h"
#include "tools/launcher/self_launch.h"
#include "tools/tool_main.h"

namespace dtr::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr int64_t kColumns = 1024;
constexpr int kTensors = 4;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The max of `seconds` over the ranks of `group`.
double max_over_ranks(ProcessGroup& group, double seconds) {
  Tensor t = Tensor::from_vector(std::vector<double>{seconds});
  group.all_reduce(t, ReduceOp::kMax).wait();
  return t.data_ptr<double>()[0];
}

// Runs fn on every rank between barriers; the max over ranks of its time.
template <class F>
double timed(ProcessGroup& group, F&& fn) {
  group.barrier().wait();
  const auto start = Clock::now();
  fn();
  return max_over_ranks(group, seconds_since(start));
}

void check_os(bool ok, const std::string& what) {
  if (!ok) throw OSError(errno, fmt::format("checkpoint_bench: {}", what));
}

// Sequential write of `data` to a new `path` in 8 MiB writes, then fsync.
void write_reference(const std::string& path, const Tensor& data) {
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  check_os(fd >= 0, "open " + path);
  const char* p = static_cast<const char*>(data.data());
  for (size_t done = 0, n = data.nbytes(); done < n;) {
    const ssize_t w = ::write(fd, p + done, std::min<size_t>(n - done, 8 << 20));
    check_os(w > 0, "write " + path);
    done += static_cast<size_t>(w);
  }
  check_os(::fsync(fd) == 0, "fsync " + path);
  ::close(fd);
}

void read_reference(const std::string& path, Tensor& into) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  check_os(fd >= 0, "open " + path);
  char* p = static_cast<char*>(into.data());
  for (size_t done = 0, n = into.nbytes(); done < n;) {
    const ssize_t r = ::read(fd, p + done, std::min<size_t>(n - done, 8 << 20));
    check_os(r > 0, "read " + path);
    done += static_cast<size_t>(r);
  }
  ::close(fd);
}

// Drops the (fsync'ed, clean) cached pages of `path`, or of every file under it.
void drop_cache(const fs::path& path) {
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path)) files.push_back(e.path());
  } else {
    files.push_back(path);
  }
  for (const fs::path& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Values that differ per element and per tensor (exact in float32).
Tensor pattern(const Shape& shape, int64_t first_row, int tensor) {
  Tensor t = Tensor::empty(shape, kFloat32);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>((first_row * kColumns + i + tensor) % 65521);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

int run_rank(int64_t mib, const std::string& base, int repeats, const std::string& result_path) {
  set_default_timeout(std::chrono::seconds(300));
  init_process_group(Backend::kGloo);
  ProcessGroup& group = *default_group();
  const int n = group.size(), rank = group.rank();
  const DeviceMesh mesh = init_device_mesh(kCPU, {n});
  const int64_t rows = (mib << 20) / kTensors / (kColumns * 4);
  DTR_CHECK(rows % n == 0, ValueError, "checkpoint_bench: --mib {} does not split into whole rows over {} ranks", mib,
            n);
  checkpoint::State state, targets;
  int64_t bytes = 0;  // per rank
  for (int i = 0; i < kTensors; ++i) {
    DTensorSpec spec(mesh, {Shard(0)}, {rows, kColumns}, kFloat32);
    const LocalChunk chunk = spec.local_chunk();
    state.tensors[fmt::format("layers.{}.w", i)] = DTensor(pattern(chunk.shape, chunk.offset[0], i), spec);
    targets.tensors[fmt::format("layers.{}.w", i)] = DTensor(zeros(chunk.shape), spec);
    bytes += shape_numel(chunk.shape) * 4;
  }
  const fs::path dir = fs::path(base) / "ckpt";
  const std::string ref = (fs::path(base) / fmt::format("reference_{}", rank)).string();
  Tensor ref_data = pattern({bytes / 4}, rank, 0), ref_read = Tensor::empty({bytes / 4}, kFloat32);

  // Checked before timed.
  checkpoint::save(state, dir.string());
  checkpoint::load(targets, dir.string());
  int wrong = 0;
  for (const auto& [name, t] : state.tensors)
    wrong += same_bits(t.to_local(), targets.tensors.at(name).to_local()) ? 0 : 1;
  wrong = static_cast<int>(max_over_ranks(group, wrong));

  std::vector<double> save_s, write_s, load_s, read_s, read_new_s;
  // Alternating which of each pair goes first, so that neither always follows the other's
  // disk traffic (time_pair's order).
  auto save_once = [&] { save_s.push_back(timed(group, [&] { checkpoint::save(state, dir.string()); })); };
  auto write_once = [&] { write_s.push_back(timed(group, [&] { write_reference(ref, ref_data); })); };
  auto load_once = [&] {
    drop_cache(dir);
    load_s.push_back(timed(group, [&] { checkpoint::load(targets, dir.string()); }));
  };
  auto read_once = [&] {
    drop_cache(ref);
    read_s.push_back(timed(group, [&] { read_reference(ref, ref_read); }));
    drop_cache(ref);
    read_new_s.push_back(timed(group, [&] {
      Tensor fresh = Tensor::empty({bytes / 4}, kFloat32);  // as load's new locals: first touch in read()
      read_reference(ref, fresh);
    }));
  };
  for (int r = 0; r < repeats; ++r) {
    if (r % 2 == 0) {
      save_once();
      write_once();
      load_once();
      read_once();
    } else {
      write_once();
      save_once();
      read_once();
      load_once();
    }
  }

  // Compute steps alone, then with an async_save writing in the background.
  const Tensor a = full({256, 256}, 0.5), b = full({256, 256}, 0.25);
  auto steps_for = [&](double seconds) {
    int64_t steps = 0;
    const auto start = Clock::now();
    while (seconds_since(start) < seconds) {
      Tensor c = matmul(a, b);
      ++steps;
    }
    return steps / seconds_since(start);
  };
  const double window = std::max(1.5 * median(save_s), 0.5);
  steps_for(0.2);  // warm-up
  std::vector<double> alone, overlapped, call_ms, wait_ms;
  for (int r = 0; r < repeats; ++r) {
    group.barrier().wait();
    alone.push_back(steps_for(window));
    group.barrier().wait();
    auto start = Clock::now();
    checkpoint::AsyncSave pending = checkpoint::async_save(state, dir.string());
    call_ms.push_back(1e3 * max_over_ranks(group, seconds_since(start)));
    overlapped.push_back(steps_for(window));
    start = Clock::now();
    pending.wait();
    wait_ms.push_back(1e3 * max_over_ranks(group, seconds_since(start)));
  }
  checkpoint::load(targets, dir.string());  // the async save is the state too
  for (const auto& [name, t] : state.tensors)
    wrong += same_bits(t.to_local(), targets.tensors.at(name).to_local()) ? 0 : 1;
  wrong = static_cast<int>(max_over_ranks(group, wrong));
  // Steps/s summed over ranks, medians over repeats.
  const double steps_alone = median(alone) * n, steps_overlapped = median(overlapped) * n;

  if (rank == 0) {
    const double gb = static_cast<double>(bytes) / 1e9;
    const Json row = {{"ranks", n},
                      {"mib_per_rank", static_cast<double>(bytes) / (1 << 20)},
                      {"save", gb / median(save_s)},
                      {"write", gb / median(write_s)},
                      {"load", gb / median(load_s)},
                      {"read", gb / median(read_s)},
                      {"read_new", gb / median(read_new_s)},
                      {"save_spread", fmt::format("{:.2f}-{:.2f}", gb / *std::max_element(save_s.begin(), save_s.end()),
                                                  gb / *std::min_element(save_s.begin(), save_s.end()))},
                      {"load_spread", fmt::format("{:.2f}-{:.2f}", gb / *std::max_element(load_s.begin(), load_s.end()),
                                                  gb / *std::min_element(load_s.begin(), load_s.end()))},
                      {"read_spread", fmt::format("{:.2f}-{:.2f}", gb / *std::max_element(read_s.begin(), read_s.end()),
                                                  gb / *std::min_element(read_s.begin(), read_s.end()))},
                      {"call_ms", median(call_ms)},
                      {"wait_ms", median(wait_ms)},
                      {"window_ms", 1e3 * window},
                      {"steps_alone", steps_alone},
                      {"steps_overlapped", steps_overlapped},
                      {"wrong", wrong}};
    std::ofstream(result_path) << row.dump();
  }
  std::error_code ec;
  fs::remove(ref, ec);
  destroy_process_group();
  return wrong == 0 ? 0 : 1;
}

void print_table(const std::vector<Json>& rows, int64_t mib, int repeats, const std::string& base) {
  fmt::print(
      "checkpoint save/load vs plain file I/O of the same bytes: {} MiB float32 in {} tensors [rows, {}], Shard(0), "
      "under {}; GB/s per rank (median of {} repeats, max time over ranks); steps/s summed over ranks\n",
      mib, kTensors, kColumns, base, repeats);
  fmt::print(
      "{:>5} | {:>8} | {:>9} | {:>11} | {:>12} | {:>10} | {:>9} | {:>11} | {:>9} | {:>11} | {:>7} | {:>11} | {:>9} | "
      "{:>11} | {:>12} | {:>5} | {}\n",
      "ranks", "MiB/rank", "save GB/s", "save spread", "write+fsync", "save/write", "load GB/s", "load spread",
      "read GB/s", "read spread", "load/rd", "rd new GB/s", "async ms", "steps/s", "steps/s+save", "ratio", "check");
  for (const Json& r : rows) {
    fmt::print(
        "{:>5} | {:>8.1f} | {:>9.2f} | {:>11} | {:>12.2f} | {:>10.2f} | {:>9.2f} | {:>11} | {:>9.2f} | {:>11} | "
        "{:>7.2f} | "
        "{:>11.2f} | {:>9.1f} | {:>11.1f} | {:>12.1f} | {:>5.2f} | {}\n",
        r["ranks"].get<int>(), r["mib_per_rank"].get<double>(), r["save"].get<double>(),
        r["save_spread"].get<std::string>(), r["write"].get<double>(),
        r["save"].get<double>() / r["write"].get<double>(), r["load"].get<double>(),
        r["load_spread"].get<std::string>(), r["read"].get<double>(), r["read_spread"].get<std::string>(),
        r["load"].get<double>() / r["read"].get<double>(), r["read_new"].get<double>(), r["call_ms"].get<double>(),
        r["steps_alone"].get<double>(), r["steps_overlapped"].get<double>(),
        r["steps_overlapped"].get<double>() / r["steps_alone"].get<double>(),
        r["wrong"].get<int>() == 0 ? "ok" : "WRONG");
  }
  for (const Json& r : rows) {
    fmt::print("{} ranks: async_save call {:.1f} ms (staging), wait {:.1f} ms after a {:.0f} ms compute window\n",
               r["ranks"].get<int>(), r["call_ms"].get<double>(), r["wait_ms"].get<double>(),
               r["window_ms"].get<double>());
  }
}

}  // namespace
}  // namespace dtr::bench

int main(int argc, char** argv) {
  CLI::App app{"checkpoint save/load vs plain file I/O, and async_save's cost to a compute loop."};
  std::vector<int> ranks = {1, 2};
  int64_t mib = 256;
  int repeats = 7;
  std::string dir = "/tmp", base, result;
  app.add_option("--ranks", ranks, "world sizes to run, each with its own ranks")->delimiter(',');
  app.add_option("--mib", mib, "state size in MiB (float32, 4 tensors)")->check(CLI::Range(1, 1 << 16));
  app.add_option("--repeats", repeats, "timed repeats")->check(CLI::Range(1, 100));
  app.add_option("--dir", dir, "where the checkpoint and reference files go (a fresh folder under it)");
  app.add_option("--base", base, "(internal) the folder of one launch");
  app.add_option("--result", result, "(internal) where rank 0 writes its row");
  if (const std::optional<int> exit_code = dtr::parse_command_line("checkpoint_bench", app, argc, argv))
    return *exit_code;
  return dtr::tool_main("checkpoint_bench", [&] {
    if (dtr::launcher::is_rank_process()) return dtr::bench::run_rank(mib, base, repeats, result);
    std::vector<nlohmann::json> rows;
    int code = 0;
    for (int n : ranks) {
      // A fresh directory per rank count, removed with what the ranks wrote however this ends.
      const dtr::TempPath base_dir = dtr::TempPath::make_directory(dir, "dtr_checkpoint_bench", "checkpoint_bench");
      const std::string base = base_dir.string();
      const std::string row_file = base + "/row.json";
      std::vector<std::string> args(argv, argv + argc);
      args.insert(args.end(), {"--base", base, "--result", row_file});
      std::vector<char*> child;
      for (std::string& a : args) child.push_back(a.data());
      const dtr::launcher::SelfLaunchResult r = dtr::launcher::launch_self(n, child);
      if (r.exit_code != 0) {
        std::cerr << "checkpoint_bench: " << r.failure << "\n";
        code = r.exit_code;
      } else {
        std::ifstream in(row_file);
        rows.push_back(nlohmann::json::parse(in));
      }
    }
    dtr::bench::print_table(rows, mib, repeats, dir);
    return code;
  });
}
