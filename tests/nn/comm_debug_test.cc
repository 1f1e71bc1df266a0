// CommDebugMode on 2 ranks: a tensor-parallel MLP's collectives land on the modules and
// phases the plan puts them in; the strict mode is silent under the plan and refuses an
// implicit redistribute (a row layer left out of the plan), which the report mode records
// with the op that caused it.
#include "nn/comm_debug.h"

#include <catch2/catch.hpp>

#include "collectives/init.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/reduce.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/tensor_parallel.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

// fc1 (col) -> ReLU -> fc2 (row) -> fc3 (col) -> ReLU -> fc4 (row).
std::shared_ptr<Sequential> make_mlp() {
  manual_seed(3);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(8, 16), std::make_shared<ReLU>(), std::make_shared<Linear>(16, 8),
      std::make_shared<Linear>(8, 12), std::make_shared<ReLU>(), std::make_shared<Linear>(12, 8)});
}

ParallelPlan full_plan() {
  return {{"0", std::make_shared<ColwiseParallel>()},
          {"2", std::make_shared<RowwiseParallel>()},
          {"3", std::make_shared<ColwiseParallel>()},
          {"5", std::make_shared<RowwiseParallel>()}};
}

// The input, Replicate on the tp mesh.
DTensor input(const DeviceMesh& mesh) {
  return distribute_tensor(testing::random_tensor({4, 8}, kFloat32, 5), mesh, {Replicate()});
}

// One forward and backward of `mlp`, the loss mean(y^2).
void step(Sequential& mlp, const DTensor& x) {
  const DTensor y = mlp(x);
  mean(mul(y, y)).backward();
}

TEST_CASE("CommDebugMode puts a tensor-parallel step's collectives on their modules and phases", "[nn][comm_debug]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"tp"});
    std::shared_ptr<Sequential> mlp = make_mlp();
    parallelize_module(*mlp, mesh, full_plan());
    const DTensor x = input(mesh);
    const CommDebugMode debug(*mlp, ImplicitRedistributes::kRaise);  // silent under the plan
    step(*mlp, x);
    INFO(debug.table());
    // Each row layer's Partial product, in its forward; the second col layer's input
    // gradient, reduced at that layer's input (as PyTorch's input redistribute does), in its
    // backward. Nothing else anywhere.
    CHECK(debug.calls("2", "forward", CollectiveKind::kAllReduce) == 1);
    CHECK(debug.calls("5", "forward", CollectiveKind::kAllReduce) == 1);
    CHECK(debug.calls("3", "backward", CollectiveKind::kAllReduce) == 1);
    const std::vector<CommDebugRow> rows = debug.rows();
    REQUIRE(rows.size() == 3);
    int64_t calls = 0;
    for (const CommDebugRow& r : rows) {
      calls += r.calls;
      CHECK(r.bytes == 4 * 8 * 4);  // [4, 8] float32 each
    }
    CHECK(calls == 3);
    CHECK(debug.causes().empty());
    const std::string table = debug.table();
    CHECK_THAT(table, Catch::Contains("implicit redistributes: none"));
    CHECK_THAT(table, Catch::Matches("(.|\n)*\n2 +forward +all_reduce +1 +128\n(.|\n)*"));
  });
}

TEST_CASE("an implicit redistribute is refused in strict mode and reported otherwise", "[nn][comm_debug]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"tp"});
    // fc4 left out of the plan: its Replicate weight meets fc3's Shard(-1) output, linear's
    // rule multiplies the chunks (no communication) and leaves the output Partial, and the
    // loss's mul, outside every module, must reduce it (its rule picks a reduce-scatter to
    // rows, cheaper than an all-reduce, for each operand): communication nobody declared.
    ParallelPlan plan = full_plan();
    plan.erase("5");
    std::shared_ptr<Sequential> strict = make_mlp();
    parallelize_module(*strict, mesh, plan);
    const DTensor x = input(mesh);
    {
      const CommDebugMode debug(*strict, ImplicitRedistributes::kRaise);
      CHECK_THROWS_WITH(step(*strict, x),
                        "CommDebugMode (strict): mul in module '' (other) would move its input "
                        "float32[4, 8] (P(sum)) to (S(0)) implicitly (reduce_scatter); declare the "
                        "layout: "
                        "a parallel style's Layouts, PrepareModuleInput, or an explicit redistribute");
    }
    std::shared_ptr<Sequential> reported = make_mlp();
    parallelize_module(*reported, mesh, plan);
    const CommDebugMode debug(*reported);
    step(*reported, x);
    const std::vector<CommDebugCause> causes = debug.causes();
    REQUIRE(causes.size() == 2);  // mul(y, y): each operand
    for (const CommDebugCause& c : causes) {
      CHECK(c.module == "");
      CHECK(c.phase == "other");
      CHECK(c.move.op == "mul");
      CHECK(c.move.collectives == std::vector<CollectiveKind>{CollectiveKind::kReduceScatter});
    }
    CHECK(debug.calls("", "other", CollectiveKind::kReduceScatter) == 2);
    CHECK_THAT(debug.table(),
               Catch::Contains("(root) (other): mul moved float32[4, 8] (P(sum)) to (S(0)) (reduce_scatter)"));
  });
}

TEST_CASE("CommDebugMode's hooks only observe: a module's has_hooks ignores them", "[nn][comm_debug]") {
  // Transformer reads its output layer's weight itself (the fused loss) unless the layer has
  // hooks that change its call; watching the model must not change the path, nor its bits.
  Linear fc(4, 2);
  REQUIRE_FALSE(fc.has_hooks());
  const CommDebugMode watching(fc);
  CHECK_FALSE(fc.has_hooks());
  fc.register_forward_hook([](Module&, const Values&, const Values&) { return std::optional<Values>(); });
  CHECK(fc.has_hooks());
}

}  // namespace
}  // namespace dtr::nn
