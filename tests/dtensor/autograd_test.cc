// The autograd engine on one rank: gradients accumulate (+=), no_grad records nothing,
// detach cuts the graph, retain_graph keeps saved tensors, hooks see and replace
// gradients and remove_hook removes one hook of one tensor (also of one output of a
// two-output node), post-accumulate hooks fire on leaves, saved tensors are freed as backward
// goes (memory falls; a linear layer's input before its input gradient is allocated), and
// errors name what went wrong.
#include <catch2/catch.hpp>

#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/trace.h"
#include "dtensor/autograd.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/reduce.h"
#include "kernels/fill.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::to_f64;

DTensor leaf(const Tensor& full) {
  const DeviceMesh mesh = single_rank_mesh();
  DTensor t(full, DTensorSpec(mesh, {Replicate()}, full.shape(), full.dtype()));
  t.requires_grad_();
  return t;
}

TEST_CASE("gradients of a shared input add up, and accumulate across backward calls", "[autograd]") {
  DTensor x = leaf(Tensor::from_vector<double>({1, 2, 3}));
  DTensor y = sum(add(mul(x, x), x));  // dy/dx = 2x + 1
  y.backward();
  CHECK(to_f64(x.grad().to_local()) == std::vector<double>{3, 5, 7});
  sum(mul(x, 2.0)).backward();  // += 2
  CHECK(to_f64(x.grad().to_local()) == std::vector<double>{5, 7, 9});
  CHECK(x.is_leaf());
  CHECK_FALSE(y.is_leaf());
  CHECK(y.grad_fn()->name() == "sum");
}

TEST_CASE("no_grad and detach record nothing", "[autograd]") {
  DTensor x = leaf(Tensor::from_vector<double>({1, 2}));
  {
    NoGradGuard no_grad;
    DTensor y = mul(x, x);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  DTensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(to_f64(d.to_local()) == to_f64(x.to_local()));
  DTensor y = sum(mul(d, x));  // only x's factor is differentiated
  y.backward();
  CHECK(to_f64(x.grad().to_local()) == std::vector<double>{1, 2});
  CHECK_FALSE(d.grad().defined());
}

TEST_CASE("retain_graph keeps saved tensors; without it a second backward is an error", "[autograd]") {
  DTensor x = leaf(Tensor::from_vector<double>({3}));
  DTensor y = sum(mul(x, x));
  y.backward(DTensor(), RetainGraph::kYes);
  y.backward();
  CHECK(to_f64(x.grad().to_local()) == std::vector<double>{12});
  CHECK_THROWS_AS(y.backward(), ValueError);
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("RetainGraph::kYes"));
}

TEST_CASE("tensor hooks see and may replace a gradient; post-accumulate hooks fire on leaves", "[autograd]") {
  DTensor x = leaf(Tensor::from_vector<double>({1, 1}));
  DTensor h = mul(x, 3.0);
  std::vector<double> seen;
  h.register_hook([&](const DTensor& g) {
    seen = to_f64(g.to_local());
    return mul(g, 10.0);  // replaces the gradient flowing on
  });
  int accumulated = 0;
  x.register_post_accumulate_grad_hook([&](const DTensor& p) {
    ++accumulated;
    CHECK(p.grad().defined());
  });
  sum(h).backward();
  CHECK(seen == std::vector<double>{1, 1});
  CHECK(to_f64(x.grad().to_local()) == std::vector<double>{30, 30});
  CHECK(accumulated == 1);
}

TEST_CASE("remove_hook: a removed hook is not called, the tensor's others still are; a second removal does nothing",
          "[autograd][hooks]") {
  for (const bool on_leaf : {false, true}) {
    INFO((on_leaf ? "a leaf's hooks (run by its accumulator)" : "a non-leaf's hooks (run by its node)"));
    DTensor x = leaf(Tensor::from_vector<double>({1, 2}));
    DTensor h = on_leaf ? x : mul(x, 3.0);
    std::vector<std::string> calls;
    const int a = h.register_hook([&](const DTensor&) {
      calls.push_back("a");
      return DTensor();
    });
    const int b = h.register_hook([&](const DTensor& g) {
      calls.push_back("b");
      return mul(g, 10.0);  // were it called, the gradient would be 10 times larger
    });
    const int c = h.register_hook([&](const DTensor&) {
      calls.push_back("c");
      return DTensor();
    });
    CHECK(a != b);
    CHECK(b != c);
    h.remove_hook(b);
    const DTensor loss = sum(h);
    loss.backward(DTensor(), RetainGraph::kYes);
    CHECK(calls == std::vector<std::string>{"a", "c"});
    const double slope = on_leaf ? 1.0 : 3.0;
    CHECK(to_f64(x.grad().to_local()) == std::vector<double>{slope, slope});
    // Removing it again, or an id this tensor never returned, changes nothing.
    h.remove_hook(b);
    h.remove_hook(c + 1000);
    calls.clear();
    loss.backward(DTensor(), RetainGraph::kYes);
    CHECK(calls == std::vector<std::string>{"a", "c"});
    // Removing the others leaves none.
    h.remove_hook(a);
    h.remove_hook(c);
    calls.clear();
    loss.backward();
    CHECK(calls.empty());
    CHECK(to_f64(x.grad().to_local()) == std::vector<double>{3 * slope, 3 * slope});
  }
}

