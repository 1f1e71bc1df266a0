// Scaled dot-product attention and causal_mask_fill on DTensors: gradcheck on one rank,
// every placement combination on 1-D and 2x2 meshes against the one-rank result, and the
// batch-, head- and query-parallel cases without communication against a float64 loop;
// each for the composed path and the fused kernel (kernels/attention.h) on CPU ranks.
#include "dtensor/ops/attention.h"

#include <cmath>

#include "kernels/elementwise.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::OpCase;

// Integer data scaled down so that softmax is not saturated (its gradients stay finite-difference friendly).
Tensor small(const Shape& shape, uint64_t seed) { return mul(global_tensor(shape, seed), 0.125); }

// The fused backend where the placements allow it, the composed one elsewhere.
DTensor fused_where_it_fits(const DTensor& q, const DTensor& k, const DTensor& v, Causal causal,
                            std::optional<double> scale = std::nullopt) {
  const AttentionBackend backend =
      fused_attention_fits(q, k, v) ? AttentionBackend::kFused : AttentionBackend::kComposed;
  return scaled_dot_product_attention(q, k, v, causal, scale, backend);
}

std::vector<OpCase> cases() {
  const Tensor q = small({2, 5, 3}, 1), k = small({2, 5, 3}, 2), v = small({2, 5, 2}, 3);
  const Tensor q4 = small({2, 2, 3, 2}, 4), k4 = small({2, 2, 4, 2}, 5), v4 = small({2, 2, 4, 3}, 6);
  const Tensor scores = global_tensor({2, 5, 4}, 7);
  return {
      {"causal_mask_fill [2,5,4] with -3", {{scores}}, [](const auto& x) { return causal_mask_fill(x[0], -3.0); }},
      {"causal_mask_fill [2,5,4] with 0", {{scores}}, [](const auto& x) { return causal_mask_fill(x[0], 0.0); }},
      {"causal attention [2,5,3]",
       {{q}, {k}, {v}},
       [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], Causal::kYes); }},
      {"attention [2,2,3,2] x [2,2,4,2], scale 0.7",
       {{q4}, {k4}, {v4}},
       [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], Causal::kNo, 0.7); }},
      {"fused causal attention [2,5,3]",
       {{q}, {k}, {v}},
       [](const auto& x) { return fused_where_it_fits(x[0], x[1], x[2], Causal::kYes); }},
      {"fused attention [2,2,3,2] x [2,2,4,2], scale 0.7",
       {{q4}, {k4}, {v4}},
       [](const auto& x) { return fused_where_it_fits(x[0], x[1], x[2], Causal::kNo, 0.7); }},
  };
}

TEST_CASE("attention ops: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("attention ops: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("attention rules: batch, head and query sharding need no communication", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const int64_t B = 2, H = 3, T = 5, E = 4;
    const Tensor q = small({B, H, T, E}, 11), k = small({B, H, T, E}, 12), v = small({B, H, T, E}, 13);
    // Reference: causal softmax(q k^T / sqrt(E)) v per (b, h), in float64.
    const std::vector<double> qv = testing::to_f64(q), kv = testing::to_f64(k), vv = testing::to_f64(v);
    std::vector<double> out(B * H * T * E, 0.0);
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t base = bh * T * E;
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> w(i + 1);
        double total = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < E; ++e) dot += qv[base + i * E + e] * kv[base + j * E + e];
          w[j] = std::exp(dot / std::sqrt(static_cast<double>(E)));
          total += w[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < E; ++e) out[base + i * E + e] += w[j] / total * vv[base + j * E + e];
        }
      }
    }
    struct Rule {
      Placement q, kv, out;
    };
    for (const Rule& r : {Rule{Shard(0), Shard(0), Shard(0)}, Rule{Shard(1), Shard(1), Shard(1)},
                          Rule{Shard(2), Replicate(), Shard(2)}}) {
      INFO("q " << r.q.str() << ", k and v " << r.kv.str());
      DTensor dq = distribute_tensor(q, mesh, {r.q});
      DTensor dk = distribute_tensor(k, mesh, {r.kv}), dv = distribute_tensor(v, mesh, {r.kv});
      collective_counter().reset();
      DTensor y = scaled_dot_product_attention(dq, dk, dv, Causal::kYes);
      CHECK(issued_collectives() == 0);
      CHECK(y.placements() == Placements{r.out});
      testing::check_close(y.full_tensor(), Shape{B, H, T, E}, out, "causal attention " + y.to_string());
      // The fused kernel: no collective forward; backward, none but the reduction of k's
      // and v's Partial gradients into their Replicate leaves where only q's rows are
      // sharded; the gradients equal the composed path's.
      const DTensor grad_out = distribute_tensor(small({B, H, T, E}, 14), mesh, {r.out});
      std::vector<std::vector<Tensor>> grads;
      for (AttentionBackend backend : {AttentionBackend::kComposed, AttentionBackend::kFused}) {
        DTensor fq = distribute_tensor(q, mesh, {r.q}).requires_grad_();
        DTensor fk = distribute_tensor(k, mesh, {r.kv}).requires_grad_();
        DTensor fv = distribute_tensor(v, mesh, {r.kv}).requires_grad_();
        REQUIRE(fused_attention_fits(fq, fk, fv));
        collective_counter().reset();
        DTensor fy = scaled_dot_product_attention(fq, fk, fv, Causal::kYes, std::nullopt, backend);
        if (backend == AttentionBackend::kComposed) {
          fy.backward(grad_out);
        } else {
          CHECK(issued_collectives() == 0);
          CHECK(fy.placements() == Placements{r.out});
          testing::check_close(fy.full_tensor(), Shape{B, H, T, E}, out, "fused causal attention " + fy.to_string());
          collective_counter().reset();
          fy.backward(grad_out);
          CHECK(issued_collectives() == (r.kv.is_replicate() ? 2 : 0));
        }
        CHECK(fq.grad().placements() == Placements{r.q});
        CHECK(fk.grad().placements() == Placements{r.kv});
        grads.push_back({fq.grad().full_tensor(), fk.grad().full_tensor(), fv.grad().full_tensor()});
      }
      for (int g = 0; g < 3; ++g) {
        testing::check_close(grads[1][g], grads[0][g], fmt::format("fused gradient {} of q, k, v", g));
      }
    }
    // Keys sharded along Tk are not whole problems: the fused backend says so.
    const DTensor rq = distribute_tensor(q, mesh, {Replicate()});
    const DTensor sk = distribute_tensor(k, mesh, {Shard(2)}), sv = distribute_tensor(v, mesh, {Shard(2)});
    CHECK_FALSE(fused_attention_fits(rq, sk, sv));
    CHECK_THROWS_MATCHES(scaled_dot_product_attention(rq, sk, sv, Causal::kYes, std::nullopt, AttentionBackend::kFused),
                         ValueError,
                         testing::MessageContains("the fused backend needs each rank's chunks to be whole problems") &&
                             testing::MessageContains("got q [R], k [S(2)], v [S(2)]"));
  });
}

