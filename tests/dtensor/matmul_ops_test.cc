// matmul, bmm and linear on DTensors: gradcheck on one rank, every placement combination on
// 1-D and 2x2 meshes against the one-rank result, and the data- and tensor-parallel rules
// (placements chosen, collectives issued, values bit for bit against a float64 loop);
// linear's bias in the product's epilogue (matmul_bias) exactly where that is local, with
// the values, placements, gradients and collectives of matmul + add.
#include "dtensor/ops/matmul.h"

#include <algorithm>
#include <array>

#include "core/trace.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/view_ops.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::OpCase;

std::vector<OpCase> cases() {
  const Tensor a = global_tensor({5, 3}, 1), b = global_tensor({3, 4}, 2);
  const Tensor a3 = global_tensor({2, 5, 3}, 3), b3 = global_tensor({2, 3, 4}, 4);
  const Tensor w = global_tensor({4, 3}, 5), bias = global_tensor({4}, 6);
  return {
      {"matmul [5,3] @ [3,4]", {{a}, {b}}, [](const auto& x) { return matmul(x[0], x[1]); }},
      {"matmul [2,5,3] @ [3,4]", {{a3}, {b}}, [](const auto& x) { return matmul(x[0], x[1]); }},
      {"bmm [2,5,3] @ [2,3,4]", {{a3}, {b3}}, [](const auto& x) { return bmm(x[0], x[1]); }},
      {"linear [2,5,3] x [4,3] + [4]", {{a3}, {w}, {bias}}, [](const auto& x) { return linear(x[0], x[1], x[2]); }},
      {"linear [5,3] x [4,3], no bias", {{a}, {w}}, [](const auto& x) { return linear(x[0], x[1]); }},
      {"linear [5,3] x [4,3] + [4]", {{a}, {w}, {bias}}, [](const auto& x) { return linear(x[0], x[1], x[2]); }},
  };
}

// The names of the kernels f runs on this rank (trace spans of category kernel).
std::vector<std::string> kernels_run(const std::function<void()>& f) {
  trace::start(trace::bit(trace::Category::kKernel));
  f();
  std::vector<std::string> names;
  for (const trace::ThreadEvents& t : trace::stop()) {
    for (const trace::Event& e : t.events) names.push_back(e.name);
  }
  return names;
}

bool ran(const std::vector<std::string>& kernels, const std::string& name) {
  return std::find(kernels.begin(), kernels.end(), name) != kernels.end();
}

// out[i][j] = sum_k a[i][k] b[k][j] in float64, row-major [m, n].
std::vector<double> reference_mm(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const std::vector<double> av = testing::to_f64(a), bv = testing::to_f64(b);
  std::vector<double> out(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t q = 0; q < k; ++q) out[i * n + j] += av[i * k + q] * bv[q * n + j];
    }
  }
  return out;
}

TEST_CASE("matmul ops: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("matmul ops: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("matmul rules: data and tensor parallel placements without communication", "[dtensor][ops]") {
  testing::run_ranks(3, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {3});
    const Tensor a = global_tensor({7, 5}, 11), b = global_tensor({5, 4}, 12);
    const std::vector<double> expected = reference_mm(a, b);
    struct Rule {
      Placement a, b, out;
    };
    for (const Rule& r : {Rule{Shard(0), Replicate(), Shard(0)}, Rule{Replicate(), Shard(1), Shard(1)},
                          Rule{Shard(1), Shard(0), Partial()}, Rule{Replicate(), Replicate(), Replicate()},
                          Rule{Partial(), Replicate(), Partial()}, Rule{Replicate(), Partial(), Partial()}}) {
      INFO("a " << r.a.str() << ", b " << r.b.str());
      DTensor da = distribute_tensor(a, mesh, {r.a}), db = distribute_tensor(b, mesh, {r.b});
      collective_counter().reset();
      DTensor y = matmul(da, db);
      CHECK(issued_collectives() == 0);
      CHECK(y.placements() == Placements{r.out});
      testing::check_equal(y.full_tensor(), Shape{7, 4}, expected, "matmul " + y.to_string());
    }
    // Batch-sharded bmm stays sharded on the batch.
    const Tensor a3 = global_tensor({4, 3, 2}, 13), b3 = global_tensor({4, 2, 5}, 14);
    DTensor da3 = distribute_tensor(a3, mesh, {Shard(0)}), db3 = distribute_tensor(b3, mesh, {Shard(0)});
    collective_counter().reset();
    DTensor y3 = bmm(da3, db3);
    CHECK(issued_collectives() == 0);
    CHECK(y3.placements() == Placements{Shard(0)});
    // P x P cannot stay Partial: one operand is reduced first, and the value is right.
    DTensor pa = distribute_tensor(a, mesh, {Partial()}), pb = distribute_tensor(b, mesh, {Partial()});
    collective_counter().reset();
    reset_promised_collectives();
    DTensor pp = matmul(pa, pb);
    CHECK(issued_collectives() >= 1);
    CHECK(issued_collectives() == promised_collectives());
    testing::check_equal(pp.full_tensor(), Shape{7, 4}, expected, "matmul P x P");
  });
}

