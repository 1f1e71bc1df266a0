// The learning rates the train program trains at, pinned: for each --lr-schedule and a few
// --steps/--warmup pairs (warm-up then decay, no warm-up, --steps equal to --warmup and
// below it, a single step), the lr that metrics.jsonl shows at every step, as train's own
// formula gave them before optim::WarmupDecayLR replaced it (--lr 0.01).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "nn/parameter.h"
#include "optim/sgd.h"
#include "tools/train/lr_schedule.h"

namespace dtr::train {
namespace {

struct Case {
  optim::LRDecay schedule;
  int64_t steps, warmup;
  std::vector<double> lrs;  // steps 1, 2, ...
};

TEST_CASE("train's lr at every step, for each --lr-schedule, --warmup and --steps", "[train][lr]") {
  const std::vector<Case> cases = {
      {optim::LRDecay::kCosine,
       6,
       2,
       {0.003333333333333333, 0.006666666666666666, 0.01, 0.008681980515339464, 0.0055000000000000005,
        0.0023180194846605367}},
      {optim::LRDecay::kCosine, 4, 4, {0.002, 0.004, 0.006, 0.008}},
      {optim::LRDecay::kCosine,
       5,
       0,
       {0.01, 0.009140576474687264, 0.006890576474687263, 0.004109423525312737, 0.001859423525312737}},
      {optim::LRDecay::kCosine, 3, 5, {0.0016666666666666666, 0.003333333333333333, 0.005}},
      {optim::LRDecay::kCosine, 1, 0, {0.01}},
      {optim::LRDecay::kLinear, 6, 2, {0.003333333333333333, 0.006666666666666666, 0.01, 0.0075, 0.005, 0.0025}},
      {optim::LRDecay::kLinear, 4, 4, {0.002, 0.004, 0.006, 0.008}},
      {optim::LRDecay::kLinear, 5, 0, {0.01, 0.008, 0.006, 0.004, 0.0019999999999999996}},
      {optim::LRDecay::kLinear, 3, 5, {0.0016666666666666666, 0.003333333333333333, 0.005}},
      {optim::LRDecay::kLinear, 1, 0, {0.01}},
      {optim::LRDecay::kConstant, 6, 2, {0.003333333333333333, 0.006666666666666666, 0.01, 0.01, 0.01, 0.01}},
      {optim::LRDecay::kConstant, 4, 4, {0.002, 0.004, 0.006, 0.008}},
      {optim::LRDecay::kConstant, 5, 0, {0.01, 0.01, 0.01, 0.01, 0.01}},
      {optim::LRDecay::kConstant, 3, 5, {0.0016666666666666666, 0.003333333333333333, 0.005}},
      {optim::LRDecay::kConstant, 1, 0, {0.01}},
  };
  for (const Case& c : cases) {
    INFO("--lr-schedule " << flag_value(c.schedule) << " --steps " << c.steps << " --warmup " << c.warmup);
    REQUIRE(c.lrs.size() == static_cast<size_t>(c.steps));
    TrainConfig config;
    config.lr_schedule = c.schedule;
    config.steps = c.steps;
    config.warmup = c.warmup;
    config.lr = 0.01;
    DTensor p(Tensor::empty({1}, kFloat32), DTensorSpec(single_rank_mesh(), {Replicate()}, {1}, kFloat32));
    p.requires_grad_();
    optim::SGD opt({{.params = {&p}, .lr = config.lr}});
    optim::WarmupDecayLR schedule = make_lr_schedule(opt, config);
    for (int64_t step = 1; step <= c.steps; ++step) {
      INFO("step " << step);
      const double lr = opt.param_groups()[0].lr, expected = c.lrs[static_cast<size_t>(step - 1)];
      // Bit for bit, but where a cosine decays: its last bit depends on the libm and on
      // whether the compiler fuses the multiply-add (as -march=native does on x86-64).
      if (c.schedule == optim::LRDecay::kCosine && step > c.warmup + 1) {
        CHECK(lr == Approx(expected).epsilon(1e-15));
      } else {
        CHECK(lr == expected);
      }
      schedule.step();
    }
  }
}

}  // namespace
}  // namespace dtr::train
