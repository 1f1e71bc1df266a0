// Small models trained for 5 SGD steps with the batch sharded and the weights replicated
// (data parallelism expressed as placements) give the same losses, step by step, as the
// same model on one rank: the weight gradients come out Partial and are all-reduced into
// the weights' Replicate placement as they accumulate.
#include <catch2/catch.hpp>

#include "dtensor/ops/attention.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/reduce.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/elementwise.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;

constexpr int kSteps = 5;
constexpr double kLr = 0.05;

// A weight as a leaf DTensor under `placements` (from the same global values on every rank).
DTensor parameter(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  DTensorSpec spec(mesh, placements, full.shape(), full.dtype());
  DTensor p(testing::contiguous_chunk_of(full, spec.local_chunk()), spec);
  p.requires_grad_();
  return p;
}

// One SGD step on every parameter's local shard: p <- p - lr * grad (no graph).
void sgd_step(std::vector<DTensor>& params) {
  for (DTensor& p : params) {
    REQUIRE(p.grad().defined());
    REQUIRE(p.grad().placements() == p.placements());
    DTensor next(sub(p.to_local(), mul(p.grad().to_local(), kLr)), p.spec());
    next.requires_grad_();
    p = next;
  }
}

using Model = std::function<DTensor(const std::vector<DTensor>& params, const DTensor& x, const DTensor& target)>;

// Losses of kSteps steps: batch under `batch` placements, weights Replicate.
std::vector<double> train(const DeviceMesh& mesh, const Placements& batch, const std::vector<Tensor>& weights,
                          const Tensor& x_full, const Tensor& target_full, const Model& model) {
  std::vector<DTensor> params;
  for (const Tensor& w : weights) params.push_back(parameter(w, mesh, Placements(mesh.ndim(), Replicate())));
  DTensorSpec xs(mesh, batch, x_full.shape(), x_full.dtype());
  DTensorSpec ts(mesh, batch, target_full.shape(), target_full.dtype());
  const DTensor x(testing::contiguous_chunk_of(x_full, xs.local_chunk()), xs);
  const DTensor target(testing::contiguous_chunk_of(target_full, ts.local_chunk()), ts);
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    DTensor loss = model(params, x, target);
    losses.push_back(loss.item());
    loss.backward();
    sgd_step(params);
  }
  return losses;
}

void check_same_losses(const std::vector<double>& reference, const std::vector<double>& sharded) {
  REQUIRE(sharded.size() == reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    INFO("step " << i << ": one rank " << reference[i] << ", sharded " << sharded[i]);
    CHECK(std::abs(sharded[i] - reference[i]) <= 1e-12 * std::abs(reference[i]));
  }
  CHECK(reference.back() < reference.front());  // it trains
}

TEST_CASE("a two-layer MLP: batch-sharded training matches one rank", "[dtensor][model]") {
  // 7 samples (uneven over 2, 3 and 4 ranks), 6 features, 10 hidden, 4 classes.
  const Tensor x = mul(global_tensor({7, 6}, 1), 0.25);
  const std::vector<Tensor> weights = {mul(global_tensor({10, 6}, 2), 0.1), mul(global_tensor({10}, 3), 0.1),
                                       mul(global_tensor({4, 10}, 4), 0.1), mul(global_tensor({4}, 5), 0.1)};
  Tensor classes = Tensor::empty({7}, kInt64);
  for (int64_t i = 0; i < 7; ++i) classes.data_ptr<int64_t>()[i] = i % 4;
  const Model mlp = [](const std::vector<DTensor>& p, const DTensor& in, const DTensor& t) {
    DTensor h = gelu(linear(in, p[0], p[1]), GeluApproximation::kTanh);
    return cross_entropy(linear(h, p[2], p[3]), t);
  };
  const std::vector<double> reference = train(single_rank_mesh(), {Replicate()}, weights, x, classes, mlp);
  testing::for_each_test_mesh([&](const DeviceMesh& mesh) {
    Placements batch(mesh.ndim(), Replicate());
    batch[0] = Shard(0);
    check_same_losses(reference, train(mesh, batch, weights, x, classes, mlp));
  });
}

TEST_CASE("a causal attention block: batch-sharded training matches one rank", "[dtensor][model]") {
  // Batch 3 (uneven), 2 heads of width 2, 5 positions; loss = mean of squares of the output.
  const Tensor x = mul(global_tensor({3, 5, 4}, 6), 0.25);
  const std::vector<Tensor> weights = {mul(global_tensor({4, 4}, 7), 0.2), mul(global_tensor({4, 4}, 8), 0.2),
                                       mul(global_tensor({4, 4}, 9), 0.2), mul(global_tensor({4, 4}, 10), 0.2)};
  const Tensor unused_target = zeros({3}, kFloat64);
  const Model block = [](const std::vector<DTensor>& p, const DTensor& in, const DTensor&) {
    // [B, T, E] -> [B, H, T, E / H] and back.
    auto heads = [](const DTensor& t) { return permute(reshape(t, {t.size(0), t.size(1), 2, -1}), {0, 2, 1, 3}); };
    DTensor q = heads(linear(in, p[0])), k = heads(linear(in, p[1])), v = heads(linear(in, p[2]));
    DTensor a = scaled_dot_product_attention(q, k, v, Causal::kYes);
    DTensor o = linear(reshape(permute(a, {0, 2, 1, 3}), {in.size(0), in.size(1), -1}), p[3]);
    return mul(sum(mul(o, o)), 1.0 / static_cast<double>(o.numel()));
  };
  const std::vector<double> reference = train(single_rank_mesh(), {Replicate()}, weights, x, unused_target, block);
  testing::for_each_test_mesh([&](const DeviceMesh& mesh) {
    Placements batch(mesh.ndim(), Replicate());
    batch[0] = Shard(0);
    check_same_losses(reference, train(mesh, batch, weights, x, unused_target, block));
  });
}

}  // namespace
}  // namespace dtr
