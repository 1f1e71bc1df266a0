// dropout on DTensors: gradcheck on one rank, every placement combination on 1-D and 2x2
// meshes against the one-rank result, and the rule that matters most: the same seed gives
// the same global mask, bit for bit, under every placement.
#include "dtensor/ops/dropout.h"

#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::OpCase;

std::vector<OpCase> cases() {
  const Tensor a = global_tensor({5, 3}, 1), a3 = global_tensor({2, 5, 4}, 2);
  return {
      {"dropout p 0.5", {{a}}, [](const auto& x) { return dropout(x[0], 0.5, 7); }},
      {"dropout [2,5,4] p 0.3", {{a3}}, [](const auto& x) { return dropout(x[0], 0.3, 11); }},
  };
}

TEST_CASE("dropout: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("dropout: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("dropout: the same seed drops the same global elements under every placement", "[dtensor][ops]") {
  const Tensor x = global_tensor({9, 7}, 3);
  // Expected: every element is 0 or exactly 2x (p = 0.5 scales kept integers exactly).
  const std::vector<double> reference = testing::to_f64(
      dropout(DTensor(x, DTensorSpec(single_rank_mesh(), {Replicate()}, x.shape(), x.dtype())), 0.5, 5).to_local());
  int64_t kept = 0;
  const std::vector<double> xv = testing::to_f64(x);
  for (size_t i = 0; i < xv.size(); ++i) {
    CHECK((reference[i] == 0.0 || reference[i] == 2 * xv[i]));
    kept += reference[i] != 0.0 ? 1 : 0;
  }
  CHECK(kept > 15);
  CHECK(kept < 48);
  testing::run_ranks(4, [&](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2, 2});
    const Placements layouts[] = {{Shard(0), Shard(1)},    {Shard(1), Shard(1)},  {Shard(0), Shard(0)},
                                  {Replicate(), Shard(0)}, {Partial(), Shard(1)}, {Replicate(), Replicate()}};
    for (const Placements& p : layouts) {
      DTensor y = dropout(distribute_tensor(x, mesh, p), 0.5, 5);
      testing::check_equal(y.full_tensor(), x.shape(), reference, "dropout under " + placements_str(p));
    }
  });
}

TEST_CASE("dropout: p = 0 keeps everything, p = 1 drops everything, other p are errors", "[dtensor][ops]") {
  const Tensor x = global_tensor({4, 3}, 4);
  DTensor dx(x, DTensorSpec(single_rank_mesh(), {Replicate()}, x.shape(), x.dtype()));
  testing::check_equal(dropout(dx, 0.0, 1).to_local(), x, "p = 0");
  testing::check_equal(dropout(dx, 1.0, 1).to_local(), x.shape(), std::vector<double>(12, 0.0), "p = 1");
  CHECK_THROWS_WITH(dropout(dx, 1.5, 1),
                    Catch::Contains("dropout: p = 1.5 for float64[4, 3] (R); the drop probability must lie in [0, 1]"));
}

}  // namespace
}  // namespace dtr
