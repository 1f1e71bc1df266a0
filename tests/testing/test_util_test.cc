// The comparison can fail: close_mismatch (what check_close and check_equal check) reports a
// shape that differs even when the element count agrees, and elements out of tolerance.
#include "tests/testing/test_util.h"

#include <catch2/catch.hpp>

#include <vector>

#include "kernels/fill.h"

namespace dtr::testing {
namespace {

using Catch::Contains;

TEST_CASE("the expected shape and values pass", "[test_util]") {
  const Tensor x = arange(0.0, 6.0, 1.0, kFloat64).view({2, 3});
  CHECK(close_mismatch(x, {2, 3}, {0, 1, 2, 3, 4, 5}, {0, 0}).empty());
  CHECK(close_mismatch(x.t(), {3, 2}, {0, 3, 1, 4, 2, 5}, {0, 0}).empty());  // row-major order of the view
  CHECK(close_mismatch(x, {2, 3}, {0, 1, 2, 3, 4, 5.5}, {0, 0.1}).empty());  // within rtol
  check_equal(x, Shape{2, 3}, {0, 1, 2, 3, 4, 5}, "arange as [2, 3]");
  check_close(x.t(), x.t().contiguous(), Tolerance{0, 0}, "a transposed view against its copy");
}

TEST_CASE("a shape that differs is a mismatch, though the element count agrees", "[test_util]") {
  const std::vector<double> six(6, 0.0);
  CHECK_THAT(close_mismatch(zeros({2, 3}), {3, 2}, six, {0, 0}), Contains("float32[2, 3]: expected shape [3, 2]"));
  CHECK_THAT(close_mismatch(zeros({6}), {2, 3}, six, {0, 0}), Contains("expected shape [2, 3]"));
  CHECK_THAT(close_mismatch(full({}, 1.0), {1}, {1.0}, {0, 0}), Contains("float32[]: expected shape [1]"));
}

TEST_CASE("elements out of tolerance are a mismatch, naming the first and the count", "[test_util]") {
  const std::string one_off = close_mismatch(zeros({4}), {4}, {0, 0, 1, 0}, {0, 0});
  CHECK_THAT(one_off, Contains("1 of 4 elements differ") && Contains("[flat 2] expected 1, got 0"));
  CHECK_FALSE(close_mismatch(zeros({2}), {2}, {0, 1e-3}, {1e-4, 0}).empty());
}

}  // namespace
}  // namespace dtr::testing
