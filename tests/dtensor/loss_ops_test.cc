// cross_entropy on DTensors: gradcheck on one rank, every placement combination on 1-D and
// 2x2 meshes against the one-rank result (with ignored targets and uneven batch shards), and
// the rule: a batch-sharded mean is a Partial scalar equal to the global mean once reduced,
// for one promised all_reduce of the target count; values against a float64 loop; label
// smoothing under batch sharding (Partial, no extra communication) and class sharding
// (loss_parallel: the logits stay sharded, one all-reduce of [N] per row statistic, none in
// backward), and its range error. linear_cross_entropy: gradcheck and every placement
// combination (a class-sharded weight included) as cross_entropy's, its gradients bit for
// bit the composed linear and cross_entropy's over several chunks (float32 and bfloat16),
// its rule under batch sharding, and its errors.
#include "dtensor/ops/loss.h"

#include <cmath>

#include "dtensor/ops/matmul.h"
#include "kernels/fill.h"
#include "tests/dtensor/op_test_util.h"
#include "tests/kernels/check_bitwise.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::OpCase;

Tensor targets() { return Tensor::from_vector<int64_t>({1, -100, 3, 0, 2}); }

std::vector<OpCase> cases() {
  const Tensor logits = global_tensor({5, 4}, 1);
  return {
      {"cross_entropy mean",
       {{logits}, {targets(), false, false}},
       [](const auto& x) { return cross_entropy(x[0], x[1]); }},
      {"cross_entropy sum, ignore_index 3",
       {{logits}, {Tensor::from_vector<int64_t>({1, 3, 3, 0, 2}), false, false}},
       [](const auto& x) { return cross_entropy(x[0], x[1], 3, LossReduction::kSum); }},
      {"cross_entropy mean, label_smoothing 0.2",
       {{logits}, {targets(), false, false}},
       [](const auto& x) { return cross_entropy(x[0], x[1], -100, LossReduction::kMean, 0.2); }},
      {"cross_entropy sum, label_smoothing 1",
       {{logits}, {targets(), false, false}},
       [](const auto& x) { return cross_entropy(x[0], x[1], -100, LossReduction::kSum, 1.0); }},
      {"linear_cross_entropy mean, bias",
       {{global_tensor({5, 3}, 4)}, {global_tensor({4, 3}, 5)}, {global_tensor({4}, 6)}, {targets(), false, false}},
       [](const auto& x) { return linear_cross_entropy(x[0], x[1], x[2], x[3]); }},
      {"linear_cross_entropy sum, no bias, label_smoothing 0.2",
       {{global_tensor({5, 3}, 7)}, {global_tensor({4, 3}, 8)}, {targets(), false, false}},
       [](const auto& x) {
         return linear_cross_entropy(x[0], x[1], std::nullopt, x[2], -100, LossReduction::kSum, 0.2);
       }},
  };
}

