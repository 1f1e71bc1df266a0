// Unary elementwise ops on DTensors (activations, exp/log/sqrt/rsqrt/pow, scalar division,
// dtype casts) and the fused backward kernels as DTensor ops: gradcheck on one rank, every
// placement combination on 1-D and 2x2 meshes against the one-rank result, forward values
// against float64 loops written here, the strategy a Partial input gets, relu's backward
// in place on a gradient nothing else holds, and relu_ in place on a tensor nothing else holds.
#include <cmath>

#include "core/allocator.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/reduce.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "kernels/matmul.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::on_one_rank;
using testing::OpCase;
using testing::OpInput;

const Tensor& small() {  // [5, 3], values in [-2, 2]
  static const Tensor t = mul(global_tensor({5, 3}, 1), 0.25);
  return t;
}
const Tensor& positive() {  // [5, 3], values in [1, 9]
  static const Tensor t = add(abs(global_tensor({5, 3}, 2)), 1.0);
  return t;
}
const Tensor& no_zeros() {  // [2, 5, 4], values k + 0.5: relu is smooth at each of them
  static const Tensor t = add(global_tensor({2, 5, 4}, 3), 0.5);
  return t;
}

std::vector<OpCase> differentiable_cases() {
  const Tensor cube = mul(global_tensor({2, 5, 4}, 4), 0.25);
  return {
      {"exp", {{small()}}, [](const auto& x) { return exp(x[0]); }},
      {"log", {{positive()}}, [](const auto& x) { return log(x[0]); }},
      {"sqrt", {{positive()}}, [](const auto& x) { return sqrt(x[0]); }},
      {"rsqrt", {{positive()}}, [](const auto& x) { return rsqrt(x[0]); }},
      {"pow 3", {{small()}}, [](const auto& x) { return pow(x[0], 3.0); }},
      {"pow -1.5", {{positive()}}, [](const auto& x) { return pow(x[0], -1.5); }},
      {"pow 0", {{small()}}, [](const auto& x) { return pow(x[0], 0.0); }},
      {"tanh", {{small()}}, [](const auto& x) { return tanh(x[0]); }},
      {"sigmoid", {{cube}}, [](const auto& x) { return sigmoid(x[0]); }},
      {"relu", {{no_zeros()}}, [](const auto& x) { return relu(x[0]); }},
      {"gelu", {{small()}}, [](const auto& x) { return gelu(x[0]); }},
      {"gelu tanh", {{cube}}, [](const auto& x) { return gelu(x[0], GeluApproximation::kTanh); }},
      {"silu", {{small()}}, [](const auto& x) { return silu(x[0]); }},
      {"div scalar", {{small()}}, [](const auto& x) { return div(x[0], 4.0); }},
  };
}

// Ops checked on ranks but not by finite differences: the backward kernels (not
// differentiable) and a cast to float32 (whose rounding finite differences cannot see past).
std::vector<OpCase> forward_cases() {
  const Tensor grad = global_tensor({5, 3}, 5);
  auto no_grad = [](const Tensor& t) { return OpInput{t, false}; };
  return {
      {"relu_backward",
       {no_grad(grad), no_grad(add(small(), 0.125))},
       [](const auto& x) { return relu_backward(x[0], x[1]); }},
      {"gelu_backward", {no_grad(grad), no_grad(small())}, [](const auto& x) { return gelu_backward(x[0], x[1]); }},
      {"gelu_backward tanh",
       {no_grad(grad), no_grad(small())},
       [](const auto& x) { return gelu_backward(x[0], x[1], GeluApproximation::kTanh); }},
      {"silu_backward", {no_grad(grad), no_grad(small())}, [](const auto& x) { return silu_backward(x[0], x[1]); }},
      {"sigmoid_backward",
       {no_grad(grad), no_grad(sigmoid(small()))},
       [](const auto& x) { return sigmoid_backward(x[0], x[1]); }},
      {"tanh_backward",
       {no_grad(grad), no_grad(tanh(small()))},
       [](const auto& x) { return tanh_backward(x[0], x[1]); }},
      {"to float32", {{small()}}, [](const auto& x) { return to(x[0], kFloat32); }},
  };
}

