// softmax and log_softmax on DTensors: gradcheck on one rank, every placement combination
// on 1-D and 2x2 meshes against the one-rank result, and the rule (sharding off the
// normalised dim stays, on it is gathered) against a float64 loop.
#include "dtensor/ops/softmax.h"

#include <cmath>

#include "kernels/fill.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::OpCase;

std::vector<OpCase> cases() {
  const Tensor a = global_tensor({5, 3}, 1), a3 = global_tensor({2, 5, 4}, 2);
  return {
      {"softmax dim -1", {{a}}, [](const auto& x) { return softmax(x[0], -1); }},
      {"softmax dim 0", {{a}}, [](const auto& x) { return softmax(x[0], 0); }},
      {"log_softmax [2,5,4] dim 1", {{a3}}, [](const auto& x) { return log_softmax(x[0], 1); }},
      {"log_softmax [2,5,4] dim 2", {{a3}}, [](const auto& x) { return log_softmax(x[0], 2); }},
  };
}

TEST_CASE("softmax ops: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("softmax ops: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("softmax rules: rows stay sharded, the normalised dim is gathered, Partial is reduced", "[dtensor][ops]") {
  testing::run_ranks(3, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {3});
    const Tensor x = global_tensor({7, 4}, 5);
    // Reference: y[i][j] = exp(x[i][j]) / sum_k exp(x[i][k]), log y likewise, in float64.
    const std::vector<double> xv = testing::to_f64(x);
    std::vector<double> soft(xv.size()), logsoft(xv.size());
    for (int64_t i = 0; i < 7; ++i) {
      double total = 0;
      for (int64_t j = 0; j < 4; ++j) total += std::exp(xv[i * 4 + j]);
      for (int64_t j = 0; j < 4; ++j) {
        soft[i * 4 + j] = std::exp(xv[i * 4 + j]) / total;
        logsoft[i * 4 + j] = xv[i * 4 + j] - std::log(total);
      }
    }
    DTensor rows = distribute_tensor(x, mesh, {Shard(0)});
    DTensor cols = distribute_tensor(x, mesh, {Shard(1)});
    DTensor partial = distribute_tensor(x, mesh, {Partial()});
    collective_counter().reset();
    DTensor y = softmax(rows, -1);
    CHECK(issued_collectives() == 0);
    CHECK(y.placements() == Placements{Shard(0)});
    testing::check_close(y.full_tensor(), x.shape(), soft, "softmax of S(0) rows");
    for (const DTensor& in : {cols, partial}) {
      collective_counter().reset();
      reset_promised_collectives();
      DTensor z = log_softmax(in, 1);
      CHECK(issued_collectives() == 1);
      CHECK(issued_collectives() == promised_collectives());
      CHECK_FALSE(z.placements() == Placements{Shard(1)});
      testing::check_close(z.full_tensor(), x.shape(), logsoft, "log_softmax of " + in.to_string());
    }
    // Rows of one value: every probability is exactly 1/4.
    DTensor flat = distribute_tensor(full({5, 4}, 3.0, kFloat64), mesh, {Shard(0)});
    testing::check_equal(softmax(flat, 1).full_tensor(), Shape{5, 4}, std::vector<double>(20, 0.25),
                         "softmax of equal values");
  });
}

TEST_CASE("softmax ops: errors name the op and the input", "[dtensor][ops]") {
  const DeviceMesh mesh = single_rank_mesh();
  DTensor ints(Tensor::empty({2, 3}, kInt64), DTensorSpec(mesh, {Replicate()}, {2, 3}, kInt64));
  CHECK_THROWS_WITH(softmax(ints, 1), Catch::Contains("softmax: input int64[2, 3] (R) is not floating"));
  DTensor x(Tensor::empty({2, 3}, kFloat64), DTensorSpec(mesh, {Replicate()}, {2, 3}, kFloat64));
  CHECK_THROWS_AS(log_softmax(x, 2), IndexError);
}

}  // namespace
}  // namespace dtr