TEST_CASE("causal_mask_fill: exact values by global index; Partial only for a zero fill", "[dtensor][ops]") {
  testing::run_ranks(3, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {3});
    const Tensor x = global_tensor({4, 6}, 21);
    std::vector<double> expected = testing::to_f64(x);
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = i + 1; j < 6; ++j) expected[i * 6 + j] = -1.5;
    }
    for (const Placement& p : {Shard(0), Shard(1), Replicate()}) {
      DTensor dx = distribute_tensor(x, mesh, {p});
      collective_counter().reset();
      DTensor y = causal_mask_fill(dx, -1.5);
      CHECK(issued_collectives() == 0);
      CHECK(y.placements() == Placements{p});
      testing::check_equal(y.full_tensor(), x.shape(), expected, "causal_mask_fill under " + p.str());
    }
    DTensor partial = distribute_tensor(x, mesh, {Partial()});
    CHECK(causal_mask_fill(partial, 0.0).placements() == Placements{Partial()});
    // A non-zero fill of a Partial input would be added once per term: it is reduced first.
    DTensor filled = causal_mask_fill(partial, -1.5);
    CHECK_FALSE(filled.placements() == Placements{Partial()});
    testing::check_equal(filled.full_tensor(), x.shape(), expected, "causal_mask_fill of a Partial input");
  });
}

TEST_CASE("attention ops: errors name q, k and v and what is legal", "[dtensor][ops]") {
  const DeviceMesh mesh = single_rank_mesh();
  auto dt = [&](const Shape& shape, DType dtype = kFloat64) {
    return DTensor(Tensor::empty(shape, dtype), DTensorSpec(mesh, {Replicate()}, shape, dtype));
  };
  CHECK_THROWS_WITH(scaled_dot_product_attention(dt({2, 5, 3}), dt({2, 5, 4}), dt({2, 5, 3})),
                    Catch::Contains("scaled_dot_product_attention: q float64[2, 5, 3] (R), k float64[2, 5, 4] (R), "
                                    "v float64[2, 5, 3] (R) do not fit"));
  CHECK_THROWS_AS(scaled_dot_product_attention(dt({2, 5, 3}), dt({3, 5, 3}), dt({3, 5, 3})), ValueError);
  CHECK_THROWS_AS(scaled_dot_product_attention(dt({5, 3}), dt({5, 3}), dt({5, 3}, kFloat32)), TypeError);
  CHECK_THROWS_WITH(causal_mask_fill(dt({5}), 0.0),
                    Catch::Contains("causal_mask_fill: input float64[5] (R) must have at least 2 dims"));
}

}  // namespace
}  // namespace dtr
