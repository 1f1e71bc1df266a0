#include "core/allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "core/caching_allocator.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/cuda_device_memory.h"
#include "core/error.h"

namespace dtr {

void* Allocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  void* p = raw_allocate(nbytes);
  if (p == nullptr) {
    throw OutOfMemoryError(fmt::format(
        "allocator: out of memory on {}: asked for {} bytes with {} in use and {} cached (freed blocks kept for "
        "reuse); {}",
        device_, nbytes, bytes_in_use_.load(), cached_bytes(), out_of_memory_note()));
  }
  int64_t now = bytes_in_use_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = peak_bytes_.load();
  while (now > peak && !peak_bytes_.compare_exchange_weak(peak, now)) {}
  live_allocs_.fetch_add(1);
  total_allocs_.fetch_add(1);
  return p;
}

void Allocator::deallocate(void* ptr, size_t nbytes) noexcept {
  if (ptr == nullptr) return;
  raw_deallocate(ptr, nbytes);
  bytes_in_use_.fetch_sub(static_cast<int64_t>(nbytes));
  live_allocs_.fetch_sub(1);
}

MemoryStats Allocator::stats() const {
  return {bytes_in_use_.load(), peak_bytes_.load(), live_allocs_.load(),
          total_allocs_.load(), cached_bytes(),     system_allocs()};
}

void Allocator::reset_peak() { peak_bytes_.store(bytes_in_use_.load()); }

namespace {

// A fresh block of `size` bytes (a block_size); a whole number of granules is aligned to
// the granule so that the kernel can back it with huge pages. nullptr when the system has
// no memory left.
void* map_block(size_t size) {
  constexpr size_t g = CpuAllocator::kGranule;
  if (size % g != 0) {  // a run of 64 KiB
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void* raw = mmap(nullptr, size + g, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* start = static_cast<char*>(raw);
  char* block = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(start) + g - 1) / g * g);
  if (block > start) munmap(start, static_cast<size_t>(block - start));
  if (char* end = block + size; end < start + size + g) munmap(end, static_cast<size_t>(start + size + g - end));
  // 2 MiB pages fault in about a third of the time of 4 KiB pages (docs/kernel_bench.md).
  madvise(block, size, MADV_HUGEPAGE);
  return block;
}

}  // namespace

CpuAllocator::CpuAllocator(size_t cache_limit) : Allocator(kCPU), cache_limit_(cache_limit) {}

CpuAllocator::~CpuAllocator() { empty_cache(); }

size_t CpuAllocator::default_cache_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  const size_t ram = pages > 0 && page_size > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page_size) : 0;
  return std::min(size_t{1} << 30, ram / 8);
}

void* CpuAllocator::raw_allocate(size_t nbytes) {
  if (nbytes < kCachedFrom) {
    system_allocs_.fetch_add(1);
    return std::aligned_alloc(kAlignment, (nbytes + kAlignment - 1) / kAlignment * kAlignment);
  }
  const size_t size = block_size(nbytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = by_size_.upper_bound(size); it != by_size_.begin() && std::prev(it)->first == size) {
      --it;  // the most recently freed block of this size: its pages are the likeliest to be warm
      void* p = it->second->ptr;
      cached_.erase(it->second);
      by_size_.erase(it);
      cached_total_ -= size;
      return p;
    }
  }
  void* p = map_block(size);
  if (p == nullptr) {  // cached blocks of other sizes may be what the system lacks
    empty_cache();
    p = map_block(size);
  }
  if (p != nullptr) system_allocs_.fetch_add(1);
  return p;
}

void CpuAllocator::raw_deallocate(void* ptr, size_t nbytes) noexcept {
  if (nbytes < kCachedFrom) {
    std::free(ptr);
    return;
  }
  const size_t size = block_size(nbytes);
  if (size > cache_limit_) {
    munmap(ptr, size);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  cached_.push_front(Block{size, ptr});
  by_size_.emplace(size, cached_.begin());
  cached_total_ += size;
  while (cached_total_ > cache_limit_) evict_oldest();
}

void CpuAllocator::evict_oldest() {
  const Block& oldest = cached_.back();
  auto [first, last] = by_size_.equal_range(oldest.size);
  // The oldest block of a size was inserted first, so it leads its range.
  DTR_INTERNAL_ASSERT(first != last && first->second == std::prev(cached_.end()),
                      "cpu allocator: cache index out of step with the free list");
  munmap(oldest.ptr, oldest.size);
  cached_total_ -= oldest.size;
  by_size_.erase(first);
  cached_.pop_back();
}

void CpuAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!cached_.empty()) evict_oldest();
}

int64_t CpuAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(cached_total_);
}

namespace {

constexpr int kMaxDevices = 64;

// ValueError naming op unless cuda:device exists (CPU-only machines have none).
void check_cuda_device(int device, std::string_view op) {
  const int n = cuda::device_count();
  DTR_CHECK(device >= 0 && device < n && device < kMaxDevices, ValueError,
            "{}: device cuda:{} does not exist ({} CUDA devices visible)", op, device, n);
}

}  // namespace

Allocator& allocator_for(Device device) {
  switch (device.type) {
    case kCPU: {
      // Never destroyed: tensors in static storage may outlive any destructor order.
      static CpuAllocator* cpu = new CpuAllocator();
      return *cpu;
    }
    case kCUDA: {
      static CachingAllocator* cuda_allocators[kMaxDevices] = {};
      static std::once_flag once[kMaxDevices];
      check_cuda_device(device.index, "allocator");
      std::call_once(once[device.index], [&] {
        cuda_allocators[device.index] = new CachingAllocator(device, cuda::cuda_device_memory(device.index));
      });
      return *cuda_allocators[device.index];
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

CachingAllocator& pinned_host_allocator(int device, std::string_view op) {
  static CachingAllocator* allocators[kMaxDevices] = {};
  static std::once_flag once[kMaxDevices];
  check_cuda_device(device, op);
  std::call_once(once[device],
                 [&] { allocators[device] = new CachingAllocator(kCPU, cuda::cuda_pinned_host_memory(device)); });
  return *allocators[device];
}

}  // namespace dtr