TEST_CASE("unary ops: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : differentiable_cases()) testing::gradcheck(c);
}

TEST_CASE("unary ops and backward kernels: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : differentiable_cases()) testing::check_distributed(c, mesh);
    for (const OpCase& c : forward_cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("unary ops: values against float64 loops", "[dtensor][ops]") {
  const Tensor x = small(), p = positive();
  const std::vector<double> xv = testing::to_f64(x), pv = testing::to_f64(p);
  auto expect = [](const std::vector<double>& in, auto f) {
    std::vector<double> out;
    for (double v : in) out.push_back(f(v));
    return out;
  };
  auto sigmoid_ref = [](double v) { return 1 / (1 + std::exp(-v)); };
  const DTensor dx = on_one_rank(x), dp = on_one_rank(p);
  const testing::Tolerance tol{1e-14, 1e-14};
  testing::check_close(exp(dx).to_local(), x.shape(), expect(xv, [](double v) { return std::exp(v); }), tol, "exp");
  testing::check_close(log(dp).to_local(), p.shape(), expect(pv, [](double v) { return std::log(v); }), tol, "log");
  testing::check_close(rsqrt(dp).to_local(), p.shape(), expect(pv, [](double v) { return 1 / std::sqrt(v); }), tol,
                       "rsqrt");
  testing::check_close(pow(dp, -1.5).to_local(), p.shape(), expect(pv, [](double v) { return std::pow(v, -1.5); }), tol,
                       "pow");
  testing::check_close(tanh(dx).to_local(), x.shape(), expect(xv, [](double v) { return std::tanh(v); }), tol, "tanh");
  testing::check_close(sigmoid(dx).to_local(), x.shape(), expect(xv, sigmoid_ref), tol, "sigmoid");
  testing::check_close(silu(dx).to_local(), x.shape(), expect(xv, [&](double v) { return v * sigmoid_ref(v); }), tol,
                       "silu");
  testing::check_close(gelu(dx).to_local(), x.shape(),
                       expect(xv, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }), tol, "gelu");
  testing::check_close(
      gelu(dx, GeluApproximation::kTanh).to_local(), x.shape(),
      expect(xv, [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }),
      tol, "gelu tanh");
  // Known exactly: square roots of perfect squares, relu of halves, x / 4.
  const Tensor squares = Tensor::from_vector<double>({0, 1, 4, 9, 16, 25, 36}, {7});
  testing::check_equal(sqrt(on_one_rank(squares)).to_local(), Shape{7}, {0, 1, 2, 3, 4, 5, 6}, "sqrt of squares");
  const Tensor halves = Tensor::from_vector<double>({-1.5, -0.5, 0, 0.5, 1.5}, {5});
  testing::check_equal(relu(on_one_rank(halves)).to_local(), Shape{5}, {0, 0, 0, 0.5, 1.5}, "relu");
  testing::check_equal(div(on_one_rank(halves), 4.0).to_local(), Shape{5}, {-0.375, -0.125, 0, 0.125, 0.375},
                       "div scalar");
}

TEST_CASE("unary ops: float32 and bfloat16 shards equal the one-rank result bit for bit", "[dtensor][ops]") {
  testing::run_ranks(3, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {3});
    for (DType dtype : {kFloat32, kBFloat16}) {
      const Tensor x = testing::random_tensor({7, 5}, dtype, 9, -3, 3);
      const DTensor d = distribute_tensor(x, mesh, {Shard(0)});
      testing::check_equal(gelu(d).full_tensor(), gelu(x), "gelu " + std::string(dtype_name(dtype)));
      testing::check_equal(silu(d).full_tensor(), silu(x), "silu " + std::string(dtype_name(dtype)));
    }
  });
}

TEST_CASE("a Partial input to a nonlinear op is reduced first, by the cheapest collective", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor a = global_tensor({4, 2}, 6);
    const DTensor p = from_local(a, mesh, {Partial()});  // value 2a
    collective_counter().reset();
    const DTensor y = exp(p);
    // reduce_scatter moves half the bytes of an all_reduce; the output is sharded.
    CHECK(collective_counter().calls(CollectiveKind::kReduceScatter) == 1);
    CHECK(collective_counter().calls(CollectiveKind::kAllReduce) == 0);
    CHECK(y.placements() == Placements{Shard(0)});
    testing::check_close(y.full_tensor(), exp(mul(a, 2.0)), "exp of a Partial");
  });
}