TEST_CASE("cross_entropy: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("cross_entropy: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("cross_entropy rules: a batch-sharded mean is Partial and equals the global mean", "[dtensor][ops]") {
  testing::run_ranks(4, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {4});
    // 5 rows on 4 ranks: 2, 2, 1, 0 rows; rank 0's second row is ignored.
    const Tensor logits = global_tensor({5, 4}, 2), target = targets();
    // Reference: mean over kept rows of logsumexp(row) - row[target]; grad = (softmax - onehot) / count.
    const std::vector<double> lv = testing::to_f64(logits);
    double total = 0;
    std::vector<double> grad(20, 0.0);
    const int64_t* t = target.data_ptr<int64_t>();
    for (int64_t n = 0; n < 5; ++n) {
      if (t[n] == -100) continue;
      double z = 0;
      for (int64_t c = 0; c < 4; ++c) z += std::exp(lv[n * 4 + c]);
      total += std::log(z) - lv[n * 4 + t[n]];
      for (int64_t c = 0; c < 4; ++c) grad[n * 4 + c] = (std::exp(lv[n * 4 + c]) / z - (c == t[n] ? 1 : 0)) / 4;
    }
    DTensor x = distribute_tensor(logits, mesh, {Shard(0)}), y = distribute_tensor(target, mesh, {Shard(0)});
    x.requires_grad_();
    collective_counter().reset();
    reset_promised_collectives();
    DTensor loss = cross_entropy(x, y);
    CHECK(loss.placements() == Placements{Partial()});
    CHECK(issued_collectives() == 1);  // the count of kept targets, nothing else
    CHECK(promised_collectives() == 1);
    CHECK(std::abs(loss.item() - total / 4) <= 1e-12);
    loss.backward();
    CHECK(x.grad().placements() == Placements{Shard(0)});
    testing::check_close(x.grad().full_tensor(), logits.shape(), grad, "grad_logits");
    // kSum needs no count: no communication at all.
    collective_counter().reset();
    CHECK(cross_entropy(x.detach(), y, -100, LossReduction::kSum).placements() == Placements{Partial()});
    CHECK(issued_collectives() == 0);
    // Every target ignored: the mean is NaN, as in torch.
    DTensor none = distribute_tensor(Tensor::from_vector<int64_t>({-100, -100, -100, -100, -100}), mesh, {Shard(0)});
    CHECK(std::isnan(cross_entropy(x.detach(), none).item()));
    // Zero logits: softmax is exactly 1/4, so grad_logits = (1/4 - onehot) / 4 bit for bit.
    DTensor zero = distribute_tensor(zeros({5, 4}, kFloat64), mesh, {Shard(0)});
    zero.requires_grad_();
    cross_entropy(zero, y).backward();
    std::vector<double> exact(20, 0.0);
    for (int64_t n = 0; n < 5; ++n) {
      for (int64_t c = 0; c < 4 && t[n] != -100; ++c) exact[n * 4 + c] = (0.25 - (c == t[n] ? 1 : 0)) / 4;
    }
    testing::check_equal(zero.grad().full_tensor(), logits.shape(), exact, "grad_logits of zero logits");
    // Class-sharded logits stay sharded (loss_parallel): the batch-sharded target is gathered
    // along the classes' mesh dim, then three all-reduces of [N] (the row max, the sum of
    // exponentials, the target's logit) and none in backward; the gradient stays
    // class-sharded.
    DTensor cols = distribute_tensor(logits, mesh, {Shard(1)});
    cols.requires_grad_();
    collective_counter().reset();
    const DTensor class_loss = cross_entropy(cols, y);
    CHECK(collective_counter().calls(CollectiveKind::kAllGather) == 1);
    CHECK(collective_counter().calls(CollectiveKind::kAllReduce) == 3);
    CHECK(issued_collectives() == 4);
    CHECK(std::abs(class_loss.item() - total / 4) <= 1e-12);
    collective_counter().reset();
    class_loss.backward();
    CHECK(issued_collectives() == 0);
    CHECK(cols.grad().placements() == Placements{Shard(1)});
    testing::check_close(cols.grad().full_tensor(), logits.shape(), grad, "class-sharded grad_logits");
  });
}

TEST_CASE("cross_entropy rules with label smoothing: batch-sharded is Partial, class-sharded stays sharded",
          "[dtensor][ops]") {
  testing::run_ranks(4, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {4});
    const Tensor logits = global_tensor({5, 4}, 3), target = targets();
    const double e = 0.3;
    // Reference from log_softmax: mean over kept rows of (1 - e) * -logp[t] + e * mean_c -logp[c];
    // grad = (softmax - (1 - e) onehot - e / 4) / count.
    const std::vector<double> lv = testing::to_f64(logits);
    const int64_t* t = target.data_ptr<int64_t>();
    double total = 0;
    std::vector<double> grad(20, 0.0);
    for (int64_t n = 0; n < 5; ++n) {
      if (t[n] == -100) continue;
      double z = 0;
      for (int64_t c = 0; c < 4; ++c) z += std::exp(lv[n * 4 + c]);
      double smooth = 0;
      for (int64_t c = 0; c < 4; ++c) smooth -= (lv[n * 4 + c] - std::log(z)) / 4;
      total += (1 - e) * (std::log(z) - lv[n * 4 + t[n]]) + e * smooth;
      for (int64_t c = 0; c < 4; ++c) {
        grad[n * 4 + c] = (std::exp(lv[n * 4 + c]) / z - (c == t[n] ? 1 - e : 0) - e / 4) / 4;
      }
    }
    DTensor y = distribute_tensor(target, mesh, {Shard(0)});
    for (const Placement& p : {Shard(0), Shard(1)}) {
      INFO("logits " << placements_str(Placements{p}));
      DTensor x = distribute_tensor(logits, mesh, {p});
      x.requires_grad_();
      collective_counter().reset();
      reset_promised_collectives();
      DTensor loss = cross_entropy(x, y, -100, LossReduction::kMean, e);
      CHECK(issued_collectives() == promised_collectives());
      // Rows: only the count of kept targets. Classes: the target gathered, then the row max,
      // the sum of exponentials, the target's logit and the sum over classes, one all-reduce
      // of [N] each.
      if (p == Shard(0)) {
        CHECK(loss.placements() == Placements{Partial()});
        CHECK(issued_collectives() == 1);
      } else {
        CHECK(issued_collectives() == 5);
      }
      CHECK(std::abs(loss.item() - total / 4) <= 1e-12);
      collective_counter().reset();
      loss.backward();
      CHECK(issued_collectives() == 0);
      CHECK(x.grad().placements() == Placements{p});
      testing::check_close(x.grad().full_tensor(), logits.shape(), grad, "grad_logits");
    }
  });
}

