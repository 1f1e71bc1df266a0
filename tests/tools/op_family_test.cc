// train_step_bench's split by op family: kernels count for their region's family or their
// name's, nested spans once (inside the counted one), optimizer spans whole, and the
// overhead is what the families leave of the step.
#include <catch2/catch.hpp>

#include "optim/optimizer.h"
#include "tools/bench/op_family.h"

namespace dtr::bench {
namespace {

using trace::Category;

trace::Event event(std::string name, Category c, int64_t begin_ms, int64_t end_ms, int32_t parent = -1,
                   const char* region = "") {
  return {.name = std::move(name),
          .category = c,
          .region = region,
          .begin_ns = begin_ms * 1'000'000,
          .end_ns = end_ms * 1'000'000,
          .parent = parent};
}

double of(const FamilyTimes& t, OpFamily f) { return t[static_cast<size_t>(f)]; }

TEST_CASE("a step's kernel and optimizer spans split by family, the rest as overhead", "[op_family]") {
  std::vector<trace::ThreadEvents> threads(1);
  std::vector<trace::Event>& e = threads[0].events;
  e.push_back(event("matmul", Category::kKernel, 0, 10));                   // 0
  e.push_back(event("add", Category::kKernel, 10, 12));                     // 1
  e.push_back(event("bmm", Category::kKernel, 12, 15, -1, "attention"));    // 2
  e.push_back(event("mul", Category::kAutograd, 20, 40));                   // 3: a node
  e.push_back(event("layer_norm_backward", Category::kKernel, 21, 24, 3));  // 4
  e.push_back(event("sum", Category::kKernel, 24, 25, 3, "norm"));          // 5
  e.push_back(event("embedding_backward", Category::kKernel, 25, 29, 3));   // 6
  e.push_back(event("copy_", Category::kKernel, 26, 27, 6));                // 7: inside 6
  e.push_back(event("AdamW.step", optim::kOptimizerCategory, 50, 58));      // 8
  e.push_back(event("adamw_step_", Category::kKernel, 51, 57, 8));          // 9: inside 8
  e.push_back(event("cross_entropy", Category::kKernel, 60, 61));           // 10
  e.push_back(event("open", Category::kKernel, 61, 0));                     // 11: never ended
  const FamilyTimes t = split_by_family(threads, 100.0);
  CHECK(of(t, OpFamily::kMatmul) == Approx(10));
  CHECK(of(t, OpFamily::kElementwise) == Approx(2));
  CHECK(of(t, OpFamily::kAttention) == Approx(3));
  CHECK(of(t, OpFamily::kNorms) == Approx(4));
  CHECK(of(t, OpFamily::kEmbeddingAndLoss) == Approx(5));
  CHECK(of(t, OpFamily::kOptimizer) == Approx(8));
  CHECK(of(t, OpFamily::kOverhead) == Approx(100 - 32));
  double sum = 0;
  for (double v : t) sum += v;
  CHECK(sum == Approx(100));
}

TEST_CASE("every family has a name", "[op_family]") {
  for (size_t f = 0; f < kNumOpFamilies; ++f) CHECK(op_family_name(static_cast<OpFamily>(f)) != "unknown");
}

}  // namespace
}  // namespace dtr::bench
