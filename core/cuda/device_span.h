// DeviceSpan: a trace span (core/trace.h) of the work queued on a CUDA stream, timed on
// the device: a timing event recorded on the stream where the span begins and one where it
// ends. When the tracing run stops (a stop hook), each span's events are converted to the
// host clock through an anchor (an event the host waited for once per run and device, at
// the run's first device span, on an idle stream of its own so that the wait never waits
// for queued work) and recorded on a trace lane named after the stream
// ("cuda:0 compute", "cuda:0 nccl default_pg"). So traces of GPU runs show when the device
// ran a collective or waited for one, not when the host queued it; the conversion costs one
// host wait per run and device, and none while tracing is off. A span still open when its
// run stops is dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/cuda/stream.h"
#include "core/trace.h"

namespace dtr::cuda {

class DeviceSpan {
 public:
  // Begins on `stream` (an event recorded now) when tracing of `category` is on.
  DeviceSpan(const Stream& stream, std::string lane, std::string_view name, trace::Category category);
  // Ends where the stream's queued work ends now, on the stream it began on.
  ~DeviceSpan();
  DeviceSpan(const DeviceSpan&) = delete;
  DeviceSpan& operator=(const DeviceSpan&) = delete;

  bool active() const { return pending_ != nullptr; }
  // Arguments, as trace::Span's.
  void arg(std::string_view key, int64_t value);
  void arg(std::string_view key, std::string_view value);
  void arg(std::string_view key, const char* value) { arg(key, std::string_view(value)); }

  struct Pending;

 private:
  const Stream* stream_ = nullptr;
  std::unique_ptr<Pending> pending_;
};

}  // namespace dtr::cuda
