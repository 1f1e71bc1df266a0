#include "tools/bench/bench_util.h"

#include <fmt/format.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "core/error.h"
#include "core/parallel.h"
#include "tools/bench/peer.h"

namespace dtr::bench {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

constexpr double kMinSampleSeconds = 50e-6;

// "123.4 GB/s" or "56.7 GFLOP/s" for work per call at time_us per call.
std::string throughput(const Case& c, double time_us) {
  if (c.flops > 0) return fmt::format("{:.1f} GFLOP/s", c.flops / time_us * 1e-3);
  return fmt::format("{:.2f} GB/s", c.bytes / time_us * 1e-3);
}

constexpr const char* kRowFormat = "{:<24} {:<17} {:<30} {:<5} {:>11} {:>21} {:>15} {:>8}  {:<26} {:>13}  {}\n";

// Back-to-back calls of fn that last at least kMinSampleSeconds (after warm-up calls).
int64_t calls_per_sample(const std::function<void()>& fn, const TimingOptions& options) {
  for (int64_t i = 0; i < options.warmup; ++i) fn();
  const Clock::time_point start = Clock::now();
  fn();
  const double one = std::max(seconds_since(start), 1e-9);
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(kMinSampleSeconds / one)), 1, 1 << 20);
}

// Per-call seconds of one sample of `calls` calls, in microseconds.
double sample_us(const std::function<void()>& fn, int64_t calls) {
  const Clock::time_point t = Clock::now();
  for (int64_t c = 0; c < calls; ++c) fn();
  return seconds_since(t) / static_cast<double>(calls) * 1e6;
}

Timing summarise(const std::vector<double>& samples) {
  const auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
  return Timing{median(samples), *lo, *hi, static_cast<int64_t>(samples.size())};
}

// Whether sampling goes on: until min_samples are taken and min_seconds have passed, or
// max_samples are taken.
bool more_samples(size_t taken, Clock::time_point start, const TimingOptions& options) {
  const auto n = static_cast<int64_t>(taken);
  return n < options.min_samples || (seconds_since(start) < options.min_seconds && n < options.max_samples);
}

}  // namespace

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

Timing time_it(const std::function<void()>& fn, const TimingOptions& options) {
  const int64_t calls = calls_per_sample(fn, options);
  std::vector<double> samples;
  for (const Clock::time_point start = Clock::now(); more_samples(samples.size(), start, options);) {
    samples.push_back(sample_us(fn, calls));
  }
  return summarise(samples);
}

PairTiming time_pair(const std::function<void()>& fn, const std::function<void()>& ref, const TimingOptions& options) {
  const int64_t fn_calls = calls_per_sample(fn, options), ref_calls = calls_per_sample(ref, options);
  std::vector<double> fn_samples, ref_samples;
  // Each takes min_seconds' worth, as if timed alone.
  const TimingOptions both{.min_seconds = 2 * options.min_seconds,
                           .min_samples = options.min_samples,
                           .max_samples = options.max_samples,
                           .warmup = options.warmup};
  for (const Clock::time_point start = Clock::now(); more_samples(fn_samples.size(), start, both);) {
    if (fn_samples.size() % 2 == 0) {
      fn_samples.push_back(sample_us(fn, fn_calls));
      ref_samples.push_back(sample_us(ref, ref_calls));
    } else {
      ref_samples.push_back(sample_us(ref, ref_calls));
      fn_samples.push_back(sample_us(fn, fn_calls));
    }
  }
  std::vector<double> ratios;
  for (size_t i = 0; i < fn_samples.size(); ++i) ratios.push_back(ref_samples[i] / fn_samples[i]);
  return {summarise(fn_samples), summarise(ref_samples), median(ratios)};
}

Reference memcpy_reference(double bytes_moved) {
  const size_t n = static_cast<size_t>(bytes_moved / 2);
  // 64-byte aligned like tensor memory; shared so that copies of the Reference keep it alive.
  const size_t rounded = (n + 63) / 64 * 64 + 64;
  std::shared_ptr<char> dst(static_cast<char*>(std::aligned_alloc(64, rounded)), std::free);
  std::shared_ptr<char> src(static_cast<char*>(std::aligned_alloc(64, rounded)), std::free);
  DTR_CHECK(dst && src, ValueError, "memcpy_reference: cannot allocate 2 x {} bytes", rounded);
  std::memset(src.get(), 1, n);
  return {"memcpy", [dst, src, n] {
#pragma omp parallel num_threads(num_threads()) if (n >= (size_t{1} << 20))
            {
              const size_t t = static_cast<size_t>(omp_get_thread_num());
              const size_t threads = static_cast<size_t>(omp_get_num_threads());
              const size_t begin = n * t / threads, end = n * (t + 1) / threads;
              std::memcpy(dst.get() + begin, src.get() + begin, end - begin);
            }
          }};
}