// The fused op's loss and gradients and the composed ops' (linear, then cross_entropy), on
// one rank: rows over several chunks, some targets ignored.
void check_fused_as_composed(DType dtype, int64_t rows, int64_t classes, bool bias, double label_smoothing) {
  INFO(dtype_name(dtype) << ", " << rows << " rows, " << classes << " classes, bias " << bias << ", smoothing "
                         << label_smoothing);
  const DeviceMesh mesh = single_rank_mesh();
  auto leaf = [&](const Tensor& t) {
    DTensor d(t, DTensorSpec(mesh, {Replicate()}, t.shape(), t.dtype()));
    d.requires_grad_();
    return d;
  };
  const Tensor xv = testing::random_tensor({rows, 24}, dtype, 61, -2.0, 2.0);
  const Tensor wv = testing::random_tensor({classes, 24}, dtype, 62);
  const Tensor bv = testing::random_tensor({classes}, dtype, 63);
  Tensor tv = Tensor::empty({rows}, kInt64);
  for (int64_t r = 0; r < rows; ++r) tv.data_ptr<int64_t>()[r] = r % 7 == 3 ? -100 : (r * 37) % classes;
  const DTensor t(tv, DTensorSpec(mesh, {Replicate()}, tv.shape(), kInt64));
  struct Run {
    DTensor loss, x, w, b;
  };
  auto run = [&](bool fused) {
    Run r{DTensor(), leaf(xv), leaf(wv), leaf(bv)};
    const std::optional<DTensor> b = bias ? std::optional<DTensor>(r.b) : std::nullopt;
    r.loss = fused ? linear_cross_entropy(r.x, r.w, b, t, -100, LossReduction::kMean, label_smoothing)
                   : cross_entropy(linear(r.x, r.w, b), t, -100, LossReduction::kMean, label_smoothing);
    r.loss.backward();
    return r;
  };
  const Run fused = run(true), composed = run(false);
  // The loss adds each chunk's sum rounded to the dtype: within a few of its roundings.
  const double rounding = dtype == kFloat32 ? 6e-8 : 4e-3;
  CHECK(std::abs(fused.loss.item() - composed.loss.item()) <= 4 * rounding * std::abs(composed.loss.item()));
  testing::check_bitwise(fused.x.grad().to_local(), composed.x.grad().to_local(), "grad x");
  testing::check_bitwise(fused.w.grad().to_local(), composed.w.grad().to_local(), "grad weight");
  if (bias) testing::check_bitwise(fused.b.grad().to_local(), composed.b.grad().to_local(), "grad bias");
}

TEST_CASE("linear_cross_entropy: the composed ops' gradients bit for bit over several chunks", "[dtensor][ops]") {
  // 4096 classes: chunks of 256 float32 rows (4 MiB of logits), 512 bfloat16 rows.
  check_fused_as_composed(kFloat32, 700, 4096, true, 0.0);
  check_fused_as_composed(kFloat32, 700, 4096, false, 0.1);
  check_fused_as_composed(kFloat32, 9, 33, true, 0.0);  // one partial chunk
  check_fused_as_composed(kBFloat16, 1100, 4096, true, 0.0);
}

