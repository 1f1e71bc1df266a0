// Tracing: spans of work (a kernel, a DTensor op, an autograd node, a collective and the time
// a caller waited for it, and what the layers above declare: an FSDP event, an optimizer
// step) recorded per thread while
// tracing is on, and regions that attribute spans to a part of the model.
//
// Off (the default) a span costs one relaxed atomic load. On, a span appends one event to its
// thread's buffer (a lock nobody else takes while recording, and the name copied); arguments
// are added to the open span as JSON values. Spans on one thread nest: each event names its
// enclosing span. Threads name their lanes (set_thread_name). A region is a label the thread
// carries whether or not tracing is on; autograd records the region an op ran in with its
// node and re-enters it when the node runs backward, so a model part's backward is
// attributed to it too (train_step_bench's split by op family reads regions this way).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dtr::trace {

// What a span times: an id, the span's bit in a Categories mask, and a name that traces show.
// Core declares the categories of the layers below a model: kernels, DTensor ops and their
// redistributes, autograd, and collectives. A layer above declares the words it owns with
// define_category: nn's "fsdp" (fully_shard.h), optim's "optimizer" (optimizer.h), the
// trace tools' "step" (comm_accounting.h), the train program's "data".
class Category {
 public:
  static const Category kKernel;        // a CPU or CUDA kernel
  static const Category kOp;            // a DTensor op (its sharding, redistributes and local kernels)
  static const Category kRedistribute;  // one redistribute, and each step of its plan
  static const Category kAutograd;      // an autograd node in backward
  static const Category kIssue;         // a caller issuing a collective (args: kind, group, seq, bytes)
  static const Category kCollective;    // a collective running: packing, the transfer, unpacking (same args)
  static const Category kWait;          // a caller waiting for a collective (args: group, seq)

  constexpr uint8_t id() const { return id_; }
  friend constexpr bool operator==(Category, Category) = default;

 private:
  friend Category define_category(std::string_view name);
  constexpr explicit Category(uint8_t id) : id_(id) {}
  uint8_t id_;
};

inline constexpr Category Category::kKernel{0};
inline constexpr Category Category::kOp{1};
inline constexpr Category Category::kRedistribute{2};
inline constexpr Category Category::kAutograd{3};
inline constexpr Category Category::kIssue{4};
inline constexpr Category Category::kCollective{5};
inline constexpr Category Category::kWait{6};

// The category named `name` ("fsdp"), made on its first call: a layer's own, declared once
// beside the code that records it (`inline const Category kFsdpCategory =
// define_category("fsdp");`). `name` must outlive the program (a literal). InternalError
// past kMaxCategories.
Category define_category(std::string_view name);
inline constexpr int kMaxCategories = 32;

// "kernel", "fsdp": the name traces show.
std::string_view category_name(Category c);

// One argument of an event: its key and its value as JSON text (`12`, `"dp"`, `[4, 8]`).
struct Arg {
  std::string key;
  std::string json;
};

struct Event {
  std::string name;
  Category category = Category::kKernel;
  const char* region = "";  // the thread's region when the span began ("" outside any)
  int64_t begin_ns = 0;     // now_ns()
  int64_t end_ns = 0;       // 0 while the span is open
  int32_t parent = -1;      // the enclosing span's index in the thread's events; -1 at top level
  std::vector<Arg> args;
};

// One thread's events of a tracing run, in the order their spans began.
struct ThreadEvents {
  uint32_t thread = 0;  // 0, 1, ... in the order threads first recorded
  std::string name;     // set_thread_name's, or "thread <thread>"
  std::vector<Event> events;
};

// The clock of every event: CLOCK_MONOTONIC (steady_clock) in ns.
int64_t now_ns();

// Names the calling thread's lane in traces ("compute", "comm default_pg"); the name holds
// for every later run. Costs a lock; call it once per thread.
void set_thread_name(std::string_view name);

// A set of categories, one bit each.
using Categories = uint32_t;
static_assert(kMaxCategories <= 8 * sizeof(Categories));
constexpr Categories bit(Category c) { return Categories{1} << c.id(); }
inline constexpr Categories kAllCategories = ~Categories{0};

namespace internal {
extern std::atomic<Categories> g_recording;
}

// Whether a run is recording spans of `c` (of any category).
inline bool enabled(Category c) { return (internal::g_recording.load(std::memory_order_relaxed) & bit(c)) != 0; }
inline bool enabled() { return internal::g_recording.load(std::memory_order_relaxed) != 0; }

// Starts a tracing run recording spans of `categories` begun from now on (an earlier run's
// are dropped); spans of other categories cost what they cost while tracing is off.
void start(Categories categories = kAllCategories);

// Ends the run and returns every thread's events (and every lane's, below). First it runs
// the stop hooks. Call it when no span is open on another thread (between steps); one still
// open there keeps end_ns 0.
std::vector<ThreadEvents> stop();

// Appends a finished top-level event, with times already in now_ns()'s clock, to `lane`: a
// timeline that is no thread, such as a device stream's (cuda::DeviceSpan). A lane lists
// with the threads in stop()'s result, under its name. Dropped when no run is recording.
void record_event(std::string_view lane, Event event);

// Runs `hook` at the start of every later stop(), while the run still records: those who
// time work elsewhere (device streams) turn it into events there. Hooks never go away.
void add_stop_hook(std::function<void()> hook);

// Times its scope as one event while tracing is on.
class Span {
 public:
  Span(std::string_view name, Category category) {
    if (enabled(category)) begin(name, category);
  }
  ~Span() {
    if (index_ >= 0) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  // Whether this span records (tracing was on when it began): build costly arguments only then.
  bool active() const { return index_ >= 0; }
  // Adds an argument to the event (nothing when inactive).
  void arg(std::string_view key, int64_t value);
  void arg(std::string_view key, double value);
  void arg(std::string_view key, std::string_view value);
  void arg(std::string_view key, const char* value) { arg(key, std::string_view(value)); }

 private:
  void begin(std::string_view name, Category category);
  void end();
  void add(std::string_view key, std::string json);
  int32_t index_ = -1;
  uint64_t run_ = 0;
};

// What the collectives a thread issues in a scope are for: a phase ("forward all_gather",
// "reduce_scatter") and an owner (the FSDP group's module, "layers.0"). ProcessGroup records
// both with each collective it issues while tracing is on; off, a CommPhase does nothing.
class CommPhase {
 public:
  CommPhase(const char* phase, std::string_view owner);  // phase: a literal
  ~CommPhase();
  CommPhase(const CommPhase&) = delete;
  CommPhase& operator=(const CommPhase&) = delete;

 private:
  bool active_ = false;
  const char* previous_phase_ = "";
  std::string previous_owner_;
};

// The calling thread's CommPhase ("" and "" outside any, or while tracing is off).
const char* current_comm_phase();
const std::string& current_comm_owner();

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
