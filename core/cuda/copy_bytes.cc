#include "core/cuda/copy_bytes.h"

#include "core/cuda/cuda_check.h"

namespace dtr::cuda {

void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, const Stream& stream, HostWait host_wait) {
  if (nbytes == 0) return;
  const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  const int device = stream.device();
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  DTR_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, stream.handle()), device);
  if (kind != CopyKind::kDeviceToDevice && host_wait == HostWait::kYes) stream.synchronize();
}

}  // namespace dtr::cuda
