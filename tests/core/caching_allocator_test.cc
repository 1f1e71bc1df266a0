// CachingAllocator's policy on host memory standing in for a device's (HostMemory below:
// a capacity, streams as numbers, markers done once the test says a stream's queued work
// has run): size classes, reuse on the freeing stream only, reuse after record_stream's
// streams are done, no new allocations once a repeated step is warm, the retry that frees
// the cache and the out-of-memory message, statistics. The same class allocates CUDA
// memory through kernels/cuda/cuda_device_memory (tests/kernels/cuda_test, tagged gpu).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/caching_allocator.h"
#include "core/error.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

// What the test reads after the allocator (which owns the HostMemory) is gone.
struct Counters {
  int64_t mallocs = 0, frees = 0, markers = 0, released = 0, waits = 0;
  size_t used = 0;  // bytes malloc'd and not freed
};

class HostMemory final : public DeviceMemory {
 public:
  HostMemory(size_t capacity, std::shared_ptr<Counters> counters) : capacity_(capacity), c_(std::move(counters)) {}

  void* malloc(size_t nbytes) override {
    if (c_->used + nbytes > capacity_) return nullptr;
    void* p = std::malloc(nbytes);
    sizes_[p] = nbytes;
    c_->used += nbytes;
    ++c_->mallocs;
    return p;
  }
  void free(void* ptr) noexcept override {
    c_->used -= sizes_.at(ptr);
    sizes_.erase(ptr);
    std::free(ptr);
    ++c_->frees;
  }
  StreamId current_stream() override { return current; }
  Marker record(StreamId stream) override {
    marks_.push_back({stream, queued_[stream]});
    ++c_->markers;
    return marks_.size();  // 1-based: a marker is never 0
  }
  bool done(Marker marker) override {
    const auto& [stream, position] = marks_.at(marker - 1);
    return finished_[stream] >= position;
  }
  void wait(Marker marker) noexcept override {
    const auto& [stream, position] = marks_.at(marker - 1);
    finished_[stream] = std::max(finished_[stream], position);
    ++c_->waits;
  }
  void release(Marker) noexcept override { ++c_->released; }

  // A kernel queued on `stream`; all of the stream's queued kernels have run.
  void enqueue(StreamId stream) { ++queued_[stream]; }
  void finish(StreamId stream) { finished_[stream] = queued_[stream]; }

  StreamId current = 1;

 private:
  size_t capacity_;
  std::shared_ptr<Counters> c_;
  std::map<void*, size_t> sizes_;
  std::map<StreamId, int64_t> queued_, finished_;
  std::vector<std::pair<StreamId, int64_t>> marks_;
};

struct Fixture {
  explicit Fixture(size_t capacity = 1 << 30) : counters(std::make_shared<Counters>()) {
    auto m = std::make_unique<HostMemory>(capacity, counters);
    memory = m.get();
    allocator = std::make_unique<CachingAllocator>(Device(kCUDA, 0), std::move(m));
  }
  std::shared_ptr<Counters> counters;
  HostMemory* memory;  // owned by allocator
  std::unique_ptr<CachingAllocator> allocator;
};

TEST_CASE("size classes: 512 B steps below 1 MiB, then four per power of two", "[caching_allocator]") {
  CHECK(CachingAllocator::block_size(1) == 512);
  CHECK(CachingAllocator::block_size(512) == 512);
  CHECK(CachingAllocator::block_size(513) == 1024);
  CHECK(CachingAllocator::block_size(kMiB - 1) == kMiB);
  CHECK(CachingAllocator::block_size(kMiB) == kMiB);
  CHECK(CachingAllocator::block_size(kMiB + 1) == kMiB + 256 * kKiB);
  CHECK(CachingAllocator::block_size(3 * kMiB) == 3 * kMiB);
  CHECK(CachingAllocator::block_size(3 * kMiB + 1) == 3 * kMiB + 512 * kKiB);
  CHECK(CachingAllocator::block_size(100 * kMiB) == 112 * kMiB);
  // Every class holds its request, wastes under a quarter of it from 1 MiB, and grows with it.
  size_t last = 0;
  for (size_t n = 1; n < (size_t{1} << 34); n = n * 5 / 4 + 1) {
    INFO(n);
    const size_t b = CachingAllocator::block_size(n);
    CHECK(b >= n);
    CHECK(b >= last);
    if (n >= kMiB) CHECK(static_cast<double>(b - n) < 0.25 * static_cast<double>(n));
    last = b;
  }
}

TEST_CASE("a freed block serves the next request of its class on its stream only", "[caching_allocator]") {
  Fixture f;
  void* a = f.allocator->allocate(1000);
  f.allocator->deallocate(a, 1000);
  CHECK(f.allocator->stats().bytes_cached == 1024);
  CHECK(f.allocator->allocate(900) == a);  // the same class, 1024 B
  CHECK(f.allocator->stats().bytes_cached == 0);
  CHECK(f.allocator->stats().system_allocs == 1);
  f.allocator->deallocate(a, 900);
  // Another stream gets a block of its own: its kernels are not ordered after the last user's.
  f.memory->current = 2;
  void* b = f.allocator->allocate(1000);
  CHECK(b != a);
  CHECK(f.allocator->stats().system_allocs == 2);
  // Another class too.
  f.memory->current = 1;
  void* c = f.allocator->allocate(2000);
  CHECK(c != a);
  CHECK(f.allocator->stats().system_allocs == 3);
  const MemoryStats s = f.allocator->stats();
  CHECK(s.bytes_in_use == 3000);  // as requested, not as rounded
  CHECK(s.bytes_cached == 1024);  // a, free on stream 1
  CHECK(s.live_allocs == 2);
  CHECK(s.total_allocs == 4);
  f.allocator->deallocate(b, 1000);
  f.allocator->deallocate(c, 2000);
  f.allocator.reset();  // frees every cached block
  CHECK(f.counters->frees == 3);
  CHECK(f.counters->used == 0);
}

