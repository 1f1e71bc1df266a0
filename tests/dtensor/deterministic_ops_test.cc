// --deterministic's batch reductions (kernels/block_reduce.h) on real ranks: the gradients of
// a small model's embedding, position embedding, LayerNorm, RMSNorm, linear layer, fused
// output loss and composed one (logits, then cross_entropy), and the loss itself, have one rank's bits when two ranks
// split its batch. The same model without the mode rounds differently on two ranks (so the data can tell the orders
// apart).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/embedding.h"
#include "dtensor/ops/layer_norm.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/reduce.h"
#include "dtensor/ops/rms_norm.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "kernels/reduce.h"
#include "tests/dtensor/op_test_util.h"
#include "tests/testing/multi_rank.h"

namespace dtr {
namespace {

using testing::random_tensor;
using testing::to_f64;

constexpr int64_t kSequences = 8, kSeq = 16, kDim = 8, kVocab = 32;

// The loss and every parameter's gradient (whole, as float64) of one step on `mesh`, the
// batch placed by `batch`.
std::vector<std::vector<double>> step(const DeviceMesh& mesh, const Placements& batch) {
  const Placements replicate(mesh.ndim(), Replicate());
  auto param = [&](Shape shape, uint64_t seed) {
    DTensor p = distribute_tensor(random_tensor(std::move(shape), kFloat32, seed), mesh, replicate);
    p.requires_grad_();
    return p;
  };
  DTensor embed = param({kVocab, kDim}, 1), pos = param({kSeq, kDim}, 2), norm_w = param({kDim}, 3),
          norm_b = param({kDim}, 4), w = param({kDim, kDim}, 5), b = param({kDim}, 6), head = param({kVocab, kDim}, 7),
          head_b = param({kVocab}, 8), rms_w = param({kDim}, 11), head2 = param({kVocab, kDim}, 12);
  auto ids = [&](uint64_t seed) {
    return distribute_tensor(random_tensor({kSequences, kSeq}, kFloat64, seed, 0, kVocab).to(kInt64), mesh, batch);
  };
  const DTensor tokens = ids(9), targets = ids(10);
  const DTensor positions = distribute_tensor(arange(0, kSeq, 1, kInt64), mesh, replicate);
  const DTensor x = add(embedding(embed, tokens), embedding(pos, positions));
  const DTensor y = linear(rms_norm(layer_norm(x, {kDim}, norm_w, norm_b), {kDim}, rms_w), w, b);
  // Two losses: the fused one and the composed one (logits, then cross_entropy).
  const DTensor rows = reshape(y, {kSequences * kSeq, kDim}), row_targets = reshape(targets, {kSequences * kSeq});
  const DTensor loss =
      add(linear_cross_entropy(rows, head, head_b, row_targets), cross_entropy(linear(rows, head2), row_targets));
  loss.backward();
  std::vector<std::vector<double>> out{to_f64(loss.full_tensor())};
  for (const DTensor* p : {&embed, &pos, &norm_w, &norm_b, &w, &b, &head, &head_b, &rms_w, &head2}) {
    out.push_back(to_f64(p->grad().full_tensor()));
  }
  return out;
}

TEST_CASE("--deterministic: a batch's gradients and loss have one rank's bits on two", "[dtensor][deterministic]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh dp = init_device_mesh(kCPU, {2}, {"dp"});
    const char* names[] = {"loss",        "embedding",       "position embedding",    "norm weight",
                           "norm bias",   "linear weight",   "linear bias",           "output weight",
                           "output bias", "rms_norm weight", "composed output weight"};
    set_deterministic_block_tokens(kSeq);
    const auto one = step(single_rank_mesh(), {Replicate()});
    const auto two = step(dp, {Shard(0)});
    set_deterministic_block_tokens(0);
    for (size_t i = 0; i < one.size(); ++i) {
      INFO(names[i]);
      CHECK(two[i] == one[i]);
    }
    // Without the mode, one GEMM over the batch's 128 rows against two over 64 and a sum.
    const auto plain_one = step(single_rank_mesh(), {Replicate()});
    const auto plain_two = step(dp, {Shard(0)});
    CHECK(plain_two[5] != plain_one[5]);
  });
}

