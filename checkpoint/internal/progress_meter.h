// Progress of a save's or a load's bytes, reported through the caller's ProgressCallback.
#pragma once

#include <chrono>
#include <cstdint>

#include "checkpoint/state.h"
#include "core/error.h"

namespace dtr::checkpoint::internal {

// Calls a progress callback at most every kProgressInterval while bytes move, and once at
// the end with done == total.
class ProgressMeter {
 public:
  static constexpr std::chrono::seconds kProgressInterval{1};

  ProgressMeter(const ProgressCallback& on_progress, int64_t total)
      : on_progress_(on_progress), progress_{0, total}, last_(std::chrono::steady_clock::now()) {}

  void add(int64_t bytes) {
    progress_.done_bytes += bytes;
    if (!on_progress_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < kProgressInterval) return;
    last_ = now;
    on_progress_(progress_);
  }

  void finish() {
    DTR_INTERNAL_ASSERT(progress_.done_bytes == progress_.total_bytes,
                        "checkpoint progress counted {} of {} bytes at the end (a bug)", progress_.done_bytes,
                        progress_.total_bytes);
    if (on_progress_) on_progress_(progress_);
  }

 private:
  const ProgressCallback& on_progress_;
  Progress progress_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace dtr::checkpoint::internal