TEST_CASE("linear rules: column-wise and row-wise tensor parallel, data-parallel weight gradient", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor x = global_tensor({3, 5, 4}, 21), w = global_tensor({6, 4}, 22), bias = global_tensor({6}, 23);
    DTensor x_r = distribute_tensor(x, mesh, {Replicate()}), x_s2 = distribute_tensor(x, mesh, {Shard(2)});
    DTensor w_s0 = distribute_tensor(w, mesh, {Shard(0)}), w_s1 = distribute_tensor(w, mesh, {Shard(1)});
    DTensor bias_s0 = distribute_tensor(bias, mesh, {Shard(0)}), bias_r = distribute_tensor(bias, mesh, {Replicate()});
    collective_counter().reset();
    // Column-wise: weight rows sharded -> output features sharded.
    DTensor col = linear(x_r, w_s0, bias_s0);
    CHECK(col.placements() == Placements{Shard(2)});
    // Row-wise: input features and weight columns sharded -> Partial(sum), the bias added once.
    DTensor row = linear(x_s2, w_s1, bias_r);
    CHECK(row.placements() == Placements{Partial()});
    CHECK(issued_collectives() == 0);
    CHECK(testing::to_f64(col.full_tensor()) == testing::to_f64(row.full_tensor()));

    // Data parallel: batch-sharded input, replicated weight; the weight gradient is Partial(sum)
    // when the weight keeps its gradient unreduced.
    DTensor dx = distribute_tensor(x, mesh, {Shard(0)});
    DTensor dw = distribute_tensor(w, mesh, {Replicate()});
    dw.requires_grad_();
    dw.set_grad_placements({Partial()});
    DTensor y = linear(dx, dw);
    CHECK(y.placements() == Placements{Shard(0)});
    y.backward(distribute_tensor(global_tensor({3, 5, 6}, 24), mesh, {Shard(0)}));
    CHECK(dw.grad().placements() == Placements{Partial()});
    // grad_w[o][i] = sum over (b, t) of g[b, t, o] x[b, t, i]: g^T x as [15, 6]^T [15, 4].
    const Tensor g2 = global_tensor({3, 5, 6}, 24).reshape({15, 6}), x2 = x.reshape({15, 4});
    testing::check_equal(dw.grad().full_tensor(), w.shape(), reference_mm(g2.t().contiguous(), x2),
                         "data-parallel grad_w");
  });
}

