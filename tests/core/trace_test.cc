// The tracer: nothing is recorded while it is off, spans nest on a thread with their
// parents named, each thread's events come back apart, a new run drops the last one's,
// regions label the spans begun in them, and kernels time themselves as spans.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/trace.h"
#include "kernels/fill.h"
#include "kernels/matmul.h"

namespace dtr {
namespace {

using trace::Category;

// Categories of a layer above core, as such a layer declares them.
const Category kTestStep = trace::define_category("test step");
const Category kTestOptimizer = trace::define_category("test optimizer");

// The events of the only thread that recorded; fails the test when there are others.
std::vector<trace::Event> one_thread(std::vector<trace::ThreadEvents> threads) {
  REQUIRE(threads.size() == 1);
  return std::move(threads[0].events);
}

TEST_CASE("spans while tracing is off record nothing", "[trace]") {
  { const trace::Span s("before", Category::kKernel); }
  trace::start();
  const std::vector<trace::ThreadEvents> threads = trace::stop();
  CHECK(threads.empty());
  { const trace::Span s("after", Category::kKernel); }
  trace::start();
  CHECK(trace::stop().empty());
}

TEST_CASE("spans nest on a thread: each names its enclosing span, inside its times", "[trace]") {
  trace::start();
  {
    const trace::Span outer("outer", Category::kAutograd);
    { const trace::Span a("a", Category::kKernel); }
    {
      const trace::Span b("b", Category::kKernel);
      const trace::Span c("c", kTestOptimizer);
    }
  }
  { const trace::Span d("d", Category::kKernel); }
  const std::vector<trace::Event> e = one_thread(trace::stop());
  REQUIRE(e.size() == 5);
  CHECK(e[0].name == "outer");
  CHECK(e[0].category == Category::kAutograd);
  CHECK(e[1].name == "a");
  CHECK(e[2].name == "b");
  CHECK(e[3].name == "c");
  CHECK(e[3].category == kTestOptimizer);
  CHECK(e[4].name == "d");
  CHECK(e[0].parent == -1);
  CHECK(e[1].parent == 0);
  CHECK(e[2].parent == 0);
  CHECK(e[3].parent == 2);
  CHECK(e[4].parent == -1);
  for (const trace::Event& ev : e) {
    CHECK(ev.begin_ns <= ev.end_ns);
    if (ev.parent >= 0) {
      CHECK(e[ev.parent].begin_ns <= ev.begin_ns);
      CHECK(ev.end_ns <= e[ev.parent].end_ns);
    }
  }
  CHECK(e[1].end_ns <= e[2].begin_ns);
  CHECK(e[0].end_ns <= e[4].begin_ns);
}

TEST_CASE("each thread's events come back apart, and a new run drops the last one's", "[trace]") {
  trace::start();
  { const trace::Span s("stale", Category::kKernel); }
  trace::start();
  { const trace::Span s("main", Category::kKernel); }
  std::thread([] { const trace::Span s("worker", Category::kKernel); }).join();
  std::vector<trace::ThreadEvents> threads = trace::stop();
  REQUIRE(threads.size() == 2);
  CHECK(threads[0].thread != threads[1].thread);
  std::vector<std::string> names;
  for (const trace::ThreadEvents& t : threads) {
    REQUIRE(t.events.size() == 1);
    names.push_back(t.events[0].name);
  }
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"main", "worker"});
}

TEST_CASE("a span still open when the run stops ends unrecorded", "[trace]") {
  trace::start();
  std::vector<trace::ThreadEvents> threads;
  {
    const trace::Span s("open", Category::kKernel);
    threads = trace::stop();
  }
  const std::vector<trace::Event> e = one_thread(std::move(threads));
  REQUIRE(e.size() == 1);
  CHECK(e[0].end_ns == 0);
  trace::start();
  CHECK(trace::stop().empty());
}