// A row's in-cache time from its twins (see Suite::run): us = 0 when no twin is small
// enough. A twin whose check fails makes its row WRONG: problem says why.
struct InCache {
  double us = 0;
  std::string problem;
};

InCache in_cache_time(const std::vector<const Row*>& twins, const Case& full, const TimingOptions& timing) {
  for (const Row* twin : twins) {
    try {
      Case c = twin->make();
      if (c.bytes <= 0 || c.bytes > kInCacheMaxBytes || full.bytes <= c.bytes) continue;
      c.run();  // a check looks at the result of one run
      if (std::string problem = c.check(); !problem.empty()) return {0, fmt::format("in-cache twin: {}", problem)};
      return {time_it(c.run, timing).median_us * full.bytes / c.bytes, ""};
    } catch (const std::exception& e) {
      return {0, fmt::format("in-cache twin threw: {}", e.what())};
    }
  }
  return {};
}

int Suite::run(const std::string& filter, const TimingOptions& timing, std::ostream& os,
               const std::vector<const Suite*>& in_cache) const {
  for (const Suite* twins : in_cache) {
    DTR_CHECK(twins->rows_.size() == rows_.size(), ValueError, "Suite::run: {} in-cache rows for {} rows",
              twins->rows_.size(), rows_.size());
  }
  os << fmt::format(kRowFormat, "op", "dtype", "shape", "check", "time (us)", "spread min-max (us)", "throughput",
                    "% of ref", "reference", "in-cache (us)", "bound");
  int wrong = 0;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& row = rows_[i];
    if (fmt::format("{} {} {}", row.op, row.dtype, row.shape).find(filter) == std::string::npos) continue;
    std::string verdict, problem;
    PairTiming timed;
    Case c;
    try {
      c = row.make();
      c.run();
      problem = c.check();
      verdict = problem.empty() ? "ok" : "WRONG";
      timed = time_pair(c.run, c.reference.run, timing);
    } catch (const std::exception& e) {
      verdict = "WRONG";
      problem = fmt::format("threw: {}", e.what());
    }
    InCache cached;
    if (timed.fn.samples > 0 && c.flops == 0) {
      std::vector<const Row*> twins;
      for (const Suite* suite : in_cache) twins.push_back(&suite->rows_[i]);
      cached = in_cache_time(twins, c, timing);
      if (!cached.problem.empty()) {
        verdict = "WRONG";
        problem = cached.problem;
      }
    }
    if (verdict != "ok") ++wrong;
    if (timed.fn.samples == 0) {
      os << fmt::format(kRowFormat, row.op, row.dtype, row.shape, verdict, "-", "-", "-", "-", c.reference.name, "-",
                        "-");
    } else {
      const std::string bound = cached.us == 0 ? "-"
                                : cached.us > timed.ref.median_us
                                    ? fmt::format("compute ({:.0f}%)", 100.0 * cached.us / timed.fn.median_us)
                                    : "memory";
      os << fmt::format(kRowFormat, row.op, row.dtype, row.shape, verdict, fmt::format("{:.1f}", timed.fn.median_us),
                        fmt::format("{:.1f}-{:.1f}", timed.fn.min_us, timed.fn.max_us),
                        throughput(c, timed.fn.median_us), fmt::format("{:.0f}%", 100.0 * timed.ratio),
                        fmt::format("{} ({:.1f} us)", c.reference.name, timed.ref.median_us),
                        cached.us == 0 ? "-" : fmt::format("{:.1f}", cached.us), bound);
    }
    if (!problem.empty()) os << "    " << problem << "\n";
    os.flush();
  }
  return wrong;
}

double element_at(const Tensor& t, std::span<const int64_t> coords) {
  int64_t offset = 0;
  for (size_t d = 0; d < coords.size(); ++d) offset += coords[d] * t.stride(static_cast<int64_t>(d));
  return dispatch_all(t.dtype(), "element_at",
                      [&]<class T>(TypeTag<T>) { return convert<double>(static_cast<const T*>(t.data())[offset]); });
}

std::string check_sampled(const Tensor& actual, const std::function<double(std::span<const int64_t>)>& expected,
                          double atol, double rtol) {
  const int64_t n = actual.numel();
  if (n == 0) return "";
  const int64_t step = std::max<int64_t>(1, n / 4093);
  Shape coords(actual.dim());
  for (int64_t flat = 0;; flat = std::min(flat + step, n - 1)) {
    for (int64_t d = actual.dim() - 1, rest = flat; d >= 0; --d) {
      coords[d] = rest % actual.size(d);
      rest /= actual.size(d);
    }
    const double a = element_at(actual, coords), e = expected(coords);
    if (!(std::abs(a - e) <= atol + rtol * std::abs(e))) {
      return fmt::format("at {}: expected {:.9g}, got {:.9g}", coords, e, a);
    }
    if (flat == n - 1) return "";
  }
}

