// Allocator: where tensor memory comes from, with per-device statistics.
//
// Every memory figure dtr reports (FSDP's memory per rank, the train program's table)
// comes from these counters: bytes in use, the peak since the last reset, and the number
// of live and total allocations. CPU memory is 64-byte aligned (one AVX-512 vector, one
// cache line). CUDA memory comes from kernels/cuda (cudaMalloc; a caching allocator is a
// later step). Counters are atomic: the comm thread allocates too.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/device.h"

namespace dtr {

struct MemoryStats {
  int64_t bytes_in_use = 0;
  int64_t peak_bytes = 0;     // highest bytes_in_use since the last reset_peak
  int64_t live_allocs = 0;    // allocations not yet freed
  int64_t total_allocs = 0;   // allocations ever made
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for nbytes (nullptr for 0 bytes); throws on exhaustion.
  void* allocate(size_t nbytes);
  void deallocate(void* ptr, size_t nbytes);
  MemoryStats stats() const;
  void reset_peak();

 protected:
  virtual void* raw_allocate(size_t nbytes) = 0;
  virtual void raw_deallocate(void* ptr) = 0;

 private:
  std::atomic<int64_t> bytes_in_use_{0};
  std::atomic<int64_t> peak_bytes_{0};
  std::atomic<int64_t> live_allocs_{0};
  std::atomic<int64_t> total_allocs_{0};
};

// The allocator of a device (one per CUDA device index).
Allocator& allocator_for(Device device);

inline MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }
inline void reset_peak_memory_stats(Device device) { allocator_for(device).reset_peak(); }

}  // namespace dtr