TEST_CASE("backward kernels keep a Partial gradient; linear ops keep Partial", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor g = global_tensor({4, 3}, 7), x = add(global_tensor({4, 3}, 8), 0.5);
    const DTensor gp = from_local(g, mesh, {Partial()});  // value 2g
    const DTensor xr = distribute_tensor(x, mesh, {Replicate()});
    collective_counter().reset();
    const DTensor dx = relu_backward(gp, xr);
    const DTensor half = div(gp, 2.0);
    const DTensor cast = to(gp, kFloat32);
    CHECK(collective_counter().snapshot().empty());
    CHECK(dx.placements() == Placements{Partial()});
    CHECK(half.placements() == Placements{Partial()});
    CHECK(cast.placements() == Placements{Partial()});
    testing::check_equal(dx.full_tensor(), relu_backward(mul(g, 2.0), x), "relu_backward");
    testing::check_equal(half.full_tensor(), g, "P / 2");
    testing::check_equal(cast.full_tensor(), mul(g, 2.0), "to float32");
  });
}

TEST_CASE("to: gradients convert back; integer casts take none", "[dtensor][ops]") {
  DTensor x = on_one_rank(small().clone());
  x.requires_grad_();
  sum(to(x, kFloat32)).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == kFloat64);
  testing::check_equal(x.grad().to_local(), x.shape(), std::vector<double>(15, 1.0), "gradient through to(float32)");
  CHECK_FALSE(to(x, kInt64).requires_grad());
}

TEST_CASE("unary ops: errors name the op and the inputs", "[dtensor][ops]") {
  DTensor g = on_one_rank(small().clone());
  const DTensor x = on_one_rank(small());
  g.requires_grad_();
  CHECK_THROWS_AS(relu_backward(g, x), NotImplementedError);
  CHECK_THROWS_WITH(relu_backward(g, x), Catch::Contains("relu_backward") && Catch::Contains("float64[5, 3] (R)") &&
                                             Catch::Contains("NoGradGuard"));
  {
    NoGradGuard no_grad;
    CHECK_NOTHROW(relu_backward(g, x));
  }
  CHECK_THROWS_AS(relu_backward(x, on_one_rank(global_tensor({4, 3}, 1))), ValueError);
}

TEST_CASE("relu's backward masks a gradient nothing else holds in place, and not a shared one", "[dtensor][ops]") {
  // h = x w [1024, 256] (1 MiB of float32) with both signs; loss = sum(relu(h) * 3): mul's
  // backward makes relu's gradient (one buffer of h's size), relu masks it in place, and
  // the product's backward makes x's gradient (1/64 of it): one buffer of h's size at the
  // peak, not two.
  constexpr int64_t rows = 1024, width = 256;
  DTensor x = on_one_rank(global_tensor({rows, 4}, 3).to(kFloat32));
  x.requires_grad_();
  const DTensor w = on_one_rank(global_tensor({4, width}, 4).to(kFloat32));
  const DTensor h = matmul(x, w);
  const DTensor loss = sum(mul(relu(h), 3.0));
  reset_peak_memory_stats(kCPU);
  const int64_t before = memory_stats(kCPU).bytes_in_use;
  loss.backward();
  const int64_t bytes = rows * width * 4;
  INFO("backward's peak above the start: " << memory_stats(kCPU).peak_bytes - before << " B, h " << bytes << " B");
  CHECK(memory_stats(kCPU).peak_bytes - before < bytes + bytes / 4);
  const Tensor hl = h.to_local();
  testing::check_equal(x.grad().to_local(), matmul(relu_backward(full({rows, width}, 3.0), hl), w.to_local().t()),
                       "x's gradient through the mask applied in place");
  const Tensor signs = sub(global_tensor({1 << 16}, 3), 0.5).to(kFloat32);
  const Tensor expected = relu_backward(full({1 << 16}, 3.0), signs);

  // add's backward hands one gradient to both relus: the first must not mask it for the
  // second (x and -x: opposite masks, so a shared mask would zero both gradients).
  DTensor a = on_one_rank(signs), b = on_one_rank(neg(signs));
  a.requires_grad_();
  b.requires_grad_();
  const DTensor three_n = on_one_rank(full({1 << 16}, 3.0));
  sum(mul(add(relu(a), relu(b)), three_n)).backward();
  testing::check_equal(a.grad().to_local(), expected, "a's gradient");
  testing::check_equal(b.grad().to_local(), relu_backward(full({1 << 16}, 3.0), neg(signs)), "b's gradient");
}

