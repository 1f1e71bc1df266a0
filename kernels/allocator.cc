#include "kernels/allocator.h"

#include <cstdlib>
#include <mutex>
#include <new>

#include "kernels/cuda/cuda_device.h"
#include "kernels/error.h"

namespace dtr {

void* Allocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  void* p = raw_allocate(nbytes);
  int64_t now = bytes_in_use_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = peak_bytes_.load();
  while (now > peak && !peak_bytes_.compare_exchange_weak(peak, now)) {
  }
  live_allocs_.fetch_add(1);
  total_allocs_.fetch_add(1);
  return p;
}

void Allocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  raw_deallocate(ptr);
  bytes_in_use_.fetch_sub(static_cast<int64_t>(nbytes));
  live_allocs_.fetch_sub(1);
}

MemoryStats Allocator::stats() const {
  return {bytes_in_use_.load(), peak_bytes_.load(), live_allocs_.load(), total_allocs_.load()};
}

void Allocator::reset_peak() { peak_bytes_.store(bytes_in_use_.load()); }

namespace {

class CpuAllocator final : public Allocator {
  static constexpr size_t kAlignment = 64;

  void* raw_allocate(size_t nbytes) override {
    size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void raw_deallocate(void* ptr) override { std::free(ptr); }
};

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}

 private:
  void* raw_allocate(size_t nbytes) override { return cuda::device_malloc(index_, nbytes); }
  void raw_deallocate(void* ptr) override { cuda::device_free(index_, ptr); }
  int index_;
};

}  // namespace

Allocator& allocator_for(Device device) {
  switch (device.type) {
    case kCPU: {
      static CpuAllocator cpu;
      return cpu;
    }
    case kCUDA: {
      static constexpr int kMaxDevices = 64;
      static CudaAllocator* cuda_allocators[kMaxDevices] = {};
      static std::once_flag once[kMaxDevices];
      int n = cuda::device_count();
      DTR_CHECK(device.index >= 0 && device.index < n, ValueError,
                "allocator: device {} does not exist ({} CUDA devices visible)", device, n);
      std::call_once(once[device.index],
                     [&] { cuda_allocators[device.index] = new CudaAllocator(device.index); });
      return *cuda_allocators[device.index];
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
