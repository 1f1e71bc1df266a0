// collective_bench: dtr's collectives against the same operations through raw Gloo calls,
// in one run, as nccl-tests prints them (size, algbw, busbw).
//
// Per collective and size: one checked call, warm-up, then rounds of one batch of
// back-to-back calls per implementation, each batch after a barrier, the order within a
// round rotating. A call's time is its batch's over its calls, on the slowest rank; dtr/raw
// is the median over batch pairs of raw time over dtr time, which cancels load that comes
// and goes. Launches its own ranks with launch_self (dtrrun's worker group) unless RANK and
// WORLD_SIZE are set. --fit-cost-model FILE fits the alpha-beta CostModel to dtr's median
// times and writes it. Method, columns and the latest tables: docs/collective_bench.md.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <sys/socket.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/gloo_store.h"
#include "collectives/init.h"
#include "collectives/prefix_store.h"
#include "core/error.h"
#include "kernels/fill.h"
#include "tools/bench/bench_util.h"
#include "tools/command_line.h"
#include "tools/launcher/self_launch.h"
#include "tools/tool_main.h"

namespace dtr {
namespace {

using Clock = std::chrono::steady_clock;
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

struct Options {
  int ranks = 2;
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 64 << 20;
  int batches = 7;
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"};
  std::string cost_model_path;  // where --fit-cost-model writes the fitted model; empty: no fit
};

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
  std::vector<double> batches_us;  // per-call time of each batch, in batch order
};

// dtr/raw as the median over batches of raw's time over dtr's in the batch pair run back to
// back: both saw the same machine, so load that comes and goes cancels out of each ratio.
double paired_ratio(const Timing& dtr, const Timing& raw) {
  std::vector<double> ratios;
  for (size_t b = 0; b < dtr.batches_us.size(); ++b) ratios.push_back(raw.batches_us[b] / dtr.batches_us[b]);
  return bench::median(std::move(ratios));
}

// The CPU (/proc/cpuinfo's model name) and core count, and how the ranks talk.
std::string machine_description() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, cpu = "unknown CPU";
  while (std::getline(cpuinfo, line)) {
    if (line.starts_with("model name")) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return fmt::format("{}, {} cores; ranks are processes on one host, Gloo over loopback TCP", cpu,
                     std::thread::hardware_concurrency());
}

// Fits the CostModel to dtr's median times, prints alpha, beta and the model's error on the
// points per collective and group size, and writes it to path, keeping the fits of other
// group sizes a model already there holds (same machine and backend, or a ValueError).
void fit_cost_model(const std::vector<CostSample>& samples, const std::string& path) {
  CostModel model = CostModel::fit(samples, machine_description(), "gloo");
  if (std::filesystem::exists(path)) {
    const CostModel old = CostModel::load(path);
    DTR_CHECK(old.machine() == model.machine() && old.backend() == model.backend(), ValueError,
              "collective_bench --fit-cost-model: '{}' holds fits of another machine or backend ('{}', {}); this is "
              "'{}', {}: write to another file",
              path, old.machine(), old.backend(), model.machine(), model.backend());
    for (const auto& [key, fit] : old.fits()) {
      if (!model.fits().contains(key)) model.set(key.first, key.second, fit);
    }
  }
  fmt::print(
      "# cost model: seconds = alpha + bytes / beta, fitted per collective and group size to the median times above "
      "(least squares\n#   on the relative error); err: |model - median| / median over the sizes measured\n");
  fmt::print("# {:>14} {:>5} {:>10} {:>10} {:>7} {:>9} {:>9}\n", "collective", "ranks", "alpha(us)", "beta(GB/s)",
             "points", "err med", "err worst");
  for (const auto& [key, fit] : model.fits()) {
    std::vector<CostSample> points;
    std::copy_if(samples.begin(), samples.end(), std::back_inserter(points),
                 [&](const CostSample& s) { return s.kind == key.first && s.group_size == key.second; });
    if (points.empty()) continue;  // kept from the file
    const RelativeError error = model.relative_error(points);
    fmt::print("  {:>14} {:>5} {:>10.1f} {:>10.3f} {:>7} {:>8.1f}% {:>8.1f}%\n", collective_kind_name(key.first),
               key.second, fit.alpha_s * 1e6, fit.beta_bytes_per_s / 1e9, points.size(), error.median * 100,
               error.worst * 100);
  }
  const RelativeError all = model.relative_error(samples);
  fmt::print("# all {} points: err median {:.1f}%, worst {:.1f}%; written to {} ({} fits)\n", samples.size(),
             all.median * 100, all.worst * 100, path, model.fits().size());
  model.save(path);
}

// One rank of the benchmark: a dtr group and a raw Gloo context over the same store.
class Bench {
 public:
  Bench(std::shared_ptr<ProcessGroup> pg, const Options& options)
      : pg_(std::move(pg)), options_(options), rank_(pg_->rank()), n_(pg_->size()) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    attr.ai_family = AF_INET;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    raw_ = std::make_shared<gloo::rendezvous::Context>(rank_, n_);
    raw_->setTimeout(std::chrono::minutes(5));
    GlooStore store(std::make_shared<PrefixStore>("raw_gloo", pg_->store()));
    raw_->connectFullMesh(store, device_);
  }

