#include "kernels/trace.h"

#include <chrono>
#include <limits>
#include <memory>
#include <mutex>

namespace dtr::trace {
namespace internal {
std::atomic<bool> g_enabled{false};
}
namespace {

// A buffer's run after stop() took its events: spans still open there end unrecorded.
constexpr uint64_t kCollected = std::numeric_limits<uint64_t>::max();

struct Buffer {
  std::mutex mu;
  uint32_t thread = 0;
  uint64_t run = kCollected;  // the run its events belong to
  std::vector<Event> events;
  int32_t open = -1;  // the innermost open span
};

std::mutex g_registry_mu;
std::vector<std::shared_ptr<Buffer>> g_buffers;  // every thread's that ever recorded
std::atomic<uint64_t> g_run{0};
thread_local std::shared_ptr<Buffer> t_buffer;
thread_local const char* t_region = "";

Buffer& thread_buffer() {
  if (!t_buffer) {
    std::lock_guard lock(g_registry_mu);
    t_buffer = std::make_shared<Buffer>();
    t_buffer->thread = static_cast<uint32_t>(g_buffers.size());
    g_buffers.push_back(t_buffer);
  }
  return *t_buffer;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string_view category_name(Category c) {
  switch (c) {
    case Category::kKernel: return "kernel";
    case Category::kAutograd: return "autograd";
    case Category::kOptimizer: return "optimizer";
  }
  return "unknown";
}

void start() {
  g_run.fetch_add(1, std::memory_order_acq_rel);
  internal::g_enabled.store(true, std::memory_order_release);
}

std::vector<ThreadEvents> stop() {
  internal::g_enabled.store(false, std::memory_order_release);
  const uint64_t run = g_run.load(std::memory_order_acquire);
  std::vector<ThreadEvents> out;
  std::lock_guard registry(g_registry_mu);
  for (const std::shared_ptr<Buffer>& b : g_buffers) {
    std::lock_guard lock(b->mu);
    if (b->run == run && !b->events.empty()) out.push_back({b->thread, std::move(b->events)});
    b->events.clear();
    b->run = kCollected;
    b->open = -1;
  }
  return out;
}

void Span::begin(std::string_view name, Category category) {
  Buffer& b = thread_buffer();
  const uint64_t run = g_run.load(std::memory_order_acquire);
  std::lock_guard lock(b.mu);
  if (b.run != run) {  // the first span of this run on this thread
    b.events.clear();
    b.run = run;
    b.open = -1;
  }
  b.events.push_back({std::string(name), category, t_region, now_ns(), 0, b.open});
  index_ = b.open = static_cast<int32_t>(b.events.size() - 1);
  run_ = run;
}

void Span::end() {
  Buffer& b = *t_buffer;
  std::lock_guard lock(b.mu);
  if (b.run != run_) return;  // collected or restarted meanwhile
  Event& e = b.events[static_cast<size_t>(index_)];
  e.end_ns = now_ns();
  b.open = e.parent;
}

const char* current_region() { return t_region; }

Region::Region(const char* name) : previous_(t_region) { t_region = name; }
Region::~Region() { t_region = previous_; }

}  // namespace dtr::trace
