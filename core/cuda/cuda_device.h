// CUDA devices as seen from plain C++: count, description and memory, with no CUDA headers (copies and
// streams: copy_bytes.h, stream.h).
//
// device_count() is 0 on a machine without a GPU or driver (the runtime answers
// cudaErrorInsufficientDriver or cudaErrorNoDevice): CPU-only runs never touch CUDA.
// Every failing call throws CudaError naming the call, the device and CUDA's own message.
#pragma once

#include <cstddef>
#include <string>

namespace dtr::cuda {

int device_count();
// The device's name, memory and compute capability: "NVIDIA H200, 139.8 GiB, sm_90".
std::string device_description(int device);
// nullptr when the device is out of memory; any other failure throws CudaError.
void* device_malloc(int device, size_t nbytes);
// Never throws (it runs in destructors): a failure, such as a sticky error left by an earlier
// kernel, is logged to stderr with the call, device and CUDA's message, and the memory is lost.
void device_free(int device, void* ptr) noexcept;

}  // namespace dtr::cuda