TEST_CASE("a block other streams used is reused only after their work has run", "[caching_allocator]") {
  Fixture f;
  void* a = f.allocator->allocate(4096);
  f.allocator->record_stream(a, 1);  // its own stream: nothing to wait for
  f.allocator->record_stream(a, 2);
  f.allocator->record_stream(a, 2);  // recorded once
  f.memory->enqueue(2);              // a kernel on stream 2 still reads it
  f.allocator->deallocate(a, 4096);
  CHECK(f.counters->markers == 1);
  CHECK(f.allocator->stats().bytes_cached == 4096);  // pending counts as cached
  void* b = f.allocator->allocate(4096);
  CHECK(b != a);  // stream 2 has not run yet
  f.memory->finish(2);
  void* c = f.allocator->allocate(4096);
  CHECK(c == a);
  CHECK(f.counters->released == 1);
  CHECK(f.allocator->stats().system_allocs == 2);
  // Work on the other stream that has already run: reused at once.
  f.allocator->record_stream(c, 3);
  f.allocator->deallocate(c, 4096);
  CHECK(f.allocator->allocate(4096) == a);
  CHECK_THROWS_MATCHES(f.allocator->record_stream(reinterpret_cast<void*>(0x10), 2), ValueError,
                       testing::MessageContains("record_stream: cuda:0 holds no block at 0x10"));
}

TEST_CASE("empty_cache waits for pending blocks and frees every cached one", "[caching_allocator]") {
  Fixture f;
  void* a = f.allocator->allocate(kMiB);
  void* b = f.allocator->allocate(10);
  f.allocator->record_stream(a, 2);
  f.memory->enqueue(2);
  f.allocator->deallocate(a, kMiB);
  f.allocator->deallocate(b, 10);
  CHECK(f.allocator->stats().bytes_cached == static_cast<int64_t>(kMiB + 512));
  f.allocator->empty_cache();
  CHECK(f.counters->waits == 1);
  CHECK(f.counters->frees == 2);
  CHECK(f.counters->used == 0);
  CHECK(f.allocator->stats().bytes_cached == 0);
}

TEST_CASE("out of memory: the cache is freed and the request retried once, then a clear error", "[caching_allocator]") {
  Fixture f(8 * kKiB);
  void* a = f.allocator->allocate(4 * kKiB);
  f.allocator->deallocate(a, 4 * kKiB);       // cached: 4 KiB of the device's 8
  void* b = f.allocator->allocate(6 * kKiB);  // fits only once the cache is freed
  CHECK(b != nullptr);
  CHECK(f.counters->frees == 1);
  CHECK(f.allocator->stats().system_allocs == 2);
  CHECK_THROWS_MATCHES(f.allocator->allocate(3 * kKiB), OutOfMemoryError,
                       testing::MessageContains("out of memory on cuda:0: asked for 3072 bytes with 6144 in use and "
                                                "0 cached"));
  CHECK_THROWS_MATCHES(f.allocator->allocate(3 * kKiB), OutOfMemoryError,
                       testing::MessageContains("the cache was emptied and the request retried"));
  CHECK(f.allocator->stats().bytes_in_use == 6 * static_cast<int64_t>(kKiB));
  f.allocator->deallocate(b, 6 * kKiB);
}

TEST_CASE("a repeated step allocates from the system only in its first run", "[caching_allocator]") {
  Fixture f;
  std::mt19937 rng(7);
  std::vector<size_t> sizes;  // a step's requests: activations, gradients, scratch
  for (int i = 0; i < 40; ++i) sizes.push_back(std::uniform_int_distribution<size_t>(1, 8 * kMiB)(rng));
  int64_t after_first = 0;
  for (int step = 0; step < 5; ++step) {
    std::vector<void*> live;
    for (size_t i = 0; i < sizes.size(); ++i) {
      live.push_back(f.allocator->allocate(sizes[i]));
      if (i % 3 == 2) {  // some are freed within the step, as activations are in backward
        f.allocator->deallocate(live[i - 1], sizes[i - 1]);
        live[i - 1] = nullptr;
      }
    }
    for (size_t i = live.size(); i-- > 0;) {
      if (live[i] != nullptr) f.allocator->deallocate(live[i], sizes[i]);
    }
    if (step == 0) after_first = f.allocator->stats().system_allocs;
    INFO("step " << step);
    CHECK(f.allocator->stats().system_allocs == after_first);
    CHECK(f.allocator->stats().bytes_in_use == 0);
  }
  CHECK(after_first <= static_cast<int64_t>(sizes.size()));
}

}  // namespace
}  // namespace dtr