TEST_CASE("regions nest, label the spans begun in them, and hold whether or not tracing is on", "[trace]") {
  CHECK(std::string_view(trace::current_region()).empty());
  trace::start();
  {
    const trace::Region attention("attention");
    CHECK(std::string_view(trace::current_region()) == "attention");
    { const trace::Span s("in", Category::kKernel); }
    {
      const trace::Region norm("norm");
      const trace::Span s("inner", Category::kKernel);
    }
    CHECK(std::string_view(trace::current_region()) == "attention");
  }
  { const trace::Span s("out", Category::kKernel); }
  const std::vector<trace::Event> e = one_thread(trace::stop());
  REQUIRE(e.size() == 3);
  CHECK(std::string_view(e[0].region) == "attention");
  CHECK(std::string_view(e[1].region) == "norm");
  CHECK(std::string_view(e[2].region).empty());
  CHECK(std::string_view(trace::current_region()).empty());
}

TEST_CASE("kernels time themselves as kernel spans named after their op", "[trace]") {
  Tensor a = Tensor::empty({4, 3}, kFloat32), b = Tensor::empty({3, 2}, kFloat32);
  fill_(a, 1.0);
  fill_(b, 2.0);
  trace::start();
  const Tensor c = matmul(a, b);
  fill_(a, 0.0);
  const std::vector<trace::Event> e = one_thread(trace::stop());
  REQUIRE(e.size() == 2);
  CHECK(e[0].name == "matmul");
  CHECK(e[1].name == "fill_");
  for (const trace::Event& ev : e) {
    CHECK(ev.category == Category::kKernel);
    CHECK(ev.parent == -1);
  }
  CHECK(c.data_ptr<float>()[0] == 6.0f);  // 3 x 1 x 2
}

TEST_CASE("arguments are JSON values on their span, and cost nothing on an inactive one", "[trace]") {
  {
    trace::Span off("off", Category::kKernel);
    CHECK_FALSE(off.active());
    off.arg("ignored", int64_t{1});
  }
  trace::start();
  {
    trace::Span s("op", Category::kOp);
    REQUIRE(s.active());
    s.arg("bytes", int64_t{4096});
    s.arg("ratio", 0.5);
    s.arg("group", "dp \"0\"");
  }
  const std::vector<trace::Event> e = one_thread(trace::stop());
  REQUIRE(e.size() == 1);
  REQUIRE(e[0].args.size() == 3);
  CHECK(e[0].args[0].key == "bytes");
  CHECK(e[0].args[0].json == "4096");
  CHECK(e[0].args[1].json == "0.5");
  CHECK(e[0].args[2].json == "\"dp \\\"0\\\"\"");  // a JSON string, escaped
}

TEST_CASE("a run records only the categories it was started with", "[trace]") {
  trace::start(trace::bit(kTestStep) | trace::bit(Category::kWait));
  CHECK(trace::enabled(Category::kWait));
  CHECK_FALSE(trace::enabled(Category::kKernel));
  CHECK_FALSE(trace::enabled(kTestOptimizer));
  {
    const trace::Span step("step", kTestStep);
    { const trace::Span k("matmul", Category::kKernel); }
    { const trace::Span w("wait", Category::kWait); }
  }
  const std::vector<trace::Event> e = one_thread(trace::stop());
  REQUIRE(e.size() == 2);
  CHECK(e[0].name == "step");
  CHECK(e[1].name == "wait");
  CHECK(e[1].parent == 0);
  CHECK_FALSE(trace::enabled());
}

TEST_CASE("a layer's categories take the next bits, by name, once each", "[trace]") {
  CHECK(trace::category_name(Category::kKernel) == "kernel");
  CHECK(trace::category_name(Category::kWait) == "wait");
  CHECK(trace::category_name(kTestStep) == "test step");
  CHECK(trace::category_name(kTestOptimizer) == "test optimizer");
  CHECK(kTestStep.id() > Category::kWait.id());
  CHECK(trace::bit(kTestStep) != trace::bit(kTestOptimizer));
  CHECK(trace::define_category("test step") == kTestStep);  // a name is one category
  CHECK(trace::define_category("wait") == Category::kWait);
}