TEST_CASE("relu_ overwrites a product nothing else holds and rebases its graph; otherwise it leaves it alone",
          "[dtensor][ops]") {
  // h = x w with both signs; y = relu_(h) must reuse h's buffer (allocating only the mask),
  // and sum(y * 3)'s gradient must be relu's.
  constexpr int64_t rows = 256, width = 64;
  DTensor x = on_one_rank(global_tensor({rows, 4}, 3).to(kFloat32));
  x.requires_grad_();
  const DTensor w = on_one_rank(global_tensor({4, width}, 4).to(kFloat32));
  const Tensor expected = relu(matmul(x.to_local(), w.to_local()));
  DTensor h = matmul(x, w);
  // Hooks registered before relu_ stay on h's former node (PyTorch's rule: they see the
  // gradient of the value before the in-place op), and remove_hook still finds them.
  int seen = 0, removed_calls = 0;
  Tensor hook_grad;
  h.register_hook([&](const DTensor& g) {
    ++seen;
    hook_grad = g.to_local().clone();
    return DTensor();
  });
  const int removed = h.register_hook([&](const DTensor&) {
    ++removed_calls;
    return DTensor();
  });
  const void* buffer = h.to_local().data();
  const int64_t before = memory_stats(kCPU).bytes_in_use;
  DTensor y = relu_(h);
  CHECK(memory_stats(kCPU).bytes_in_use - before < rows * width * 4 / 8);
  CHECK(y.to_local().data() == buffer);
  CHECK(y.grad_fn()->name() == "relu");
  testing::check_equal(y.to_local(), expected, "relu_ in place");
  y.remove_hook(removed);
  h = DTensor();
  sum(mul(y, 3.0)).backward();
  const Tensor gy = relu_backward(full({rows, width}, 3.0), expected);
  CHECK(seen == 1);
  CHECK(removed_calls == 0);
  testing::check_equal(hook_grad, gy, "a hook registered before relu_: the gradient before relu");
  testing::check_equal(x.grad().to_local(), matmul(gy, w.to_local().t()), "x's gradient through relu_");

  // Held elsewhere (a second handle), or a leaf that requires grad: relu(x), x untouched.
  const DTensor kept = matmul(x, w);
  const DTensor other = kept;
  const DTensor out = relu_(kept);
  CHECK(out.to_local().data() != kept.to_local().data());
  testing::check_equal(kept.to_local(), matmul(x.to_local(), w.to_local()), "a held tensor stays");
  testing::check_equal(out.to_local(), expected, "relu of a held tensor");
  DTensor leaf = on_one_rank(sub(global_tensor({5}, 6), 0.5));
  leaf.requires_grad_();
  const Tensor leaf_values = leaf.to_local().clone();
  const DTensor from_leaf = relu_(leaf);
  testing::check_equal(leaf.to_local(), leaf_values, "a leaf that requires grad stays");
  testing::check_equal(from_leaf.to_local(), relu(leaf_values), "relu of the leaf");
}

TEST_CASE("is_sole_owner: no other handle, view or tensor on the storage", "[dtensor]") {
  const DTensor x = on_one_rank(global_tensor({4, 3}, 5));
  CHECK(x.is_sole_owner());
  {
    const DTensor copy = x;
    CHECK_FALSE(x.is_sole_owner());
  }
  CHECK(x.is_sole_owner());
  const Tensor view = x.to_local().narrow(0, 0, 1);
  CHECK_FALSE(x.is_sole_owner());
}

}  // namespace
}  // namespace dtr
