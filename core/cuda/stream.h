// Streams and events: RAII handles over cudaStream_t and cudaEvent_t, and the stream each
// thread's kernels run on.
//
// Every device has one compute stream, created at first use; kernels, copies and the
// caching allocator use the calling thread's current stream, which is the compute stream
// unless a StreamGuard says otherwise (a process group's communication stream, in the NCCL
// backend). Streams never synchronise with the legacy default stream. Ordering across
// streams goes through events (Stream::wait): the host waits only in synchronize().
// Creating either on a device that does not exist is a ValueError naming it and the
// devices visible (none on a machine without a GPU).
#pragma once

#include <cuda_runtime_api.h>

namespace dtr::cuda {

class Event;

class Stream {
 public:
  // A new stream on `device` (priority: CUDA's, lower is more urgent; 0 is the default).
  explicit Stream(int device, int priority = 0);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device() const { return device_; }
  cudaStream_t handle() const { return stream_; }
  // Work queued on this stream from now on runs after the work `event` recorded.
  void wait(const Event& event) const;
  // Whether every piece of work queued so far has run.
  bool query() const;
  // Blocks the host until every piece of work queued so far has run.
  void synchronize() const;

 private:
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  enum class Timing : bool { kOff, kOn };  // kOn: elapsed_ms works (costs more to record)
  explicit Event(int device, Timing timing = Timing::kOff);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  int device() const { return device_; }
  cudaEvent_t handle() const { return event_; }
  // Marks the point after everything queued on `stream` so far (stream on this event's device).
  void record(const Stream& stream);
  // Whether the recorded work has run (true when never recorded).
  bool query() const;
  void synchronize() const;
  // Milliseconds from this event to `end`, both recorded with Timing::kOn and complete.
  float elapsed_ms(const Event& end) const;

 private:
  int device_ = -1;
  cudaEvent_t event_ = nullptr;
};

// The device's compute stream (created at first use, never destroyed).
const Stream& compute_stream(int device);
// The calling thread's stream on `device`: the innermost StreamGuard's, else the compute stream.
const Stream& current_stream(int device);

// Makes `stream` the calling thread's current stream on its device for the guard's scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  const Stream* previous_;
};

// ValueError unless `device` is a CUDA device of this machine; names the op asking.
void check_device(int device, const char* op);

}  // namespace dtr::cuda
