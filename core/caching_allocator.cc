#include "core/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "core/error.h"

namespace dtr {

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<DeviceMemory> memory)
    : Allocator(device), memory_(std::move(memory)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_cached();
}

size_t CachingAllocator::block_size(size_t nbytes) {
  if (nbytes < kLargeFrom) return (nbytes + kSmallStep - 1) / kSmallStep * kSmallStep;
  const size_t step = std::bit_floor(nbytes) / 4;  // 1, 1.25, 1.5, 1.75 x a power of two
  return (nbytes + step - 1) / step * step;
}

void* CachingAllocator::raw_allocate(size_t nbytes) {
  const size_t size = block_size(nbytes);
  const DeviceMemory::StreamId stream = memory_->current_stream();
  std::lock_guard<std::mutex> lock(mutex_);
  collect_pending();
  if (auto it = free_.find({stream, size}); it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    cached_total_ -= size;
    live_.emplace(p, Block{.size = size, .stream = stream, .also_on = {}});
    return p;
  }
  void* p = memory_->malloc(size);
  if (p == nullptr) {  // what the device lacks may be held by blocks of other classes or streams
    free_cached();
    p = memory_->malloc(size);
  }
  if (p == nullptr) return nullptr;
  ++system_allocs_;
  live_.emplace(p, Block{.size = size, .stream = stream, .also_on = {}});
  return p;
}

void CachingAllocator::raw_deallocate(void* ptr, size_t) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(ptr);
  if (it == live_.end()) {  // a bug; deallocate must not throw
    std::fprintf(stderr, "dtr: caching allocator of %s: %p was not allocated here, or freed twice; ignored\n",
                 fmt::format("{}", device()).c_str(), ptr);
    return;
  }
  Block block = std::move(it->second);
  live_.erase(it);
  if (block.also_on.empty()) {
    free_[{block.stream, block.size}].push_back(ptr);
    cached_total_ += block.size;
    return;
  }
  Pending pending{.ptr = ptr, .block = std::move(block), .markers = {}};
  try {
    for (DeviceMemory::StreamId s : pending.block.also_on) pending.markers.push_back(memory_->record(s));
  } catch (const std::exception& e) {
    // Unsafe to reuse without its markers: free it (the device's work is waited for first).
    std::fprintf(stderr, "dtr: caching allocator of %s: %s; the block is freed instead of cached\n",
                 fmt::format("{}", device()).c_str(), e.what());
    for (DeviceMemory::Marker m : pending.markers) memory_->release(m);
    memory_->free(ptr);
    return;
  }
  cached_total_ += pending.block.size;
  pending_.push_back(std::move(pending));
}

void CachingAllocator::record_stream(void* ptr, DeviceMemory::StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(ptr);
  DTR_CHECK(it != live_.end(), ValueError,
            "record_stream: {} holds no block at {} (never allocated here, or already freed)", device(), ptr);
  Block& b = it->second;
  if (stream != b.stream && std::find(b.also_on.begin(), b.also_on.end(), stream) == b.also_on.end()) {
    b.also_on.push_back(stream);
  }
}

void CachingAllocator::collect_pending() {
  const auto ready = std::stable_partition(pending_.begin(), pending_.end(), [&](const Pending& p) {
    return !std::all_of(p.markers.begin(), p.markers.end(), [&](DeviceMemory::Marker m) { return memory_->done(m); });
  });
  for (auto it = ready; it != pending_.end(); ++it) {
    for (DeviceMemory::Marker m : it->markers) memory_->release(m);
    free_[{it->block.stream, it->block.size}].push_back(it->ptr);
  }
  pending_.erase(ready, pending_.end());
}

void CachingAllocator::free_cached() {
  for (Pending& p : pending_) {
    for (DeviceMemory::Marker m : p.markers) {
      memory_->wait(m);
      memory_->release(m);
    }
    free_[{p.block.stream, p.block.size}].push_back(p.ptr);
  }
  pending_.clear();
  for (auto& [key, ptrs] : free_) {
    for (void* p : ptrs) memory_->free(p);
  }
  free_.clear();
  cached_total_ = 0;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_cached();
}

int64_t CachingAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(cached_total_);
}

int64_t CachingAllocator::system_allocs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return system_allocs_;
}

std::string CachingAllocator::out_of_memory_note() const {
  return "the cache was emptied and the request retried; free tensors or use a smaller batch";
}

}  // namespace dtr
