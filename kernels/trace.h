// Tracing: spans of work (a kernel, an autograd node, an optimizer step) recorded per thread
// while tracing is on, and regions that attribute spans to a part of the model.
//
// Off (the default) a span costs one relaxed atomic load. On, a span appends one event to its
// thread's buffer (a lock nobody else takes while recording, and the name copied). Spans on
// one thread nest: each event names its enclosing span. A region is a label the thread
// carries whether or not tracing is on; autograd records the region an op ran in with its
// node and re-enters it when the node runs backward, so a model part's backward is
// attributed to it too (train_step_bench's split by op family reads regions this way).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtr::trace {

// What a span times.
enum class Category : uint8_t { kKernel, kAutograd, kOptimizer };

std::string_view category_name(Category c);

struct Event {
  std::string name;
  Category category = Category::kKernel;
  const char* region = "";  // the thread's region when the span began ("" outside any)
  int64_t begin_ns = 0;     // steady clock
  int64_t end_ns = 0;       // 0 while the span is open
  int32_t parent = -1;      // the enclosing span's index in the thread's events; -1 at top level
};

// One thread's events of a tracing run, in the order their spans began.
struct ThreadEvents {
  uint32_t thread = 0;  // 0, 1, ... in the order threads first recorded
  std::vector<Event> events;
};

namespace internal {
extern std::atomic<bool> g_enabled;
}

inline bool enabled() { return internal::g_enabled.load(std::memory_order_relaxed); }

// Starts a tracing run: spans begun from now on are recorded (an earlier run's are dropped).
void start();

// Ends the run and returns every thread's events. Call it when no span is open on another
// thread (between steps); one still open there keeps end_ns 0.
std::vector<ThreadEvents> stop();

// Times its scope as one event while tracing is on.
class Span {
 public:
  Span(std::string_view name, Category category) {
    if (enabled()) begin(name, category);
  }
  ~Span() {
    if (index_ >= 0) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  void begin(std::string_view name, Category category);
  void end();
  int32_t index_ = -1;
  uint64_t run_ = 0;
};

// The calling thread's region ("" outside any).
const char* current_region();

// Enters region `name` (a string that outlives every trace: a literal) for its scope.
class Region {
 public:
  explicit Region(const char* name);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

 private:
  const char* previous_;
};

}  // namespace dtr::trace
