// The DeviceMemory (core/device_memory.h) of one CUDA device: cudaMalloc and cudaFree,
// the calling thread's current stream (stream.h), and markers as CUDA events (disabled
// timing), recycled through a free list. CachingAllocator calls it under its own lock.
#pragma once

#include <memory>

#include "core/device_memory.h"

namespace dtr::cuda {

std::unique_ptr<DeviceMemory> cuda_device_memory(int device);
// Page-locked host memory (cudaHostAlloc, portable) for copies on `device`'s streams: the
// host's own use is stream 0, and the markers are events on that device.
std::unique_ptr<DeviceMemory> cuda_pinned_host_memory(int device);

}  // namespace dtr::cuda
