// WarmupDecayLR against closed forms: linear warm-up, then cosine, linear or no decay to
// base_lr * min_ratio, including the edges the train program reaches (no warm-up, a run
// as long as its warm-up or shorter). A base lr of 1 makes each lr the factor itself.
// (PyTorch's values for WarmupCosineLR: optim_golden_test; train's own lrs, pinned:
// tests/train/lr_schedule_test.)
#include <catch2/catch.hpp>

#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "nn/parameter.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "tests/testing/test_util.h"

namespace dtr::optim {
namespace {

using testing::MessageContains;

DTensor leaf() {
  DTensor p(Tensor::empty({1}, kFloat32), DTensorSpec(single_rank_mesh(), {Replicate()}, {1}, kFloat32));
  p.requires_grad_();
  return p;
}

struct Case {
  int64_t warmup, total;
  LRDecay decay;
  double min_ratio;
  std::vector<double> lrs;  // epochs 0, 1, ...
};

const char* decay_name(LRDecay decay) {
  switch (decay) {
    case LRDecay::kCosine: return "cosine";
    case LRDecay::kLinear: return "linear";
    case LRDecay::kConstant: return "constant";
  }
  return "?";
}

TEST_CASE("WarmupDecayLR: warm-up, then cosine, linear or constant, at every epoch", "[optim][lr]") {
  const double r = std::sqrt(0.5);  // cos(pi / 4)
  const std::vector<Case> cases = {
      // Warm-up 2 over 6 epochs: the decay spans epochs 2..6 (progress 0, 1/4, 1/2, 3/4, 1).
      {2,
       6,
       LRDecay::kCosine,
       0.1,
       {1.0 / 3, 2.0 / 3, 1, 0.1 + 0.45 * (1 + r), 0.55, 0.1 + 0.45 * (1 - r), 0.1, 0.1, 0.1}},
      {2, 6, LRDecay::kLinear, 0.2, {1.0 / 3, 2.0 / 3, 1, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2}},
      {2, 6, LRDecay::kLinear, 0, {1.0 / 3, 2.0 / 3, 1, 0.75, 0.5, 0.25, 0, 0}},
      {2, 6, LRDecay::kConstant, 0.1, {1.0 / 3, 2.0 / 3, 1, 1, 1, 1, 1, 1}},
      // No warm-up: the decay starts at epoch 0.
      {0, 4, LRDecay::kCosine, 0, {1, 0.5 * (1 + r), 0.5, 0.5 * (1 - r), 0, 0}},
      {0, 4, LRDecay::kLinear, 0, {1, 0.75, 0.5, 0.25, 0, 0}},
      {0, 1, LRDecay::kCosine, 0.1, {1, 0.1, 0.1}},
      // As many epochs as warm-up: the run's epochs 0..3 warm up and never reach base_lr;
      // after it the decay spans one epoch.
      {4, 4, LRDecay::kCosine, 0.1, {0.2, 0.4, 0.6, 0.8, 1, 0.1, 0.1}},
      {4, 4, LRDecay::kLinear, 0, {0.2, 0.4, 0.6, 0.8, 1, 0, 0}},
      {4, 4, LRDecay::kConstant, 0, {0.2, 0.4, 0.6, 0.8, 1, 1}},
      // Fewer epochs than warm-up: the same, later.
      {5, 3, LRDecay::kCosine, 0.1, {1.0 / 6, 2.0 / 6, 3.0 / 6, 4.0 / 6, 5.0 / 6, 1, 0.1}},
      {5, 3, LRDecay::kLinear, 0, {1.0 / 6, 2.0 / 6, 3.0 / 6, 4.0 / 6, 5.0 / 6, 1, 0}},
  };
  for (const Case& c : cases) {
    INFO("warmup " << c.warmup << ", total " << c.total << ", " << decay_name(c.decay) << ", min_ratio "
                   << c.min_ratio);
    DTensor p = leaf();
    SGD sgd({{.params = {&p}, .lr = 1.0}});
    WarmupDecayLR schedule(sgd, c.warmup, c.total, c.decay, c.min_ratio);
    for (size_t e = 0; e < c.lrs.size(); ++e) {
      INFO("epoch " << e);
      CHECK(sgd.param_groups()[0].lr == Approx(c.lrs[e]).epsilon(1e-15).margin(1e-15));
      CHECK(schedule.lr_at(static_cast<int64_t>(e), 0) == sgd.param_groups()[0].lr);
      schedule.step();
    }
  }
}

TEST_CASE("WarmupDecayLR: the warm-up and the cosine's ends are exact", "[optim][lr]") {
  // (e + 1) / (w + 1) is one division; at progress 1, cos(pi) is -1 exactly: min_ratio.
  DTensor p = leaf();
  SGD sgd({{.params = {&p}, .lr = 1.0}});
  WarmupDecayLR schedule(sgd, 3, 5, LRDecay::kCosine, 0.25);
  // (Epoch 4, progress 1/2, is left out: cos(pi / 2) is not exactly 0.)
  const std::vector<std::pair<int64_t, double>> exact = {{0, 0.25}, {1, 0.5}, {2, 0.75}, {3, 1}, {5, 0.25}, {6, 0.25}};
  for (const auto& [epoch, lr] : exact) {
    INFO("epoch " << epoch);
    CHECK(schedule.lr_at(epoch, 0) == lr);
  }
}

TEST_CASE("WarmupCosineLR is WarmupDecayLR with a cosine, scaled by each group's lr", "[optim][lr]") {
  DTensor p = leaf(), q = leaf();
  SGD a({{.params = {&p}, .lr = 0.01}, {.params = {&q}, .lr = 0.5}});
  SGD b({{.params = {&p}, .lr = 0.01}, {.params = {&q}, .lr = 0.5}});
  WarmupCosineLR cosine(a, 3, 10, 0.1);
  WarmupDecayLR decay(b, 3, 10, LRDecay::kCosine, 0.1);
  for (int64_t e = 0; e < 12; ++e) {
    INFO("epoch " << e);
    CHECK(a.param_groups()[0].lr == b.param_groups()[0].lr);
    CHECK(a.param_groups()[1].lr == b.param_groups()[1].lr);
    CHECK(a.param_groups()[0].lr == 0.01 * decay.factor_at(e));
    CHECK(a.param_groups()[1].lr == 0.5 * decay.factor_at(e));
    cosine.step();
    decay.step();
  }
}

TEST_CASE("WarmupDecayLR rejects a negative warm-up, no steps and a ratio outside [0, 1]", "[optim][lr][errors]") {
  DTensor p = leaf();
  SGD sgd({{.params = {&p}, .lr = 1.0}});
  CHECK_THROWS_MATCHES(WarmupDecayLR(sgd, -1, 5, LRDecay::kLinear), ValueError,
                       MessageContains("warmup_steps -1 must be >= 0"));
  CHECK_THROWS_MATCHES(WarmupDecayLR(sgd, 2, 0, LRDecay::kLinear), ValueError, MessageContains("total_steps 0 >= 1"));
  CHECK_THROWS_MATCHES(WarmupCosineLR(sgd, 2, 5, 1.5), ValueError, MessageContains("min_ratio 1.5 in [0, 1]"));
  CHECK_NOTHROW(WarmupCosineLR(sgd, 5, 5));
  CHECK_NOTHROW(WarmupCosineLR(sgd, 6, 5));
}

}  // namespace
}  // namespace dtr::optim
