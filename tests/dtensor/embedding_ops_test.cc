// embedding on DTensors: gradcheck on one rank, every placement combination on 1-D and 2x2
// meshes against the one-rank result (uneven row shards included), and the rules: a
// row-sharded table gives Partial through a masked lookup, a batch-sharded lookup gives a
// Partial weight gradient; values bit for bit against a float64 loop.
#include "dtensor/ops/embedding.h"

#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::OpCase;

// Indices into 7 rows that touch the first and last row of every shard on 2, 3 and 4 ranks.
Tensor table_indices() { return Tensor::from_vector<int64_t>({0, 6, 3, 3, 1, 5, 2, 6}, {2, 4}); }

std::vector<OpCase> cases() {
  const Tensor weight = global_tensor({7, 3}, 1);
  const Tensor flat = Tensor::from_vector<int64_t>({4, 0, 6, 4, 2});
  return {
      {"embedding [7,3] at [2,4]",
       {{weight}, {table_indices(), false, false}},
       [](const auto& x) { return embedding(x[0], x[1]); }},
      {"embedding [7,3] at [5]", {{weight}, {flat, false, false}}, [](const auto& x) { return embedding(x[0], x[1]); }},
  };
}

TEST_CASE("embedding: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("embedding: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("embedding rules: masked row-wise lookup, column-wise, batch; Partial weight gradient", "[dtensor][ops]") {
  testing::run_ranks(3, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {3});
    const Tensor weight = global_tensor({7, 3}, 2), idx = table_indices();
    const Tensor g = global_tensor({2, 4, 3}, 3);
    // Reference: out[p][d] = weight[idx[p]][d]; grad_weight[v][d] = sum of g[p][d] over idx[p] == v.
    const std::vector<double> wv = testing::to_f64(weight), gv = testing::to_f64(g);
    std::vector<double> out(24), grad_w(21, 0.0);
    for (int64_t p = 0; p < 8; ++p) {
      const int64_t v = idx.data_ptr<int64_t>()[p];
      for (int64_t d = 0; d < 3; ++d) {
        out[p * 3 + d] = wv[v * 3 + d];
        grad_w[v * 3 + d] += gv[p * 3 + d];
      }
    }
    struct Rule {
      Placement weight, indices, out;
    };
    for (const Rule& r : {Rule{Shard(0), Replicate(), Partial()}, Rule{Shard(1), Replicate(), Shard(2)},
                          Rule{Replicate(), Shard(1), Shard(1)}, Rule{Replicate(), Replicate(), Replicate()}}) {
      INFO("weight " << r.weight.str() << ", indices " << r.indices.str());
      DTensor dw = distribute_tensor(weight, mesh, {r.weight}), di = distribute_tensor(idx, mesh, {r.indices});
      collective_counter().reset();
      DTensor y = embedding(dw, di);
      CHECK(issued_collectives() == 0);
      CHECK(y.placements() == Placements{r.out});
      testing::check_equal(y.full_tensor(), Shape{2, 4, 3}, out, "embedding " + y.to_string());
    }
    // Batch-sharded lookup: the weight gradient is Partial(sum) before any reduction.
    DTensor dw = distribute_tensor(weight, mesh, {Replicate()});
    dw.requires_grad_();
    dw.set_grad_placements({Partial()});
    DTensor di = distribute_tensor(idx, mesh, {Shard(0)}), dg = distribute_tensor(g, mesh, {Shard(0)});
    embedding(dw, di).backward(dg);
    CHECK(dw.grad().placements() == Placements{Partial()});
    testing::check_equal(dw.grad().full_tensor(), weight.shape(), grad_w, "grad_weight of a batch-sharded lookup");
    // Row-wise table: its gradient lands on its own rows.
    DTensor rows = distribute_tensor(weight, mesh, {Shard(0)});
    rows.requires_grad_();
    embedding(rows, distribute_tensor(idx, mesh, {Replicate()})).backward(distribute_tensor(g, mesh, {Replicate()}));
    CHECK(rows.grad().placements() == Placements{Shard(0)});
    testing::check_equal(rows.grad().full_tensor(), weight.shape(), grad_w, "grad_weight of a row-wise table");
    // An index out of range is an IndexError on every rank, even where no rank holds the row.
    DTensor bad = distribute_tensor(Tensor::from_vector<int64_t>({1, 7}), mesh, {Replicate()});
    CHECK_THROWS_WITH(embedding(rows.detach(), bad),
                      Catch::Contains("embedding: indices int64[2] (R) hold values in [1, 7]; weight float64[7, 3] "
                                      "(S(0)) has rows [0, 7)"));
  });
}

TEST_CASE("embedding: errors name the weight and the indices", "[dtensor][ops]") {
  const DeviceMesh mesh = single_rank_mesh();
  auto dt = [&](const Shape& shape, DType dtype) {
    return DTensor(Tensor::empty(shape, dtype), DTensorSpec(mesh, {Replicate()}, shape, dtype));
  };
  CHECK_THROWS_WITH(embedding(dt({7}, kFloat64), dt({2}, kInt64)),
                    Catch::Contains("embedding: weight float64[7] (R) must be a floating"));
  CHECK_THROWS_WITH(embedding(dt({7, 3}, kFloat64), dt({2}, kFloat64)),
                    Catch::Contains("embedding: indices float64[2] (R) must be int32 or int64"));
}

}  // namespace
}  // namespace dtr
