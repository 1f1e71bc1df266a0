// CUDA devices as seen from plain C++: count, memory and copies, with no CUDA headers.
//
// device_count() is 0 on a machine without a GPU or driver (the runtime answers
// cudaErrorInsufficientDriver or cudaErrorNoDevice): CPU-only runs never touch CUDA.
// Every failing call throws CudaError naming the call, the device and CUDA's own message.
#pragma once

#include <cstddef>

namespace dtr::cuda {

int device_count();
// nullptr when the device is out of memory; any other failure throws CudaError.
void* device_malloc(int device, size_t nbytes);
// Never throws (it runs in destructors): a failure, such as a sticky error left by an earlier
// kernel, is logged to stderr with the call, device and CUDA's message, and the memory is lost.
void device_free(int device, void* ptr) noexcept;

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
// Blocking copy of nbytes on the given device (the device's legacy stream).
void copy_bytes(int device, void* dst, const void* src, size_t nbytes, CopyKind kind);
void synchronize(int device);

}  // namespace dtr::cuda
