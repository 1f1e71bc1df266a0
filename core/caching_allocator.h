// CachingAllocator: the device allocator of CUDA memory (PyTorch's CUDACachingAllocator,
// without block splitting), written against a DeviceMemory so that its policy is the same
// code whatever serves the memory.
//
// Requests are rounded to a size class (block_size: 512 B steps below 1 MiB, then four
// classes per power of two), and a freed block is kept, by stream and class, for the next
// request of that class on the stream it was allocated on: work on one stream runs in
// order, so the next kernel there cannot touch the block before the last user is done.
// A block that record_stream() says other streams also used waits, after it is freed,
// for a marker recorded on each of them (an event) before it is reused. So a training step
// that repeats the last one's requests is served from the cache: no device allocation once
// warm. When the device has no memory left, every cached block is freed (waiting for
// pending markers) and the request retried once; then allocate() throws OutOfMemoryError
// naming the bytes asked for, in use and cached. Thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/device_memory.h"

namespace dtr {

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kSmallStep = 512;              // classes below kLargeFrom
  static constexpr size_t kLargeFrom = size_t{1} << 20;  // from here: 4 classes per power of two
  CachingAllocator(Device device, std::unique_ptr<DeviceMemory> memory);
  ~CachingAllocator() override;  // waits for pending blocks, frees every cached one

  // The class (bytes of device memory) serving a request of nbytes > 0.
  static size_t block_size(size_t nbytes);
  // The block holding `ptr` (as allocate() returned it) is also used by work queued on
  // `stream`: once freed, it is reused only after that work has run. No-op for the block's
  // own stream; ValueError for a pointer this allocator did not hand out.
  void record_stream(void* ptr, DeviceMemory::StreamId stream);
  // Waits for pending blocks and frees every cached block.
  void empty_cache() override;

 private:
  void* raw_allocate(size_t nbytes) override;
  void raw_deallocate(void* ptr, size_t nbytes) noexcept override;
  int64_t cached_bytes() const override;
  int64_t system_allocs() const override;
  std::string out_of_memory_note() const override;

  struct Block {
    size_t size = 0;
    DeviceMemory::StreamId stream = 0;            // where it was allocated
    std::vector<DeviceMemory::StreamId> also_on;  // record_stream's other streams
  };
  struct Pending {  // freed, waiting for markers on its other streams
    void* ptr;
    Block block;
    std::vector<DeviceMemory::Marker> markers;
  };
  using Key = std::pair<DeviceMemory::StreamId, size_t>;  // (stream, class)

  // With mutex_ held: moves pending blocks whose markers are done to the free lists.
  void collect_pending();
  // With mutex_ held: waits for every pending block, then frees every cached block.
  void free_cached();

  std::unique_ptr<DeviceMemory> memory_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<Key, std::vector<void*>> free_;  // most recently freed last
  std::vector<Pending> pending_;
  size_t cached_total_ = 0;  // free and pending bytes
  int64_t system_allocs_ = 0;
};

}  // namespace dtr
