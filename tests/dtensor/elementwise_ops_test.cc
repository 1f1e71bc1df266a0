// Elementwise arithmetic, sum and the view ops they need, on DTensors: gradcheck on one rank,
// then every placement combination on 1-D and 2x2 meshes against the one-rank result; add_
// in place where nothing else holds its left operand.
#include "core/allocator.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/reduce.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/elementwise.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::on_one_rank;
using testing::OpCase;

std::vector<OpCase> cases() {
  const Tensor a = global_tensor({5, 3}, 1), b = global_tensor({5, 3}, 2), row = global_tensor({3}, 3);
  // Divisors kept away from zero.
  const Tensor den = add(mul(abs(global_tensor({5, 3}, 4)), 1.0), 1.0);
  return {
      {"add", {{a}, {b}}, [](const auto& x) { return add(x[0], x[1]); }},
      {"add broadcast [5,3] + [3]", {{a}, {row}}, [](const auto& x) { return add(x[0], x[1]); }},
      {"sub", {{a}, {b}}, [](const auto& x) { return sub(x[0], x[1]); }},
      {"mul", {{a}, {b}}, [](const auto& x) { return mul(x[0], x[1]); }},
      {"mul broadcast", {{row}, {a}}, [](const auto& x) { return mul(x[0], x[1]); }},
      {"div", {{a}, {den}}, [](const auto& x) { return div(x[0], x[1]); }},
      {"add scalar", {{a}}, [](const auto& x) { return add(x[0], 2.5); }},
      {"mul scalar", {{a}}, [](const auto& x) { return mul(x[0], -3.0); }},
      {"sum all", {{a}}, [](const auto& x) { return sum(x[0]); }},
      {"sum dim 0", {{a}}, [](const auto& x) { return sum(x[0], {0}); }},
      {"sum dim 1 keepdim", {{a}}, [](const auto& x) { return sum(x[0], {1}, KeepDim::kYes); }},
      {"unsqueeze", {{a}}, [](const auto& x) { return unsqueeze(x[0], 1); }},
      {"transpose", {{a}}, [](const auto& x) { return transpose(x[0], 0, 1); }},
      {"broadcast_to",
       {{row}},
       [](const auto& x) {
         return broadcast_to(x[0], {4, 3});
       }},
  };
}

TEST_CASE("add_ sums into an operand nothing else holds and rebases its graph; otherwise it leaves it alone",
          "[dtensor][ops]") {
  // branch = x * 2 (nothing else holds it); add_(branch, r) writes x * 2 + r over it, and both
  // x and r get the sum's gradient.
  DTensor x = on_one_rank(global_tensor({64, 32}, 1));
  DTensor r = on_one_rank(global_tensor({64, 32}, 2));
  x.requires_grad_();
  r.requires_grad_();
  const Tensor expected = add(mul(x.to_local(), 2.0), r.to_local());
  DTensor branch = mul(x, 2.0);
  const void* buffer = branch.to_local().data();
  const int64_t before = memory_stats(kCPU).bytes_in_use;
  DTensor y = add_(branch, r);
  CHECK(memory_stats(kCPU).bytes_in_use == before);
  CHECK(y.to_local().data() == buffer);
  CHECK(y.grad_fn()->name() == "add");
  testing::check_equal(y.to_local(), expected, "add_ in place");
  branch = DTensor();
  sum(mul(y, y)).backward();
  const Tensor g = mul(expected, 2.0);
  testing::check_equal(r.grad().to_local(), g, "r's gradient");
  testing::check_equal(x.grad().to_local(), mul(g, 2.0), "x's gradient");

  // Held elsewhere, broadcast, or a leaf: add(a, b), a untouched.
  const DTensor held = mul(x, 2.0), other = held;
  CHECK(add_(held, r).to_local().data() != held.to_local().data());
  const DTensor row = on_one_rank(global_tensor({32}, 3));
  const DTensor lone = mul(x, 2.0);
  testing::check_equal(add_(lone, row).to_local(), add(lone.to_local(), row.to_local()), "a broadcast operand");
  testing::check_equal(lone.to_local(), mul(x.to_local(), 2.0), "left alone under a broadcast operand");
  testing::check_equal(add_(x, r).to_local(), add(x.to_local(), r.to_local()), "a leaf that requires grad");
  testing::check_equal(x.to_local(), global_tensor({64, 32}, 1), "the leaf stays");
}

