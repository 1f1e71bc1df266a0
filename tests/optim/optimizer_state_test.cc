// Optimizer state dicts in PyTorch's layout: what they hold, and that an optimizer loaded
// from one continues exactly as the original would (bitwise); mismatched state is refused.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "nn/parameter.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/testing/test_util.h"

namespace dtr::optim {
namespace {

using testing::MessageContains;

DTensor leaf(const Tensor& t) {
  DTensor p(t.clone(), DTensorSpec(single_rank_mesh(), {Replicate()}, t.shape(), t.dtype()));
  p.requires_grad_();
  return p;
}

void set_grads(std::vector<DTensor>& params, uint64_t seed) {
  for (DTensor& p : params) {
    p.set_grad(leaf(testing::random_tensor(p.shape(), kFloat32, seed++)).detach());
  }
}

TEST_CASE("state_dict holds PyTorch's layout and a loaded optimizer continues bitwise", "[optim][state_dict]") {
  for (const bool adam : {true, false}) {
    INFO((adam ? "AdamW" : "SGD"));
    std::vector<DTensor> a = {leaf(testing::random_tensor({3, 2}, kFloat32, 1)),
                              leaf(testing::random_tensor({4}, kFloat32, 2))};
    std::vector<DTensor> b = {leaf(a[0].to_local()), leaf(a[1].to_local())};
    auto make = [&](std::vector<DTensor>& p, double lr) -> std::unique_ptr<Optimizer> {
      std::vector<ParamGroup> groups = {{.params = {&p[0]}, .lr = lr, .weight_decay = 0.1, .momentum = 0.9},
                                        {.params = {&p[1]}, .lr = lr / 2, .momentum = 0.9}};
      if (adam) return std::make_unique<AdamW>(std::move(groups));
      return std::make_unique<SGD>(std::move(groups));
    };
    std::unique_ptr<Optimizer> first = make(a, 0.01);
    for (uint64_t s = 0; s < 2; ++s) {
      set_grads(a, 10 * s);
      first->step();
    }
    const OptimizerState saved = first->state_dict();
    REQUIRE(saved.state.size() == 2);
    CHECK(saved.state.at(1).step == 2);
    CHECK(saved.state.at(0).tensors.count(adam ? "exp_avg_sq" : "momentum_buffer") == 1);
    CHECK(saved.param_groups.size() == 2);
    CHECK(saved.param_groups[1].params == std::vector<int64_t>{1});
    CHECK(saved.param_groups[1].hyper.lr == 0.005);
    // b holds a's values; an optimizer made with another lr takes the saved state and groups.
    b[0] = leaf(a[0].to_local());
    b[1] = leaf(a[1].to_local());
    std::unique_ptr<Optimizer> second = make(b, 1.0);
    second->load_state_dict(saved);
    CHECK(second->param_groups()[0].lr == 0.01);
    set_grads(a, 100);
    set_grads(b, 100);
    first->step();
    second->step();
    for (size_t k = 0; k < a.size(); ++k) CHECK(testing::to_f64(a[k].to_local()) == testing::to_f64(b[k].to_local()));
    CHECK(second->step_count(0) == 3);
  }
}

TEST_CASE("load_state_dict refuses state of another shape of optimizer", "[optim][state_dict][errors]") {
  DTensor p = leaf(testing::random_tensor({3}, kFloat32, 1));
  DTensor q = leaf(testing::random_tensor({2}, kFloat32, 2));
  AdamW one({{.params = {&p}}});
  p.set_grad(leaf(testing::random_tensor({3}, kFloat32, 3)).detach());
  one.step();
  AdamW two({{.params = {&p}}, {.params = {&q}}});
  CHECK_THROWS_MATCHES(two.load_state_dict(one.state_dict()), ValueError,
                       MessageContains("the saved state has 1 parameter groups, this optimizer 2"));
  AdamW other({{.params = {&q}}});
  CHECK_THROWS_MATCHES(other.load_state_dict(one.state_dict()), ValueError,
                       MessageContains("state 'exp_avg") && MessageContains("is [3] but the parameter is [2]"));
  AdamW amsgrad({{.params = {&q}, .amsgrad = true}});
  q.set_grad(leaf(testing::random_tensor({2}, kFloat32, 4)).detach());
  amsgrad.step();
  CHECK(amsgrad.state_dict().state.at(0).tensors.count("max_exp_avg_sq") == 1);
  SGD sgd({{.params = {&p}, .momentum = 0.9}});
  CHECK_THROWS_MATCHES(sgd.load_state_dict(one.state_dict()), ValueError,
                       MessageContains("has state 'exp_avg'; SGD keeps momentum_buffer"));
}

}  // namespace
}  // namespace dtr::optim