TEST_CASE("--deterministic: a value Partial over a 2 x 2 mesh reduces the inner dim first, the ranks' tree",
          "[dtensor][deterministic]") {
  // Rank r = 2 i + j of mesh (i, j) holds the batch's block r (Shard(0) on both dims), so the
  // canonical tree adds (r0 + r1) + (r2 + r3). These terms round to 2 + 2^-22 that way and to 2
  // in the other, (r0 + r2) + (r1 + r3): a loss reported from such a value told the layouts apart.
  testing::run_ranks(4, [](int rank, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 2}, {"replicate", "shard"});
    const float terms[] = {1.0f, 1.0f, std::ldexp(1.0f, -24), std::ldexp(1.5f, -24)};
    const DTensor partial(full({}, terms[rank], kFloat32), DTensorSpec(mesh, {Partial(), Partial()}, {}, kFloat32));
    // A [2] of the same term, reduce-scattered over the outer dim: the inner all-reduce goes
    // first (the planner's reduce-scatter-first plan would add r0 + r2 first).
    const DTensor pair(full({2}, terms[rank], kFloat32), DTensorSpec(mesh, {Partial(), Partial()}, {2}, kFloat32));
    set_deterministic_block_tokens(kSeq);
    const double tree = partial.item();
    const Tensor replicated = partial.redistribute({Replicate(), Replicate()}).to_local();
    const Tensor scattered = pair.redistribute({Shard(0), Replicate()}).to_local();
    set_deterministic_block_tokens(0);
    CHECK(tree == 2.0 + std::ldexp(1.0, -22));
    CHECK(replicated.item() == tree);
    REQUIRE(scattered.numel() == 1);
    CHECK(scattered.item() == tree);
    // The outer dim first rounds these terms apart: the check above can tell the orders.
    const float outer_first = (terms[0] + terms[2]) + (terms[1] + terms[3]);
    CHECK(static_cast<double>(outer_first) != tree);
  });
}

TEST_CASE("--deterministic: a sum over the batch is the tree of the sequences' sums, not the rows in order",
          "[dtensor][deterministic]") {
  // 8 sequences of 4 tokens, 2 features: a one, then values an eighth of float32's last
  // bit of one. The sum over all rows at once (accumulated in double) is 1 + 3.875 ulp,
  // rounded to 1 + 4 ulp; the tree rounds each sequence's sum and each node to float32
  // (1, then 1 + half an ulp rounds to even, ...) and ends at 1 + 3 ulp. sum_leading (the
  // bias and position gradients' reduction) must give the tree.
  constexpr int64_t sequences = 8, tokens = 4, features = 2;
  Tensor g = full({sequences, tokens, features}, std::ldexp(1.0, -26), kFloat32);
  Tensor one = g.narrow(0, 0, 1).narrow(1, 0, 1);
  fill_(one, 1.0);
  const DTensor dg = distribute_tensor(g, single_rank_mesh(), {Replicate()});
  // The tree by its definition over the sequences' own sums.
  std::function<Tensor(int64_t, int64_t)> node = [&](int64_t first, int64_t width) -> Tensor {
    if (width == 1) return sum(g.select(0, first), {0});
    return add(node(first, width / 2), node(first + width / 2, width / 2));
  };
  const Tensor tree = node(0, sequences);
  set_deterministic_block_tokens(tokens);
  const Tensor blocked = sum_leading(dg, 2).to_local();
  const Tensor over_sequences = sum_leading(dg, 1).to_local();  // [tokens, features]: a sequence per row
  set_deterministic_block_tokens(0);
  const Tensor in_order = sum_leading(dg, 2).to_local();
  CHECK(to_f64(blocked) == to_f64(tree));
  CHECK(to_f64(in_order) != to_f64(tree));
  // Over the sequences alone: the tree of the sequences themselves.
  std::function<Tensor(int64_t, int64_t)> rows = [&](int64_t first, int64_t width) -> Tensor {
    if (width == 1) return g.select(0, first);
    return add(rows(first, width / 2), rows(first + width / 2, width / 2));
  };
  CHECK(to_f64(over_sequences) == to_f64(rows(0, sequences)));
}

}  // namespace
}  // namespace dtr
