// where, masked_fill, comparisons and logical_not on DTensors: gradcheck on one rank, every
// placement combination on 1-D and 2x2 meshes against the one-rank result, values against
// loops written here, and the exact Partial cases (with the ones that must reduce first).
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/where.h"
#include "kernels/elementwise.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::on_one_rank;
using testing::OpCase;
using testing::OpInput;

OpInput mask_input(const Shape& shape, uint64_t seed) { return {gt(global_tensor(shape, seed), 0.0), false, false}; }

std::vector<OpCase> differentiable_cases() {
  const Tensor a = global_tensor({5, 3}, 1), b = global_tensor({5, 3}, 2), row = global_tensor({3}, 3);
  return {
      {"where", {mask_input({5, 3}, 4), {a}, {b}}, [](const auto& x) { return where(x[0], x[1], x[2]); }},
      {"where broadcast [5,1] ? [3] : [5,3]",
       {mask_input({5, 1}, 5), {row}, {b}},
       [](const auto& x) { return where(x[0], x[1], x[2]); }},
      {"masked_fill 0", {{a}, mask_input({5, 3}, 6)}, [](const auto& x) { return masked_fill(x[0], x[1], 0.0); }},
      {"masked_fill -2.5 broadcast mask [3]",
       {{a}, mask_input({3}, 7)},
       [](const auto& x) { return masked_fill(x[0], x[1], -2.5); }},
  };
}

std::vector<OpCase> comparison_cases() {
  // Integer values in [-8, 8]: many ties, so eq/le/ge are exercised at equality.
  const Tensor a = global_tensor({5, 3}, 8), b = global_tensor({5, 3}, 9), row = global_tensor({3}, 10);
  auto in = [](const Tensor& t) { return OpInput{t, false}; };
  return {
      {"eq", {in(a), in(b)}, [](const auto& x) { return eq(x[0], x[1]); }},
      {"ne broadcast", {in(a), in(row)}, [](const auto& x) { return ne(x[0], x[1]); }},
      {"lt", {in(a), in(b)}, [](const auto& x) { return lt(x[0], x[1]); }},
      {"le", {in(a), in(b)}, [](const auto& x) { return le(x[0], x[1]); }},
      {"gt", {in(a), in(b)}, [](const auto& x) { return gt(x[0], x[1]); }},
      {"ge", {in(a), in(b)}, [](const auto& x) { return ge(x[0], x[1]); }},
      {"eq scalar", {in(a)}, [](const auto& x) { return eq(x[0], 1.0); }},
      {"ne scalar", {in(a)}, [](const auto& x) { return ne(x[0], 1.0); }},
      {"lt scalar", {in(a)}, [](const auto& x) { return lt(x[0], 0.0); }},
      {"le scalar", {in(a)}, [](const auto& x) { return le(x[0], 0.0); }},
      {"gt scalar", {in(a)}, [](const auto& x) { return gt(x[0], -1.0); }},
      {"ge scalar", {in(a)}, [](const auto& x) { return ge(x[0], -1.0); }},
      {"logical_not", {mask_input({5, 3}, 11)}, [](const auto& x) { return logical_not(x[0]); }},
  };
}

TEST_CASE("where and masked_fill: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : differentiable_cases()) testing::gradcheck(c);
}