TEST_CASE("elementwise and reduce ops: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("elementwise and reduce ops: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("Partial inputs: exact rules keep Partial, others reduce first", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor a = global_tensor({4, 2}, 5);
    DTensor p = from_local(a, mesh, {Partial()});  // value 2a
    DTensor r = distribute_tensor(a, mesh, {Replicate()});
    collective_counter().reset();
    CHECK(add(p, p).placements() == Placements{Partial()});
    CHECK(mul(p, r).placements() == Placements{Partial()});
    CHECK(mul(p, 2.0).placements() == Placements{Partial()});
    CHECK(sum(p).placements() == Placements{Partial()});
    CHECK(collective_counter().snapshot().empty());
    // P(sum) + scalar and P * P must reduce first: never silently wrong.
    CHECK(testing::to_f64(add(p, 1.0).full_tensor()) == testing::to_f64(add(mul(a, 2.0), 1.0)));
    CHECK(testing::to_f64(mul(p, p).full_tensor()) == testing::to_f64(mul(mul(a, a), 4.0)));
  });
}

TEST_CASE("StridedShard inputs: elementwise ops and casts keep the placement, moving nothing", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    // The packed q, k, v layout on 2 tp ranks, even (12 rows) and uneven (7).
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"tp"});
    for (const Shape& shape : {Shape{12, 3}, Shape{7, 3}}) {
      INFO(fmt::format("{}", shape));
      const Tensor a = global_tensor(shape, 6), b = global_tensor(shape, 7), row = global_tensor({3}, 8);
      const Placements packed = {StridedShard(0, 3)};
      const DTensor x = distribute_tensor(a, mesh, packed), y = distribute_tensor(b, mesh, packed);
      const DTensor r = distribute_tensor(row, mesh, {Replicate()});
      collective_counter().reset();
      const DTensor sum_xy = add(x, y), scaled = mul(x, 0.5), biased = add(x, r), cast = to(x, kFloat32);
      CHECK(collective_counter().snapshot().empty());
      for (const DTensor* t : {&sum_xy, &scaled, &biased, &cast}) CHECK(t->placements() == packed);
      CHECK(testing::to_f64(sum_xy.full_tensor()) == testing::to_f64(add(a, b)));
      CHECK(testing::to_f64(scaled.full_tensor()) == testing::to_f64(mul(a, 0.5)));
      CHECK(testing::to_f64(biased.full_tensor()) == testing::to_f64(add(a, row)));
      CHECK(testing::to_f64(cast.full_tensor()) == testing::to_f64(a.to(kFloat32)));
    }
  });
}

TEST_CASE("a binary op keeps for backward only what its derivative reads", "[dtensor][ops]") {
  // Two branches of 1 MiB made from x and dropped after the op: what stays in use is the
  // output and what the op saved. add and sub read only the shapes (a residual add must not
  // keep its branch alive), mul both inputs, div the divisor and its output.
  constexpr int64_t rows = 1024, width = 256, bytes = rows * width * 4;
  DTensor x = distribute_tensor(global_tensor({rows, width}, 9).to(kFloat32), single_rank_mesh(), {Replicate()});
  x.requires_grad_();
  using Op = DTensor (*)(const DTensor&, const DTensor&);
  const std::pair<Op, int64_t> ops[] = {{&add, 1}, {&sub, 1}, {&mul, 3}, {&div, 2}};
  const char* names[] = {"add", "sub", "mul", "div"};
  for (size_t i = 0; i < std::size(ops); ++i) {
    INFO(names[i]);
    const int64_t before = memory_stats(kCPU).bytes_in_use;
    const DTensor y = ops[i].first(mul(x, 2.0), add(mul(x, x), 1.0));
    const int64_t held = memory_stats(kCPU).bytes_in_use - before;
    CHECK(held >= ops[i].second * bytes);
    CHECK(held < ops[i].second * bytes + bytes / 4);
    sum(y).backward();  // the saved tensors suffice: the gradient is gradcheck's (above)
    CHECK(x.grad().defined());
    x.set_grad(DTensor());
  }
}

}  // namespace
}  // namespace dtr
