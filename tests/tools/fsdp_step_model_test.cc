// The FSDP step model behind gpu_plan: its parameter and byte counts, its compute, and its
// overlap windows at the two extremes (a network so fast nothing shows, so slow nothing
// hides), one GPU, and its errors.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "tests/testing/test_util.h"
#include "tools/plan/fsdp_step_model.h"

namespace dtr::bench {
namespace {

using testing::MessageContains;

constexpr PlanModel kSmall{.layers = 2, .dim = 64, .vocab = 100, .seq_len = 16, .batch_per_gpu = 1};

CostModel network(int64_t gpus, double alpha_s, double beta) {
  CostModel m("test", "nccl");
  m.set(CollectiveKind::kAllGather, gpus, {.alpha_s = alpha_s, .beta_bytes_per_s = beta});
  m.set(CollectiveKind::kReduceScatter, gpus, {.alpha_s = alpha_s, .beta_bytes_per_s = beta});
  return m;
}

TEST_CASE("the step model counts parameters and each rank's collective bytes", "[bench]") {
  const StepPlan p = plan_fsdp_step(
      kSmall, {.gpus = 8, .peak_tflops = 1, .hbm_bytes_per_s = 1e12, .compute_efficiency = 1}, network(8, 0, 1e12));
  const int64_t block = 12 * 64 * 64 + 13 * 64, root = (100 + 16) * 64 + 2 * 64;
  CHECK(p.parameters == 2 * block + root);
  CHECK(p.all_gather_bytes == 2 * 2 * 2 * block + 2 * root);  // bf16; blocks twice (resharded), root once
  CHECK(p.reduce_scatter_bytes == 4 * (2 * block + root));    // float32 gradients
  // Compute: per block 2 FLOPs per parameter and token plus 4 T d, backward twice that; the
  // tied output projection 2 V d per token, backward twice.
  const double tokens = 16, block_fwd = 2.0 * block * tokens + 4.0 * 16 * 64 * tokens,
               out_fwd = 2.0 * 100 * 64 * tokens;
  CHECK(p.compute_s == Approx((2 * 3 * block_fwd + 3 * out_fwd) / 1e12));
  CHECK(p.optimizer_s == Approx(28.0 * p.parameters / 8 / 1e12));
}

TEST_CASE("with compute free every collective is exposed; with the network free none is", "[bench]") {
  // alpha 1 s a call, compute ~0: 5 all-gathers (2 blocks twice, the root once) and 3
  // reduce-scatters, all exposed.
  const StepPlan slow = plan_fsdp_step(
      kSmall, {.gpus = 8, .peak_tflops = 1e9, .hbm_bytes_per_s = 1e18, .compute_efficiency = 1}, network(8, 1, 1e18));
  CHECK(slow.all_gather_s == Approx(5));
  CHECK(slow.reduce_scatter_s == Approx(3));
  CHECK(slow.exposed_s == Approx(8).epsilon(1e-6));
  CHECK(slow.hidden_share() == Approx(0).margin(1e-6));
  const StepPlan fast = plan_fsdp_step(
      kSmall, {.gpus = 8, .peak_tflops = 1, .hbm_bytes_per_s = 1e12, .compute_efficiency = 0.5}, network(8, 0, 1e18));
  CHECK(fast.exposed_s == Approx(0).margin(1e-12));
  CHECK(fast.step_s == Approx(fast.compute_s + fast.optimizer_s));
  CHECK(fast.tokens_per_s_per_gpu == Approx(16 / fast.step_s));
  // A middle case: what each window cannot hide adds up, and stays within the total.
  const StepPlan mid = plan_fsdp_step(
      kSmall, {.gpus = 8, .peak_tflops = 1e-3, .hbm_bytes_per_s = 1e12, .compute_efficiency = 1}, network(8, 1, 1e18));
  CHECK(mid.exposed_s > 0);
  CHECK(mid.exposed_s < mid.all_gather_s + mid.reduce_scatter_s);
}

TEST_CASE("one GPU moves nothing; bad input names the field", "[bench]") {
  const StepPlan one = plan_fsdp_step(
      kSmall, {.gpus = 1, .peak_tflops = 1, .hbm_bytes_per_s = 1e12, .compute_efficiency = 1}, network(8, 1, 1e9));
  CHECK(one.all_gather_s == 0);
  CHECK(one.exposed_s == 0);
  PlanModel none = kSmall;
  none.layers = 0;
  CHECK_THROWS_MATCHES(
      plan_fsdp_step(none, {.gpus = 8, .peak_tflops = 1, .hbm_bytes_per_s = 1, .compute_efficiency = 1},
                     network(8, 0, 1)),
      ValueError, MessageContains("layers 0"));
  CHECK_THROWS_MATCHES(
      plan_fsdp_step(kSmall, {.gpus = 8, .peak_tflops = 1, .hbm_bytes_per_s = 1, .compute_efficiency = 2},
                     network(8, 0, 1)),
      ValueError, MessageContains("compute efficiency 2"));
  CHECK_THROWS_MATCHES(
      plan_fsdp_step(kSmall, {.gpus = 8, .peak_tflops = 1, .hbm_bytes_per_s = 1, .compute_efficiency = 1},
                     CostModel("empty", "nccl")),
      ValueError, MessageContains("has no all_gather fit"));
}

}  // namespace
}  // namespace dtr::bench
