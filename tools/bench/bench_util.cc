#include "tools/bench/bench_util.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>

#include "core/parallel.h"

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

}  // namespace dtr::bench