  // Per-call times of each of fns, the slowest rank's, over batches of calls. The fns'
  // batches alternate, in an order that rotates round by round, so that a busy moment of
  // the machine, or going first after the barrier, favours none of them.
  std::vector<Timing> time(int64_t bytes, const std::vector<std::function<void()>>& fns) {
    const int calls = static_cast<int>(std::clamp<int64_t>((int64_t{32} << 20) / std::max<int64_t>(bytes, 1), 3, 200));
    for (const auto& fn : fns) {
      for (int i = 0; i < 2; ++i) fn();
    }
    std::vector<std::vector<double>> per_call(fns.size());
    for (int b = 0; b < options_.batches; ++b) {
      for (size_t turn = 0; turn < fns.size(); ++turn) {
        const size_t f = (turn + b) % fns.size();  // each fn leads in turn: no order bias in a pair
        pg_->barrier().wait();
        const auto start = Clock::now();
        for (int i = 0; i < calls; ++i) fns[f]();
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / calls;
        Tensor slowest = full({1}, us, kFloat64);
        pg_->all_reduce(slowest, ReduceOp::kMax).wait();
        per_call[f].push_back(slowest.item());
      }
    }
    std::vector<Timing> timings;
    for (const std::vector<double>& v : per_call) {
      timings.push_back(
          {bench::median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()), v});
    }
    return timings;
  }

  // Elements of t (float32) that differ from expected(i).
  static int64_t wrong(const Tensor& t, const std::function<float(int64_t)>& expected) {
    const float* p = t.data_ptr<float>();
    int64_t bad = 0;
    for (int64_t i = 0; i < t.numel(); ++i) bad += p[i] != expected(i);
    return bad;
  }

  // Fills rank r's tensor with (r + 1) * w(i), w in -3..3: every sum over ranks is exact.
  static float w(int64_t i) { return static_cast<float>(i % 7) - 3.0f; }
  Tensor filled(int64_t count) const {
    Tensor t = Tensor::empty({count}, kFloat32);
    float* p = t.data_ptr<float>();
    for (int64_t i = 0; i < count; ++i) p[i] = (rank_ + 1) * w(i);
    return t;
  }
  float sum_of_ranks() const { return n_ * (n_ + 1) / 2.0f; }

  void run_all_reduce(int64_t bytes) {
    const int64_t count = bytes / 4;
    Tensor x = filled(count);
    pg_->all_reduce(x).wait();
    const int64_t bad = wrong(x, [&](int64_t i) { return w(i) * sum_of_ranks(); });
    Tensor y = filled(count);
    auto raw_call = [&](gloo::AllreduceOptions::Algorithm algorithm) {
      return [&, algorithm] {
        gloo::AllreduceOptions o(raw_);
        o.setOutput(y.data_ptr<float>(), static_cast<size_t>(count));
        o.setAlgorithm(algorithm);
        o.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
        o.setTag(tag_++);
        gloo::allreduce(o);
      };
    };
    const std::vector<Timing> t =
        time(bytes, {[&] { pg_->all_reduce(x).wait(); }, raw_call(gloo::AllreduceOptions::Algorithm::RING),
                     raw_call(gloo::AllreduceOptions::Algorithm::BCUBE)});
    const Timing& dtr = t[0];
    const Timing& raw = t[1].median_us < t[2].median_us ? t[1] : t[2];
    print(CollectiveKind::kAllReduce, bytes, count, dtr, raw, bad);
  }

  void run_all_gather(int64_t bytes) {
    const int64_t count = bytes / 4, chunk = count / n_;
    Tensor in = filled(chunk), out = Tensor::empty({chunk * n_}, kFloat32);
    pg_->all_gather_into_tensor(out, in).wait();
    const int64_t bad = wrong(out, [&](int64_t i) { return (i / chunk + 1) * w(i % chunk); });
    const std::vector<Timing> t = time(bytes, {[&] { pg_->all_gather_into_tensor(out, in).wait(); },
                                               [&] {
                                                 gloo::AllgatherOptions o(raw_);
                                                 o.setInput(in.data_ptr<float>(), static_cast<size_t>(chunk));
                                                 o.setOutput(out.data_ptr<float>(), static_cast<size_t>(chunk * n_));
                                                 o.setTag(tag_++);
                                                 gloo::allgather(o);
                                               }});
    const Timing& dtr = t[0];
    const Timing& raw = t[1];
    print(CollectiveKind::kAllGather, chunk * n_ * 4, chunk * n_, dtr, raw, bad);
  }

  void run_reduce_scatter(int64_t bytes) {
    const int64_t count = bytes / 4, chunk = count / n_;
    Tensor in = filled(chunk * n_), out = Tensor::empty({chunk}, kFloat32);
    pg_->reduce_scatter_tensor(out, in).wait();
    const int64_t bad = wrong(out, [&](int64_t i) { return w(rank_ * chunk + i) * sum_of_ranks(); });
    // Gloo's own: collective to build, bound to one buffer, in place (result at its start).
    Tensor buf = filled(chunk * n_);
    gloo::ReduceScatterHalvingDoubling<float> rs(raw_, {buf.data_ptr<float>()}, static_cast<int>(chunk * n_),
                                                 std::vector<int>(n_, static_cast<int>(chunk)));
    const std::vector<Timing> t = time(bytes, {[&] { pg_->reduce_scatter_tensor(out, in).wait(); }, [&] { rs.run(); }});
    const Timing& dtr = t[0];
    const Timing& raw = t[1];
    print(CollectiveKind::kReduceScatter, chunk * n_ * 4, chunk * n_, dtr, raw, bad);
  }

  void run_broadcast(int64_t bytes) {
    const int64_t count = bytes / 4;
    Tensor x = rank_ == 0 ? filled(count) : full({count}, -9.0, kFloat32);
    pg_->broadcast(x, 0).wait();
    const int64_t bad = wrong(x, [&](int64_t i) { return w(i); });
    const std::vector<Timing> t = time(bytes, {[&] { pg_->broadcast(x, 0).wait(); },
                                               [&] {
                                                 gloo::BroadcastOptions o(raw_);
                                                 o.setRoot(0);
                                                 if (rank_ == 0)
                                                   o.setInput(x.data_ptr<float>(), static_cast<size_t>(count));
                                                 o.setOutput(x.data_ptr<float>(), static_cast<size_t>(count));
                                                 o.setTag(tag_++);
                                                 gloo::broadcast(o);
                                               }});
    const Timing& dtr = t[0];
    const Timing& raw = t[1];
    print(CollectiveKind::kBroadcast, bytes, count, dtr, raw, bad);
  }

  void run_all_to_all(int64_t bytes) {
    const int64_t count = bytes / 4, chunk = count / n_;
    Tensor in = filled(chunk * n_), out = Tensor::empty({chunk * n_}, kFloat32);
    pg_->all_to_all_single(out, in).wait();
    // Block s of the output is rank s's block for this rank.
    const int64_t bad = wrong(out, [&](int64_t i) { return (i / chunk + 1) * w(rank_ * chunk + i % chunk); });
    const std::vector<Timing> t = time(bytes, {[&] { pg_->all_to_all_single(out, in).wait(); },
                                               [&] {
                                                 gloo::AlltoallOptions o(raw_);
                                                 o.setInput(in.data_ptr<float>(), static_cast<size_t>(chunk * n_));
                                                 o.setOutput(out.data_ptr<float>(), static_cast<size_t>(chunk * n_));
                                                 o.setTag(tag_++);
                                                 gloo::alltoall(o);
                                               }});
    print(CollectiveKind::kAllToAll, chunk * n_ * 4, chunk * n_, t[0], t[1], bad);
  }

  void run() {
    if (rank_ == 0) {
      fmt::print(
          "# collective_bench: dtr vs raw Gloo, {} ranks, float32, {} batches per row; a call's time is the "
          "slowest rank's\n",
          n_, options_.batches);
      fmt::print(
          "# time: the median batch, with the range; algbw and busbw from it. best: the fastest batch. "
          "best/raw = raw best / dtr best\n#   (other processes only ever add time, so best batches compare "
          "the implementations); dtr/raw: the median over batch pairs (back to back, either first)\n#   of "
          "raw time / dtr time, so load that comes and goes cancels out of each ratio\n");
      fmt::print(
          "# {:>14} {:>9} {:>9} {:>5} {:>9} {:>18} {:>7} {:>7} {:>6} {:>9} {:>7} {:>9} {:>9} {:>7} {:>8} {:>7}\n",
          "collective", "size(B)", "count", "type", "time(us)", "range(us)", "algbw", "busbw", "#wrong", "best(us)",
          "busbw", "raw(us)", "raw best", "busbw", "best/raw", "dtr/raw");
    }
    for (const std::string& op : options_.ops) {
      for (int64_t bytes = options_.min_bytes; bytes <= options_.max_bytes; bytes *= 4) {
        if (op == "all_reduce") run_all_reduce(bytes);
        if (op == "all_gather") run_all_gather(bytes);
        if (op == "reduce_scatter") run_reduce_scatter(bytes);
        if (op == "broadcast") run_broadcast(bytes);
        if (op == "all_to_all") run_all_to_all(bytes);
      }
    }
    if (rank_ == 0 && wrong_total_ > 0) fmt::print("# {} wrong elements: FAILED\n", wrong_total_);
    if (rank_ == 0 && !options_.cost_model_path.empty()) fit_cost_model(samples_, options_.cost_model_path);
  }

  int64_t wrong_total() const { return wrong_total_; }

 private:
  void print(CollectiveKind kind, int64_t size, int64_t count, const Timing& dtr, const Timing& raw, int64_t bad) {
    Tensor t = full({1}, static_cast<double>(bad), kFloat64);
    pg_->all_reduce(t).wait();
    wrong_total_ += static_cast<int64_t>(t.item());  // every rank's, summed: the same on all ranks
    if (rank_ != 0) return;
    samples_.push_back({kind, n_, size, dtr.median_us * 1e-6});
    const double f = bus_factor(kind, n_);
    auto gbps = [&](double us) { return size / us / 1e3; };  // GB/s
    fmt::print(
        "  {:>14} {:>9} {:>9} {:>5} {:>9.1f} {:>8.1f}-{:<9.1f} {:>7.3f} {:>7.3f} {:>6} {:>9.1f} {:>7.3f} {:>9.1f} "
        "{:>9.1f} {:>7.3f} {:>8.2f} {:>7.2f}\n",
        collective_kind_name(kind), size, count, "f32", dtr.median_us, dtr.min_us, dtr.max_us, gbps(dtr.median_us),
        gbps(dtr.median_us) * f, static_cast<int64_t>(t.item()), dtr.min_us, gbps(dtr.min_us) * f, raw.median_us,
        raw.min_us, gbps(raw.min_us) * f, raw.min_us / dtr.min_us, paired_ratio(dtr, raw));
    std::fflush(stdout);
  }

  std::shared_ptr<ProcessGroup> pg_;
  Options options_;
  int rank_, n_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> raw_;
  uint32_t tag_ = 1u << 30;  // apart from dtr's tags (each context has its own slots anyway)
  int64_t wrong_total_ = 0;
  std::vector<CostSample> samples_;  // dtr's median time per row, on rank 0: --fit-cost-model's points
};

}  // namespace
}  // namespace dtr