TEST_CASE("where, masked_fill and comparisons: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : differentiable_cases()) testing::check_distributed(c, mesh);
    for (const OpCase& c : comparison_cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("where, masked_fill and comparisons: values and gradients known exactly", "[dtensor][ops]") {
  const Tensor cond = Tensor::from_vector<double>({1, 0, 0, 1}, {4}).to(kBool);
  DTensor a = on_one_rank(Tensor::from_vector<double>({1, 2, 3, 4}, {4}));
  DTensor b = on_one_rank(Tensor::from_vector<double>({-1, -2, -3, -4}, {4}));
  a.requires_grad_();
  b.requires_grad_();
  const DTensor y = where(on_one_rank(cond), a, b);
  testing::check_equal(y.to_local(), Shape{4}, {1, -2, -3, 4}, "where");
  y.backward(on_one_rank(Tensor::from_vector<double>({10, 20, 30, 40}, {4})));
  testing::check_equal(a.grad().to_local(), Shape{4}, {10, 0, 0, 40}, "where: gradient of a");
  testing::check_equal(b.grad().to_local(), Shape{4}, {0, 20, 30, 0}, "where: gradient of b");
  a.set_grad({});
  masked_fill(a, on_one_rank(cond), 7.0).backward(on_one_rank(Tensor::from_vector<double>({1, 1, 1, 1}, {4})));
  testing::check_equal(masked_fill(a, on_one_rank(cond), 7.0).to_local(), Shape{4}, {7, 2, 3, 7}, "masked_fill");
  testing::check_equal(a.grad().to_local(), Shape{4}, {0, 1, 1, 0}, "masked_fill: gradient");
  testing::check_equal(le(a, 2.0).to_local(), Shape{4}, {1, 1, 0, 0}, "le scalar");
  testing::check_equal(ne(a, neg(b)).to_local(), Shape{4}, {0, 0, 0, 0}, "ne");
  testing::check_equal(logical_not(on_one_rank(cond)).to_local(), Shape{4}, {0, 1, 1, 0}, "logical_not");
}

TEST_CASE("Partial inputs: where and masked_fill keep the exact cases, comparisons reduce first", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor a = global_tensor({4, 2}, 12), b = global_tensor({4, 2}, 13);
    const Tensor m = gt(global_tensor({4, 2}, 14), 0.0);
    const DTensor pa = from_local(a, mesh, {Partial()}), pb = from_local(b, mesh, {Partial()});  // 2a, 2b
    const DTensor mask = distribute_tensor(m, mesh, {Replicate()});
    collective_counter().reset();
    const DTensor w = where(mask, pa, pb);
    const DTensor f = masked_fill(pa, mask, 0.0);
    CHECK(collective_counter().snapshot().empty());
    CHECK(w.placements() == Placements{Partial()});
    CHECK(f.placements() == Placements{Partial()});
    testing::check_equal(w.full_tensor(), mul(where(m, a, b), 2.0), "where of Partials");
    testing::check_equal(f.full_tensor(), mul(masked_fill(a, m, 0.0), 2.0), "masked_fill 0");
    // A value other than 0 on P(sum) would be counted once per rank: reduced first.
    const DTensor g = masked_fill(pa, mask, 3.0);
    CHECK_FALSE(g.placements()[0].is_partial());
    testing::check_equal(g.full_tensor(), masked_fill(mul(a, 2.0), m, 3.0), "masked_fill 3");
    // Comparisons need the real value.
    const DTensor c = gt(pa, 1.0);
    CHECK_FALSE(c.placements()[0].is_partial());
    testing::check_equal(c.full_tensor(), gt(mul(a, 2.0), 1.0), "gt of a Partial");
  });
}

TEST_CASE("where and masked_fill: errors name the op and the inputs", "[dtensor][ops]") {
  const DTensor a = on_one_rank(global_tensor({5, 3}, 1));
  CHECK_THROWS_AS(where(a, a, a), TypeError);
  CHECK_THROWS_WITH(where(a, a, a),
                    Catch::Contains("where") && Catch::Contains("condition") && Catch::Contains("float64[5, 3] (R)"));
  CHECK_THROWS_AS(masked_fill(a, a, 0.0), TypeError);
  CHECK_THROWS_AS(masked_fill(a, on_one_rank(gt(global_tensor({4, 3}, 1), 0.0)), 0.0), ValueError);
  CHECK_THROWS_AS(lt(a, on_one_rank(global_tensor({2}, 1))), ValueError);
}

}  // namespace
}  // namespace dtr
