// Allocator: where tensor memory comes from, with per-device statistics.
//
// Every memory figure dtr reports comes from these counters: bytes in use (handed to
// tensors, as requested), the peak since the last reset, live and total allocations, and
// bytes cached (freed by tensors, kept for reuse, not in use). CPU memory is 64-byte
// aligned. CPU blocks of 128 KiB or more are cached, as PyTorch's CUDA caching allocator
// does: glibc serves them with fresh mmaps whose page faults can cost more than the op that
// writes them (figures: docs/kernel_bench.md, "Allocator"). CUDA memory comes from a
// CachingAllocator (caching_allocator.h) per device. Thread safe: the comm thread allocates too.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "core/device.h"

namespace dtr {

struct MemoryStats {
  int64_t bytes_in_use = 0;
  int64_t peak_bytes = 0;     // highest bytes_in_use since the last reset_peak
  int64_t live_allocs = 0;    // allocations not yet freed
  int64_t total_allocs = 0;   // allocations ever made
  int64_t bytes_cached = 0;   // freed blocks held for reuse (not in use); empty_cache returns them
  int64_t system_allocs = 0;  // allocations the system served (cudaMalloc, mmap, aligned_alloc): the cache's misses
};

class Allocator {
 public:
  explicit Allocator(Device device) : device_(device) {}
  virtual ~Allocator() = default;
  // Returns memory for nbytes (nullptr for 0 bytes); throws OutOfMemoryError naming the
  // device, the bytes asked for, in use and cached when the device has none left.
  void* allocate(size_t nbytes);
  // Frees what allocate(nbytes) returned (nbytes as passed to allocate). Never throws: it
  // runs in destructors (a device that cannot free logs and goes on).
  void deallocate(void* ptr, size_t nbytes) noexcept;
  MemoryStats stats() const;
  void reset_peak();
  // Returns every cached block to the system; an allocator without a cache has none.
  virtual void empty_cache() {}
  Device device() const { return device_; }

 protected:
  // nullptr when the device has no memory left.
  virtual void* raw_allocate(size_t nbytes) = 0;
  virtual void raw_deallocate(void* ptr, size_t nbytes) noexcept = 0;
  virtual int64_t cached_bytes() const { return 0; }
  // Without a cache every allocation is the system's.
  virtual int64_t system_allocs() const { return total_allocs_.load(); }
  // The end of the out-of-memory message: what the user can do.
  virtual std::string out_of_memory_note() const { return "free tensors or call empty_cache()"; }

 private:
  const Device device_;
  std::atomic<int64_t> bytes_in_use_{0};
  std::atomic<int64_t> peak_bytes_{0};
  std::atomic<int64_t> live_allocs_{0};
  std::atomic<int64_t> total_allocs_{0};
};

// The CPU allocator: aligned_alloc for small blocks, a cache of mmapped blocks for large
// ones: runs of 64 KiB under 1 MiB, whole 2 MiB huge-page granules (MADV_HUGEPAGE) from
// there. A block is reused for a request of the same rounded size, the most recently freed
// first, and unmapped, least recently freed first, once the cache would exceed its limit, or
// on empty_cache(). allocator_for(kCPU) is one of these with the default limit; tests build
// their own with a small one.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;                  // one AVX-512 vector, one cache line
  static constexpr size_t kCachedFrom = size_t{128} << 10;  // requests of this many bytes or more are cached
  static constexpr size_t kRun = size_t{64} << 10;          // blocks for requests under kHugeFrom: multiples of this
  static constexpr size_t kHugeFrom = size_t{1} << 20;      // from here blocks are whole granules
  static constexpr size_t kGranule = size_t{2} << 20;       // a huge page

  // cache_limit: the most bytes the cache holds; a freed block that would push it past
  // this evicts older blocks first, and one larger than the limit is unmapped at once.
  explicit CpuAllocator(size_t cache_limit = default_cache_limit());
  ~CpuAllocator() override;
  // min(1 GiB, physical memory / 8).
  static size_t default_cache_limit();
  // The size of the block that serves a request of nbytes (>= kCachedFrom).
  static size_t block_size(size_t nbytes) {
    const size_t unit = nbytes >= kHugeFrom ? kGranule : kRun;
    return (nbytes + unit - 1) / unit * unit;
  }
  void empty_cache() override;

 private:
  void* raw_allocate(size_t nbytes) override;
  void raw_deallocate(void* ptr, size_t nbytes) noexcept override;
  int64_t cached_bytes() const override;
  int64_t system_allocs() const override { return system_allocs_.load(); }
  void evict_oldest();  // with mutex_ held

  struct Block {
    size_t size;
    void* ptr;
  };
  const size_t cache_limit_;
  mutable std::mutex mutex_;
  std::list<Block> cached_;  // most recently freed first
  std::multimap<size_t, std::list<Block>::iterator> by_size_;
  size_t cached_total_ = 0;
  std::atomic<int64_t> system_allocs_{0};
};

// The allocator of a device (one per CUDA device index).
Allocator& allocator_for(Device device);

class CachingAllocator;
// The allocator of page-locked host memory for copies on CUDA device `device`'s streams
// (PyTorch's CachingHostAllocator: Tensor::pin_memory): a CachingAllocator of
// cudaHostAlloc'ed blocks whose device() is kCPU; a block an asynchronous copy used
// (record_stream with the copy's stream) is reused only after that copy has run.
// ValueError naming `op` when the device does not exist.
CachingAllocator& pinned_host_allocator(int device, std::string_view op = "pin_memory");

inline MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }
inline void reset_peak_memory_stats(Device device) { allocator_for(device).reset_peak(); }
// Returns the device allocator's cached blocks to the system (torch.cuda.empty_cache).
inline void empty_cache(Device device) { allocator_for(device).empty_cache(); }

}  // namespace dtr