namespace {

namespace fs = std::filesystem;

constexpr const char* kWorkspace = "dtr";

bool is_executable_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace

std::string last_lines(const std::string& text, int n) {
  size_t at = text.size();
  while (n-- > 0 && at > 0) {
    const size_t nl = text.rfind('\n', at - 1);
    at = nl == std::string::npos ? 0 : nl;
  }
  return text.substr(at);
}

std::string find_built_program(const std::string& path, const std::string& bench) {
  std::vector<fs::path> candidates;
  if (const char* dir = std::getenv("RUNFILES_DIR")) candidates.push_back(fs::path(dir) / kWorkspace / path);
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(fs::path(self.string() + ".runfiles") / kWorkspace / path);
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY"))
    candidates.push_back(fs::path(ws) / "bazel-bin" / path);
  candidates.push_back(fs::current_path() / "bazel-bin" / path);
  std::string tried;
  for (const fs::path& c : candidates) {
    if (is_executable_file(c)) return fs::absolute(c).string();
    tried += fmt::format("{}{}", tried.empty() ? "" : ", ", c.string());
  }
  throw ValueError(fmt::format("no executable {} (tried {}); bazel build {}", path, tried, bench));
}

TrainRun run_train(const std::string& dtrrun, const std::string& program, int ranks, const std::string& flags,
                   int64_t steps, int64_t warmup, const fs::path& dir, const std::string& what) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path log = dir / "output.txt";
  const std::string command =
      fmt::format("{} --nproc-per-node {} {} {} --steps {} --log-every {} --out {} > {} 2>&1", shell_quote(dtrrun),
                  ranks, shell_quote(program), flags, steps, steps, shell_quote(dir / "out"), shell_quote(log));
  const int status = std::system(command.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  DTR_CHECK(code == 0, Error, "{}: exit {}; the command was\n  {}\nand its output ends\n{}", what, code, command,
            last_lines(read_text(log), 15));

  for (const char* file : {"summary.json", "metrics.jsonl"}) {
    DTR_CHECK(fs::is_regular_file(dir / "out" / file), Error, "{}: exit 0 but no {} in {}", what, file,
              (dir / "out").string());
  }
  const nlohmann::json summary = nlohmann::json::parse(read_text(dir / "out" / "summary.json"));
  DTR_CHECK(summary.at("steps").get<int64_t>() == steps && !summary.at("interrupted").get<bool>(), Error,
            "{}: summary.json says {} steps (interrupted: {}), not the {} asked for", what, summary.at("steps").dump(),
            summary.at("interrupted").dump(), steps);
  const nlohmann::json& rank_figures = summary.at("ranks");
  DTR_CHECK(rank_figures.size() == static_cast<size_t>(ranks), Error, "{}: summary.json has figures of {} ranks", what,
            rank_figures.size());
  TrainRun run;
  for (const nlohmann::json& r : rank_figures) {
    const double train_s = r.at("train_s").get<double>();
    DTR_CHECK(train_s > 0, Error, "{}: a rank's train_s is {}", what, train_s);
    run.comm_share = std::max(run.comm_share, r.at("exposed_comm_s").get<double>() / train_s);
    run.peak_bytes = std::max(run.peak_bytes, r.at("peak_bytes").get<double>());
  }

  std::ifstream metrics(dir / "out" / "metrics.jsonl");
  std::vector<double> times;
  int64_t lines = 0;
  for (std::string line; std::getline(metrics, line); ++lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const double loss = j.at("loss").get<double>(), ms = j.at("ms").get<double>();
    DTR_CHECK(std::isfinite(loss), Error, "{}: step {}'s loss is {}", what, j.at("step").dump(), loss);
    DTR_CHECK(ms > 0, Error, "{}: step {} took {} ms", what, j.at("step").dump(), ms);
    if (lines >= warmup) times.push_back(ms);
    run.comm_bytes = 0;
    for (const auto& [phase, figures] : j.at("comm").at("by_phase").items()) {
      run.comm_bytes += figures.at("bus_bytes").get<double>();
    }
  }
  DTR_CHECK(lines == steps, Error, "{}: metrics.jsonl has {} steps, not {}", what, lines, steps);
  run.median_ms = median(times);
  run.min_ms = *std::min_element(times.begin(), times.end());
  run.max_ms = *std::max_element(times.begin(), times.end());
  return run;
}

}  // namespace dtr::bench