int main(int argc, char** argv) {
  dtr::Options options;
  CLI::App app{"dtr collectives against raw Gloo, nccl-tests style"};
  app.add_option("--ranks", options.ranks, "rank processes to launch (ignored when RANK/WORLD_SIZE are set)")
      ->check(CLI::Range(1, 64));
  app.add_option("--min-bytes", options.min_bytes, "smallest size, bytes")->check(CLI::PositiveNumber);
  app.add_option("--max-bytes", options.max_bytes, "largest size, bytes (sizes grow 4x)")->check(CLI::PositiveNumber);
  app.add_option("--batches", options.batches, "timed batches per row")->check(CLI::Range(1, 1000));
  app.add_option("--ops", options.ops, "collectives to run")
      ->check(CLI::IsMember({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}));
  app.add_option("--fit-cost-model", options.cost_model_path,
                 "fit the alpha-beta cost model to dtr's median times and write it to this JSON file (fits of other "
                 "group sizes already in it are kept)");
  if (const std::optional<int> exit_code = dtr::parse_command_line("collective_bench", app, argc, argv))
    return *exit_code;
  return dtr::tool_main("collective_bench", [&] {
    if (!dtr::launcher::is_rank_process()) {
      const dtr::launcher::SelfLaunchResult result = dtr::launcher::launch_self(options.ranks, std::span(argv, argc));
      if (result.exit_code != 0) std::cerr << "collective_bench: " << result.failure << "\n";
      return result.exit_code;
    }
    dtr::Bench bench(dtr::init_process_group(dtr::Backend::kGloo), options);
    bench.run();
    const bool ok = bench.wrong_total() == 0;
    dtr::destroy_process_group();
    return ok ? 0 : 1;
  });
}