TEST_CASE("hooks on two outputs of one node are each called, and each removed alone", "[autograd][hooks]") {
  DTensor x = leaf(Tensor::from_vector<double>({1, 2}));
  std::vector<DTensor> outputs;
  {
    const NoGradGuard values_only;
    outputs = {mul(x, 2.0), mul(x, 3.0)};
  }
  // One node, two outputs (as a coalesced redistribute makes): d(2x)/dx and d(3x)/dx.
  record("two_outputs", std::span<const DTensor>(&x, 1), std::span<DTensor>(outputs),
         [](const std::vector<DTensor>& g) { return std::vector<DTensor>{add(mul(g[0], 2.0), mul(g[1], 3.0))}; });
  REQUIRE(outputs[0].grad_fn() == outputs[1].grad_fn());
  int first = 0, second = 0;
  const int id0 = outputs[0].register_hook([&](const DTensor&) {
    ++first;
    return DTensor();
  });
  const int id1 = outputs[1].register_hook([&](const DTensor&) {
    ++second;
    return DTensor();
  });
  const DTensor loss = add(sum(outputs[0]), sum(outputs[1]));
  loss.backward(DTensor(), RetainGraph::kYes);
  CHECK(first == 1);
  CHECK(second == 1);
  CHECK(to_f64(x.grad().to_local()) == std::vector<double>{5, 5});
  // The other output's id removes nothing from this one.
  outputs[0].remove_hook(id1);
  loss.backward(DTensor(), RetainGraph::kYes);
  CHECK(first == 2);
  CHECK(second == 2);
  // Each output's own id removes its hook alone.
  outputs[1].remove_hook(id1);
  loss.backward(DTensor(), RetainGraph::kYes);
  CHECK(first == 3);
  CHECK(second == 2);
  outputs[0].remove_hook(id0);
  loss.backward();
  CHECK(first == 3);
  CHECK(second == 2);
}

TEST_CASE("saved tensors are released as backward runs: memory falls", "[autograd][memory]") {
  const int64_t n = 1 << 18;  // 2 MiB of float64 per intermediate
  DTensor x = leaf(full({n}, 1.5, kFloat64));
  DTensor y = x;
  for (int i = 0; i < 8; ++i) y = mul(y, y);  // each mul saves its inputs
  DTensor loss = sum(y);
  const int64_t after_forward = memory_stats(kCPU).bytes_in_use;
  int64_t at_first_node = -1;
  // x's hook runs last, after every mul node has run and dropped its saved inputs.
  x.register_hook([&](const DTensor& g) {
    at_first_node = memory_stats(kCPU).bytes_in_use;
    return g;
  });
  y = DTensor();  // the graph, not this handle, keeps the intermediates alive now
  loss.backward();
  INFO("bytes in use after forward " << after_forward << ", when the last node ran " << at_first_node);
  CHECK(at_first_node >= 0);
  CHECK(at_first_node < after_forward - 4 * n * 8);
}

