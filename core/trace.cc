#include "core/trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace dtr::trace {
namespace internal {
std::atomic<Categories> g_recording{0};
}
namespace {

// A buffer's run after stop() took its events: spans still open there end unrecorded.
constexpr uint64_t kCollected = std::numeric_limits<uint64_t>::max();

struct Buffer {
  std::mutex mu;
  uint32_t thread = 0;
  std::string name;
  uint64_t run = kCollected;  // the run its events belong to
  std::vector<Event> events;
  int32_t open = -1;  // the innermost open span
};

std::mutex g_registry_mu;
std::vector<std::shared_ptr<Buffer>> g_buffers;                       // every thread's and lane's that ever recorded
std::map<std::string, std::shared_ptr<Buffer>, std::less<>> g_lanes;  // by name; also in g_buffers
std::vector<std::function<void()>> g_stop_hooks;
std::atomic<uint64_t> g_run{0};
thread_local std::shared_ptr<Buffer> t_buffer;
thread_local const char* t_region = "";
thread_local const char* t_comm_phase = "";
thread_local std::string t_comm_owner;

Buffer& thread_buffer() {
  if (!t_buffer) {
    std::lock_guard lock(g_registry_mu);
    t_buffer = std::make_shared<Buffer>();
    t_buffer->thread = static_cast<uint32_t>(g_buffers.size());
    t_buffer->name = fmt::format("thread {}", t_buffer->thread);
    g_buffers.push_back(t_buffer);
  }
  return *t_buffer;
}

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void set_thread_name(std::string_view name) {
  Buffer& b = thread_buffer();
  std::lock_guard lock(b.mu);
  b.name = std::string(name);
}

namespace {

// Every category's name, by id: core's first (in the order of their ids), then the layers'.
struct CategoryNames {
  std::mutex mu;
  std::vector<std::string_view> names{"kernel", "op", "redistribute", "autograd", "issue", "collective", "wait"};
};

// Made on first use: layers define their categories while their files' statics initialise.
CategoryNames& category_names() {
  static CategoryNames names;
  return names;
}

}  // namespace

Category define_category(std::string_view name) {
  CategoryNames& c = category_names();
  std::lock_guard lock(c.mu);
  const auto found = std::find(c.names.begin(), c.names.end(), name);
  if (found != c.names.end()) return Category(static_cast<uint8_t>(found - c.names.begin()));
  DTR_INTERNAL_ASSERT(c.names.size() < kMaxCategories,
                      "trace::define_category(\"{}\"): all {} categories are taken ({})", name, kMaxCategories,
                      fmt::join(c.names, ", "));
  c.names.push_back(name);
  return Category(static_cast<uint8_t>(c.names.size() - 1));
}

std::string_view category_name(Category c) {
  CategoryNames& names = category_names();
  std::lock_guard lock(names.mu);
  return c.id() < names.names.size() ? names.names[c.id()] : "unknown";
}

void start(Categories categories) {
  g_run.fetch_add(1, std::memory_order_acq_rel);
  internal::g_recording.store(categories, std::memory_order_release);
}

std::vector<ThreadEvents> stop() {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard registry(g_registry_mu);
    hooks = g_stop_hooks;
  }
  for (const std::function<void()>& hook : hooks) hook();
  internal::g_recording.store(0, std::memory_order_release);
  const uint64_t run = g_run.load(std::memory_order_acquire);
  std::vector<ThreadEvents> out;
  std::lock_guard registry(g_registry_mu);
  for (const std::shared_ptr<Buffer>& b : g_buffers) {
    std::lock_guard lock(b->mu);
    if (b->run == run && !b->events.empty()) out.push_back({b->thread, b->name, std::move(b->events)});
    b->events.clear();
    b->run = kCollected;
    b->open = -1;
  }
  return out;
}

void record_event(std::string_view lane, Event event) {
  if (!enabled(event.category)) return;
  std::shared_ptr<Buffer> b;
  {
    std::lock_guard registry(g_registry_mu);
    auto it = g_lanes.find(lane);
    if (it == g_lanes.end()) {
      auto fresh = std::make_shared<Buffer>();
      fresh->thread = static_cast<uint32_t>(g_buffers.size());
      fresh->name = std::string(lane);
      g_buffers.push_back(fresh);
      it = g_lanes.emplace(std::string(lane), std::move(fresh)).first;
    }
    b = it->second;
  }
  const uint64_t run = g_run.load(std::memory_order_acquire);
  std::lock_guard lock(b->mu);
  if (b->run != run) {
    b->events.clear();
    b->run = run;
  }
  event.parent = -1;
  b->events.push_back(std::move(event));
}

void add_stop_hook(std::function<void()> hook) {
  std::lock_guard registry(g_registry_mu);
  g_stop_hooks.push_back(std::move(hook));
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
  b.events.push_back({std::string(name), category, t_region, now_ns(), 0, b.open, {}});
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

void Span::add(std::string_view key, std::string json) {
  Buffer& b = *t_buffer;
  std::lock_guard lock(b.mu);
  if (b.run != run_) return;
  b.events[static_cast<size_t>(index_)].args.push_back({std::string(key), std::move(json)});
}

void Span::arg(std::string_view key, int64_t value) {
  if (active()) add(key, std::to_string(value));
}

void Span::arg(std::string_view key, double value) {
  if (active()) add(key, nlohmann::json(value).dump());
}

void Span::arg(std::string_view key, std::string_view value) {
  if (active()) add(key, nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

CommPhase::CommPhase(const char* phase, std::string_view owner) : active_(enabled(Category::kIssue)) {
  if (!active_) return;
  previous_phase_ = t_comm_phase;
  previous_owner_ = std::exchange(t_comm_owner, std::string(owner));
  t_comm_phase = phase;
}

CommPhase::~CommPhase() {
  if (!active_) return;
  t_comm_phase = previous_phase_;
  t_comm_owner = std::move(previous_owner_);
}

const char* current_comm_phase() { return t_comm_phase; }
const std::string& current_comm_owner() { return t_comm_owner; }

const char* current_region() { return t_region; }

Region::Region(const char* name) : previous_(t_region) { t_region = name; }
Region::~Region() { t_region = previous_; }

}  // namespace dtr::trace
