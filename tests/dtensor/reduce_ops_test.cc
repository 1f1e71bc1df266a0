// Reductions on DTensors (mean, max, min, sum_of_squares): gradcheck on one rank, every
// placement combination on 1-D and 2x2 meshes against the one-rank result (uneven and
// empty shards included), values against float64 loops, max's gradient among ties, and the
// Partial results the rules promise.
#include <algorithm>
#include <numeric>

#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/reduce.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::on_one_rank;
using testing::OpCase;

// Distinct values (a seeded permutation of 0..n-1, scaled), so that max has no ties and
// finite differences see a smooth function.
Tensor distinct_tensor(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, kFloat64);
  std::vector<double> v(t.numel());
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  for (int64_t i = 0; i < t.numel(); ++i) t.data_ptr<double>()[i] = 0.5 * v[i] - 4;
  return t;
}

// Cases on data of both kinds: distinct values (for gradcheck) or integer values with many
// ties (for the distributed check, where ties span shards).
std::vector<OpCase> cases(Tensor (*data)(const Shape&, uint64_t)) {
  const Tensor a = data({5, 3}, 1), c = data({2, 5, 4}, 2);
  return {
      {"mean all", {{a}}, [](const auto& x) { return mean(x[0]); }},
      {"mean dim 0", {{a}}, [](const auto& x) { return mean(x[0], {0}); }},
      {"mean dims 0, 2 keepdim",
       {{c}},
       [](const auto& x) {
         return mean(x[0], {0, 2}, KeepDim::kYes);
       }},
      {"max all", {{a}}, [](const auto& x) { return max(x[0]); }},
      {"max dim 0", {{a}}, [](const auto& x) { return max(x[0], {0}); }},
      {"max dim -1 keepdim", {{c}}, [](const auto& x) { return max(x[0], {-1}, KeepDim::kYes); }},
      {"min dims 0, 1",
       {{c}},
       [](const auto& x) {
         return min(x[0], {0, 1});
       }},
      {"sum_of_squares all", {{a}}, [](const auto& x) { return sum_of_squares(x[0]); }},
      {"sum_of_squares dim 1", {{c}}, [](const auto& x) { return sum_of_squares(x[0], {1}); }},
  };
}

TEST_CASE("reductions: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases(distinct_tensor)) testing::gradcheck(c);
}

TEST_CASE("reductions: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases(global_tensor)) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("reductions: values against float64 loops", "[dtensor][ops]") {
  const Tensor x = global_tensor({2, 5, 4}, 3);
  const std::vector<double> v = testing::to_f64(x);
  auto at = [&](int64_t i, int64_t j, int64_t k) { return v[(i * 5 + j) * 4 + k]; };
  std::vector<double> mean_ref, max_ref, min_ref, squares_ref;
  for (int64_t j = 0; j < 5; ++j) {  // over dims 0 and 2
    double s = 0, hi = -1e300, lo = 1e300, q = 0;
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t k = 0; k < 4; ++k) {
        s += at(i, j, k);
        hi = std::max(hi, at(i, j, k));
        lo = std::min(lo, at(i, j, k));
        q += at(i, j, k) * at(i, j, k);
      }
    }
    mean_ref.push_back(s / 8);
    max_ref.push_back(hi);
    min_ref.push_back(lo);
    squares_ref.push_back(q);
  }
  const DTensor d = on_one_rank(x);
  // Integer inputs: sums, extremes and sum / 8 are exact.
  testing::check_equal(mean(d, {0, 2}).to_local(), Shape{5}, mean_ref, "mean");
  testing::check_equal(max(d, {0, 2}).to_local(), Shape{5}, max_ref, "max");
  testing::check_equal(min(d, {2, 0}).to_local(), Shape{5}, min_ref, "min");
  testing::check_equal(sum_of_squares(d, {0, 2}).to_local(), Shape{5}, squares_ref, "sum_of_squares");
  CHECK(std::isnan(mean(on_one_rank(Tensor::empty({0, 3}, kFloat64)), {0}).to_local().data_ptr<double>()[0]));
}

