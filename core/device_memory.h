// DeviceMemory: what CachingAllocator (caching_allocator.h) needs of a device: memory, the
// stream the calling thread's work is queued on, and markers that say when a stream's work
// so far has run. core/cuda/cuda_device_memory.h implements it with cudaMalloc and
// events.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtr {

class DeviceMemory {
 public:
  using StreamId = uintptr_t;  // a stream's handle (a cudaStream_t)
  using Marker = uintptr_t;    // a recorded point on a stream (a cudaEvent_t)
  virtual ~DeviceMemory() = default;
  // nullptr when the device has no memory left; any other failure throws.
  virtual void* malloc(size_t nbytes) = 0;
  // Returns memory malloc gave; waits for the device's work first (as cudaFree does).
  virtual void free(void* ptr) noexcept = 0;
  // The stream the calling thread's kernels are queued on now.
  virtual StreamId current_stream() = 0;
  // A marker done once the work queued on `stream` so far has run.
  virtual Marker record(StreamId stream) = 0;
  virtual bool done(Marker marker) = 0;
  // Blocks the host until the marker is done.
  virtual void wait(Marker marker) noexcept = 0;
  // Gives the marker back (done or waited for).
  virtual void release(Marker marker) noexcept = 0;
};

}  // namespace dtr