TEST_CASE("linear adds the bias in the product's epilogue where that is local, as matmul + add would",
          "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor x = global_tensor({3, 5, 4}, 31), w = global_tensor({6, 4}, 32), bias = global_tensor({6}, 33);
    const DTensor grad = distribute_tensor(global_tensor({3, 5, 6}, 34), mesh, {Replicate()});
    struct Case {
      Placement x, w, bias, out;
      bool fused;
      int64_t collectives;  // in the forward
    };
    for (const Case& c : {
             Case{Replicate(), Replicate(), Replicate(), Replicate(), true, 0},
             Case{Shard(0), Replicate(), Replicate(), Shard(0), true, 0},  // data parallel
             Case{Shard(1), Replicate(), Replicate(), Shard(1), true, 0},
             Case{Replicate(), Shard(0), Shard(0), Shard(2), true, 0},      // column-wise: each rank its bias slice
             Case{Shard(2), Shard(1), Replicate(), Partial(), false, 0},    // row-wise: add puts the bias in once
             Case{Replicate(), Shard(0), Replicate(), Shard(2), false, 0},  // add slices the bias
             Case{Shard(0), Replicate(), Shard(0), Shard(0), false, 1},     // add gathers the bias
         }) {
      INFO("x " << c.x.str() << ", weight " << c.w.str() << ", bias " << c.bias.str());
      auto inputs = [&] {
        std::array<DTensor, 3> in{distribute_tensor(x, mesh, {c.x}), distribute_tensor(w, mesh, {c.w}),
                                  distribute_tensor(bias, mesh, {c.bias})};
        for (DTensor& t : in) t.requires_grad_();
        return in;
      };
      const std::array<DTensor, 3> fused_in = inputs(), composed_in = inputs();
      collective_counter().reset();
      reset_promised_collectives();
      DTensor y;
      const std::vector<std::string> kernels = kernels_run([&] { y = linear(fused_in[0], fused_in[1], fused_in[2]); });
      CHECK(issued_collectives() == c.collectives);
      CHECK(promised_collectives() == c.collectives);
      CHECK(y.placements() == Placements{c.out});
      CHECK(ran(kernels, "matmul_bias") == c.fused);
      CHECK(ran(kernels, "add") == !c.fused);
      // linear as it was composed before the epilogue: the same values, placements, gradients.
      const DTensor z = add(matmul(composed_in[0], transpose(composed_in[1], 0, 1)), composed_in[2]);
      CHECK(z.placements() == y.placements());
      CHECK(testing::to_f64(y.full_tensor()) == testing::to_f64(z.full_tensor()));
      collective_counter().reset();
      y.backward(grad);
      const int64_t fused_backward = issued_collectives();
      collective_counter().reset();
      z.backward(grad);
      CHECK(issued_collectives() == fused_backward);
      for (size_t i = 0; i < 3; ++i) {
        INFO("gradient of input " << i);
        REQUIRE(fused_in[i].grad().defined());
        CHECK(fused_in[i].grad().placements() == composed_in[i].grad().placements());
        CHECK(testing::to_f64(fused_in[i].grad().full_tensor()) ==
              testing::to_f64(composed_in[i].grad().full_tensor()));
      }
    }
  });
}

TEST_CASE("matmul ops: errors name the op, the operands and what is legal", "[dtensor][ops]") {
  const DeviceMesh mesh = single_rank_mesh();
  auto dt = [&](const Shape& shape, DType dtype = kFloat64) {
    return DTensor(Tensor::empty(shape, dtype), DTensorSpec(mesh, {Replicate()}, shape, dtype));
  };
  CHECK_THROWS_WITH(matmul(dt({5, 3}), dt({4, 2})),
                    Catch::Contains("matmul: float64[5, 3] (R) @ float64[4, 2] (R) do not chain") &&
                        Catch::Contains("legal: a [*, M, K] with b [K, N]"));
  CHECK_THROWS_AS(matmul(dt({2, 5, 3}), dt({3, 3, 4})), ValueError);
  CHECK_THROWS_AS(matmul(dt({3}), dt({3, 4})), ValueError);
  CHECK_THROWS_AS(matmul(dt({5, 3}), dt({3, 4}, kFloat32)), TypeError);
  CHECK_THROWS_WITH(bmm(dt({5, 3}), dt({3, 4})), Catch::Contains("bmm:") && Catch::Contains("a [B, M, K]"));
  CHECK_THROWS_WITH(linear(dt({5, 3}), dt({4, 2})),
                    Catch::Contains("linear: input float64[5, 3] (R), weight float64[4, 2] (R) and bias none"));
  CHECK_THROWS_AS(linear(dt({5, 3}), dt({4, 3}), dt({3})), ValueError);
}

}  // namespace
}  // namespace dtr