TEST_CASE("max and min: ties share the gradient equally, across shards too", "[dtensor][ops]") {
  // Row 0 has its max 5 three times, row 1 its min -1 twice.
  const Tensor x = Tensor::from_vector<double>({5, 1, 5, 5, 0, 2, -1, 7, -1, 3}, {2, 5});
  const Tensor g = Tensor::from_vector<double>({3, 4}, {2});
  const std::vector<double> max_grad = {1, 0, 1, 1, 0, 0, 0, 4, 0, 0};
  const std::vector<double> min_grad = {0, 0, 0, 0, 3, 0, 2, 0, 2, 0};
  testing::run_ranks(2, [&](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    for (const Placements& p : {Placements{Shard(1)}, Placements{Replicate()}, Placements{Shard(0)}}) {
      DTensor d = distribute_tensor(x, mesh, p);
      d.requires_grad_();
      const DTensor gd = distribute_tensor(g, mesh, {Replicate()});
      max(d, {1}).backward(gd);
      testing::check_equal(d.grad().full_tensor(), x.shape(), max_grad, "max gradient, input " + placements_str(p));
      d.set_grad({});
      min(d, {1}).backward(gd);
      testing::check_equal(d.grad().full_tensor(), x.shape(), min_grad, "min gradient, input " + placements_str(p));
    }
  });
}

TEST_CASE("reduction placements: Partial where exact, reduced where autograd needs it", "[dtensor][ops]") {
  testing::run_ranks(4, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {4});
    // [5, 3] over 4 ranks: rows 2, 2, 1, 0 (rank 3's shard is empty).
    const Tensor a = global_tensor({5, 3}, 4);
    const DTensor s = distribute_tensor(a, mesh, {Shard(0)});
    collective_counter().reset();
    const DTensor m = mean(s, {0});
    const DTensor hi = max(s, {0});
    const DTensor lo = min(s);
    CHECK(collective_counter().snapshot().empty());
    CHECK(m.placements() == Placements{Partial()});  // local sum / 5: exact for uneven shards
    CHECK(hi.placements() == Placements{Partial(ReduceOp::kMax)});
    CHECK(lo.placements() == Placements{Partial(ReduceOp::kMin)});
    testing::check_equal(hi.full_tensor(), max(a, {0}), "max over an uneven shard");
    testing::check_equal(lo.full_tensor(), min(a), "min with an empty shard");
    testing::check_close(m.full_tensor(), mean(a, {0}), "mean over uneven shards");
    // Recorded by autograd, max reduces in its forward: one all_reduce, promised by its rule.
    DTensor leaf = distribute_tensor(a, mesh, {Shard(0)});
    leaf.requires_grad_();
    collective_counter().reset();
    reset_promised_collectives();
    const DTensor y = max(leaf, {0});
    CHECK(y.placements() == Placements{Replicate()});
    CHECK(collective_counter().calls(CollectiveKind::kAllReduce) == 1);
    CHECK(promised_collectives() == 1);
    // A Partial(sum) input to a nonlinear reduction is reduced first (here reduce-scattered
    // along the reduced dim, so that the squares are summed as a new Partial).
    const DTensor p = from_local(a, mesh, {Partial()});  // value 4a
    collective_counter().reset();
    const DTensor q = sum_of_squares(p, {1});
    CHECK(collective_counter().calls(CollectiveKind::kReduceScatter) == 1);
    testing::check_equal(q.full_tensor(), sum_of_squares(mul(a, 4.0), {1}), "sum_of_squares of a Partial");
  });
}

TEST_CASE("reductions: errors name the op and the inputs", "[dtensor][ops]") {
  const DTensor a = on_one_rank(global_tensor({5, 3}, 1));
  CHECK_THROWS_AS(max(on_one_rank(Tensor::empty({0, 3}, kFloat64)), {0}), ValueError);
  CHECK_THROWS_WITH(max(on_one_rank(Tensor::empty({0, 3}, kFloat64)), {0}),
                    Catch::Contains("max") && Catch::Contains("float64[0, 3] (R)"));
  CHECK_THROWS_AS(max(on_one_rank(Tensor::from_vector<int64_t>({1, 2}, {2}))), TypeError);
  CHECK_THROWS_AS(mean(on_one_rank(Tensor::from_vector<int64_t>({1, 2}, {2}))), TypeError);
  CHECK_THROWS_AS(mean(a, {0, -2}), ValueError);
  CHECK_THROWS_AS(min(a, {2}), IndexError);
}

}  // namespace
}  // namespace dtr
