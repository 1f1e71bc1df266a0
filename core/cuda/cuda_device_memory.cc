#include "core/cuda/cuda_device_memory.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/stream.h"

namespace dtr::cuda {
namespace {

// Device memory, or page-locked host memory whose users are the host (which reads and
// writes it synchronously: stream id 0) and the asynchronous copies on `device`'s streams
// that record_stream names.
enum class MemoryKind { kDevice, kPinnedHost };

class CudaDeviceMemory final : public DeviceMemory {
 public:
  CudaDeviceMemory(int device, MemoryKind kind) : device_(device), kind_(kind) {}
  ~CudaDeviceMemory() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  void* malloc(size_t nbytes) override {
    if (kind_ == MemoryKind::kDevice) return device_malloc(device_, nbytes);
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, nbytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it so the next call does not report it
      return nullptr;
    }
    DTR_CUDA_CHECK(status, device_);
    return p;
  }
  void free(void* ptr) noexcept override {
    if (kind_ == MemoryKind::kDevice) return device_free(device_, ptr);
    const cudaError_t status = cudaFreeHost(ptr);
    if (status != cudaSuccess) {
      std::fprintf(stderr, "dtr: cudaFreeHost failed (pinned memory for cuda:%d): %s (%d)\n", device_,
                   cudaGetErrorString(status), static_cast<int>(status));
    }
  }
  StreamId current_stream() override {
    if (kind_ == MemoryKind::kPinnedHost) return 0;
    return reinterpret_cast<StreamId>(cuda::current_stream(device_).handle());
  }

  Marker record(StreamId stream) override {
    cudaEvent_t e = nullptr;
    if (!events_.empty()) {
      e = events_.back();
      events_.pop_back();
    } else {
      DTR_CUDA_CHECK(cudaSetDevice(device_), device_);
      DTR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), device_);
    }
    const cudaError_t status = cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream));
    if (status != cudaSuccess) {
      events_.push_back(e);
      DTR_CUDA_CHECK(status, device_);
    }
    return reinterpret_cast<Marker>(e);
  }

  bool done(Marker marker) override {
    const cudaError_t status = cudaEventQuery(reinterpret_cast<cudaEvent_t>(marker));
    if (status == cudaErrorNotReady) return false;
    DTR_CUDA_CHECK(status, device_);
    return true;
  }

  void wait(Marker marker) noexcept override {
    const cudaError_t status = cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(marker));
    if (status != cudaSuccess) {
      std::fprintf(stderr, "dtr: cudaEventSynchronize failed on cuda:%d while emptying the cache: %s (%d)\n", device_,
                   cudaGetErrorString(status), static_cast<int>(status));
    }
  }

  void release(Marker marker) noexcept override { events_.push_back(reinterpret_cast<cudaEvent_t>(marker)); }

 private:
  int device_;
  MemoryKind kind_;
  std::vector<cudaEvent_t> events_;  // recorded and given back, for reuse
};

}  // namespace

std::unique_ptr<DeviceMemory> cuda_device_memory(int device) {
  return std::make_unique<CudaDeviceMemory>(device, MemoryKind::kDevice);
}

std::unique_ptr<DeviceMemory> cuda_pinned_host_memory(int device) {
  return std::make_unique<CudaDeviceMemory>(device, MemoryKind::kPinnedHost);
}

}  // namespace dtr::cuda