TEST_CASE("a feed-forward's backward never holds the hidden activation beside its gradient", "[autograd][memory]") {
  // linear(relu(linear(x, w1)), w2): relu keeps a bit per element of h = relu(...), and the
  // second linear's backward lets go of h once its weight gradient has read it, before it
  // allocates h's gradient. Above what forward left, backward's peak stays below h's bytes
  // (holding both would add h's). With RetainGraph::kYes h is kept: a second backward
  // gives the gradients again.
  const int64_t tokens = 512, dim = 16, hidden = 256, h_bytes = tokens * hidden * 4;
  DTensor x = leaf(testing::global_tensor({tokens, dim}, 1).to(kFloat32));  // integers in [-8, 8]
  DTensor w1 = leaf(testing::global_tensor({hidden, dim}, 2).to(kFloat32));
  DTensor w2 = leaf(testing::global_tensor({dim, hidden}, 3).to(kFloat32));
  std::vector<double> first_grad;
  for (RetainGraph retain : {RetainGraph::kNo, RetainGraph::kYes}) {
    x.set_grad(DTensor());
    DTensor loss = sum(linear(relu(linear(x, w1)), w2));
    const int64_t after_forward = memory_stats(kCPU).bytes_in_use;
    reset_peak_memory_stats(kCPU);
    loss.backward(DTensor(), retain);
    const int64_t rise = memory_stats(kCPU).peak_bytes - after_forward;
    INFO("backward's peak above forward's bytes: " << rise << " (h: " << h_bytes << ")");
    if (retain == RetainGraph::kNo) {
      CHECK(rise < h_bytes);
      first_grad = to_f64(x.grad().to_local());
    } else {
      x.set_grad(DTensor());
      loss.backward();
      CHECK(to_f64(x.grad().to_local()) == first_grad);
    }
  }
}

TEST_CASE("run_backward lets go of the roots and gradients moved into it", "[autograd][memory]") {
  // A nested backward (activation checkpointing's recompute) seeds its roots with the only
  // handles to a block's output and incoming gradient: neither is held once the seeds are
  // delivered. When x's hook runs, what is in use beyond x is its gradient alone.
  const int64_t n = 1 << 18, bytes = n * 8;
  DTensor x = leaf(full({n}, 1.5, kFloat64));
  int64_t at_leaf = -1;
  x.register_hook([&](const DTensor& g) {
    at_leaf = memory_stats(kCPU).bytes_in_use;
    return g;
  });
  const int64_t before = memory_stats(kCPU).bytes_in_use;
  std::vector<DTensor> roots{mul(x, 2.0)};  // saves nothing
  std::vector<DTensor> gradients{DTensor(full({n}, 1.0, kFloat64), roots[0].spec())};
  run_backward(std::move(roots), std::move(gradients), RetainGraph::kNo);
  INFO("bytes in use above x's when its hook ran: " << at_leaf - before);
  CHECK(at_leaf >= before + bytes);
  CHECK(at_leaf < before + bytes + bytes / 4);
  CHECK(to_f64(x.grad().to_local()) == std::vector<double>(n, 2.0));
}

TEST_CASE("autograd errors name what went wrong", "[autograd][errors]") {
  DTensor x = leaf(Tensor::from_vector<double>({1, 2}));
  CHECK_THROWS_WITH(mul(x, 2.0).backward(), Catch::Contains("2 elements") && Catch::Contains("loss"));
  DTensor c(Tensor::from_vector<double>({1}, {1}), DTensorSpec(single_rank_mesh(), {Replicate()}, {1}, kFloat64));
  CHECK_THROWS_WITH(c.backward(), Catch::Contains("does not require grad"));
  DTensor y = mul(x, 2.0);
  CHECK_THROWS_WITH(y.requires_grad_(false), Catch::Contains("only leaves"));
}

TEST_CASE("backward runs each node in the trace region its op ran in, as an autograd span", "[autograd][trace]") {
  DTensor x = leaf(Tensor::from_vector<double>({1, 2, 3}));
  DTensor y;
  {
    const trace::Region region("square");
    y = mul(x, x);
  }
  const DTensor loss = sum(y);
  trace::start();
  loss.backward();
  std::vector<trace::ThreadEvents> threads = trace::stop();
  REQUIRE(threads.size() == 1);
  std::vector<std::pair<std::string, std::string>> nodes;  // name, region
  for (const trace::Event& e : threads[0].events) {
    if (e.category == trace::Category::kAutograd) nodes.emplace_back(e.name, e.region);
    // Kernels a node runs are nested in its span and carry its region.
    if (e.category == trace::Category::kKernel && e.parent >= 0) {
      CHECK(std::string_view(e.region) == threads[0].events[e.parent].region);
    }
  }
  // A leaf's accumulator serves every op using the leaf: it belongs to no region.
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"sum", ""}, {"mul", "square"}, {"AccumulateGrad", ""}};
  CHECK(nodes == expected);
  CHECK(to_f64(x.grad().to_local()) == std::vector<double>{2, 4, 6});
}

}  // namespace
}  // namespace dtr