TEST_CASE("past the last bit, define_category is a dtr bug naming the categories", "[trace]") {
  // Takes every free id: no test after it may define a category (the file's are defined above).
  static std::vector<std::string> names;  // a category's name outlives the program's categories
  for (int i = 0; i < trace::kMaxCategories; ++i) names.push_back(fmt::format("filler {}", i));
  size_t defined = 0;
  const auto define_all = [&] {
    for (; defined < names.size(); ++defined) trace::define_category(names[defined]);
  };
  CHECK_THROWS_AS(define_all(), InternalError);
  CHECK(defined == static_cast<size_t>(trace::kMaxCategories) - 9);  // core's seven and this file's two
  CHECK_THROWS_WITH(trace::define_category("one more"),
                    Catch::Contains("trace::define_category(\"one more\"): all 32 categories are taken (kernel, op,"));
  CHECK(trace::category_name(trace::define_category("test step")) == "test step");
}

TEST_CASE("threads name their lanes; the name holds for later runs", "[trace]") {
  trace::start();
  std::thread([] {
    trace::set_thread_name("comm test");
    const trace::Span s("run", Category::kCollective);
  }).join();
  { const trace::Span s("main", Category::kKernel); }
  std::vector<trace::ThreadEvents> threads = trace::stop();
  REQUIRE(threads.size() == 2);
  std::vector<std::string> names;
  for (const trace::ThreadEvents& t : threads) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  CHECK(names[0] == "comm test");
  CHECK(names[1].starts_with("thread "));
}

TEST_CASE("lanes take finished events with their own times; stop hooks record there first", "[trace]") {
  trace::Event early{.name = "dropped", .category = Category::kCollective, .begin_ns = 1, .end_ns = 2};
  trace::record_event("cuda:0 test lane", early);  // no run: dropped
  static std::atomic<int> hook_calls{0};
  static std::atomic<bool> hook_records{false};
  trace::add_stop_hook([] {
    ++hook_calls;
    if (hook_records) {
      trace::record_event("cuda:0 test lane",
                          {.name = "from the hook", .category = Category::kCollective, .begin_ns = 30, .end_ns = 40});
    }
  });
  hook_records = true;
  trace::start(trace::bit(Category::kCollective));
  const int calls = hook_calls;
  trace::record_event("cuda:0 test lane",
                      {.name = "all_gather", .category = Category::kCollective, .begin_ns = 10, .end_ns = 20});
  trace::record_event("cuda:0 test lane", {.name = "kernel", .category = Category::kKernel, .begin_ns = 1});
  std::vector<trace::ThreadEvents> lanes = trace::stop();
  hook_records = false;
  CHECK(hook_calls == calls + 1);
  REQUIRE(lanes.size() == 1);
  CHECK(lanes[0].name == "cuda:0 test lane");
  REQUIRE(lanes[0].events.size() == 2);  // the kernel category was not recording
  CHECK(lanes[0].events[0].name == "all_gather");
  CHECK(lanes[0].events[0].begin_ns == 10);
  CHECK(lanes[0].events[0].end_ns == 20);
  CHECK(lanes[0].events[0].parent == -1);
  CHECK(lanes[0].events[1].name == "from the hook");
  trace::start();
  CHECK(trace::stop().empty());  // a new run starts the lane afresh
}

TEST_CASE("CommPhase labels the thread while issue spans record, and nests", "[trace]") {
  {
    const trace::CommPhase off("forward all_gather", "layers.0");  // not recording: nothing
    CHECK(std::string_view(trace::current_comm_phase()).empty());
  }
  trace::start();
  {
    const trace::CommPhase outer("backward all_gather", "");
    CHECK(std::string_view(trace::current_comm_phase()) == "backward all_gather");
    {
      const trace::CommPhase inner(trace::current_comm_phase(), "layers.3");
      CHECK(trace::current_comm_owner() == "layers.3");
      CHECK(std::string_view(trace::current_comm_phase()) == "backward all_gather");
    }
    CHECK(trace::current_comm_owner().empty());
  }
  CHECK(std::string_view(trace::current_comm_phase()).empty());
  trace::stop();
}

}  // namespace
}  // namespace dtr