TEST_CASE("linear_cross_entropy rules: batch-sharded rows give a Partial loss, gradients kept from forward",
          "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor xv = global_tensor({5, 3}, 9), wv = global_tensor({4, 3}, 10), bv = global_tensor({4}, 11);
    auto leaf = [&](const Tensor& v, Placements p) {
      DTensor d = distribute_tensor(v, mesh, p);
      d.requires_grad_();
      return d;
    };
    const DTensor y = distribute_tensor(targets(), mesh, {Shard(0)});
    // The composed ops on the same placements: the reference.
    DTensor xr = leaf(xv, {Shard(0)}), wr = leaf(wv, {Replicate()}), br = leaf(bv, {Replicate()});
    DTensor reference = cross_entropy(linear(xr, wr, br), y);
    reference.backward();
    DTensor x = leaf(xv, {Shard(0)}), w = leaf(wv, {Replicate()}), b = leaf(bv, {Replicate()});
    collective_counter().reset();
    reset_promised_collectives();
    DTensor loss = linear_cross_entropy(x, w, b, y);
    CHECK(loss.placements() == Placements{Partial()});
    CHECK(issued_collectives() == 1);  // the count of kept targets
    CHECK(promised_collectives() == 1);
    CHECK(std::abs(loss.item() - reference.item()) <= 1e-12);
    collective_counter().reset();
    loss.backward();
    CHECK(issued_collectives() == 2);  // the weight's and bias's Partial gradients reduced, as the reference's
    CHECK(x.grad().placements() == Placements{Shard(0)});
    testing::check_close(x.grad().full_tensor(), xv.shape(), testing::to_f64(xr.grad().full_tensor()), "grad x");
    testing::check_close(w.grad().full_tensor(), wv.shape(), testing::to_f64(wr.grad().full_tensor()), "grad w");
    testing::check_close(b.grad().full_tensor(), bv.shape(), testing::to_f64(br.grad().full_tensor()), "grad b");
    // Without grad mode, only the loss.
    const NoGradGuard no_grad;
    CHECK(std::abs(linear_cross_entropy(x, w, b, y).item() - reference.item()) <= 1e-12);
  });
}

TEST_CASE("linear_cross_entropy: errors name the input, weight, bias and target", "[dtensor][ops]") {
  const DeviceMesh mesh = single_rank_mesh();
  auto dt = [&](const Shape& shape, DType dtype) {
    return DTensor(Tensor::empty(shape, dtype), DTensorSpec(mesh, {Replicate()}, shape, dtype));
  };
  CHECK_THROWS_WITH(linear_cross_entropy(dt({5, 3}, kFloat64), dt({4, 2}, kFloat64), std::nullopt, dt({5}, kInt64)),
                    Catch::Contains("linear_cross_entropy: input float64[5, 3] (R), weight float64[4, 2] (R) and bias "
                                    "none do not fit"));
  CHECK_THROWS_AS(linear_cross_entropy(dt({5, 3}, kFloat64), dt({4, 3}, kFloat32), std::nullopt, dt({5}, kInt64)),
                  TypeError);
  CHECK_THROWS_WITH(
      linear_cross_entropy(dt({5, 3}, kFloat64), dt({4, 3}, kFloat64), dt({4}, kFloat64), dt({4}, kInt64)),
      Catch::Contains("target int64[4] (R) must be int64 class indices [N] for input float64[5, 3]"));
  CHECK_THROWS_WITH(linear_cross_entropy(dt({5, 3}, kFloat64), dt({4, 3}, kFloat64), std::nullopt, dt({5}, kInt64),
                                         -100, LossReduction::kNone),
                    Catch::Contains("linear_cross_entropy: reduction none is not fused"));
}

TEST_CASE("cross_entropy: errors name the logits, the target and what is legal", "[dtensor][ops]") {
  const DeviceMesh mesh = single_rank_mesh();
  auto dt = [&](const Shape& shape, DType dtype) {
    return DTensor(Tensor::empty(shape, dtype), DTensorSpec(mesh, {Replicate()}, shape, dtype));
  };
  CHECK_THROWS_WITH(cross_entropy(dt({2, 5, 4}, kFloat64), dt({2}, kInt64)),
                    Catch::Contains("cross_entropy: logits float64[2, 5, 4] (R) must be floating [N, C]"));
  CHECK_THROWS_WITH(cross_entropy(dt({5, 4}, kFloat64), dt({5}, kInt32)),
                    Catch::Contains("cross_entropy: target int32[5] (R) must be int64 class indices"));
  CHECK_THROWS_WITH(cross_entropy(dt({5, 4}, kFloat64), dt({4}, kInt64)),
                    Catch::Contains("target int64[4] (R) must be [N] for logits float64[5, 4] (R)"));
  CHECK_THROWS_WITH(cross_entropy(dt({5, 4}, kFloat64), dt({5}, kInt64), -100, LossReduction::kMean, 1.5),
                    Catch::Contains("cross_entropy: label_smoothing 1.5 is not in [0, 1]"));
  CHECK_THROWS_AS(cross_entropy(dt({5, 4}, kFloat64), dt({5}, kInt64), -100, LossReduction::kSum, -0.5), ValueError);
  CHECK_THROWS_WITH(cross_entropy(dt({5, 4}, kFloat64), dt({5}, kInt64), -100, LossReduction::kNone),
                    Catch::Contains("cross_entropy: reduction none is not fused"));
}

}  // namespace
}  // namespace dtr
