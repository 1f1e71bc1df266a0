// The autograd engine on one rank: gradients accumulate (+=), no_grad records nothing,
// detach cuts the graph, retain_graph keeps saved tensors, hooks see and replace
// gradients, post-accumulate hooks fire on leaves, saved tensors are freed as backward
// goes (memory falls), and errors name what went wrong.
#include <catch2/catch.hpp>

#include "dtensor/autograd.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/reduce.h"
#include "kernels/allocator.h"
#include "kernels/fill.h"
#include "kernels/trace.h"
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
