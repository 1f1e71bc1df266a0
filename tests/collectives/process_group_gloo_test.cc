// Gloo process groups on 1-4 real rank processes: the collective sweeps of
// collective_sweep.h (every collective x dtype x size x even/uneven x in-place,
// out-of-place and strided, bit for bit against closed forms); bfloat16/float16 exactness;
// coalesced forms; the collective counter; asynchronous issue; and argument errors.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>

#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "tests/collectives/collective_sweep.h"
#include "tests/collectives/rank_data.h"
#include "tests/testing/multi_rank.h"

namespace dtr {
namespace {

using namespace testing;

const int kWorlds[] = {1, 2, 3, 4};

TEST_CASE("gloo all_reduce: every dtype, op, size and layout", "[collectives][gloo]") {
  for (int world : kWorlds) {
    run_ranks(world, [](int, int) { sweep_all_reduce(*init_process_group(Backend::kGloo), kCPU, kCpuLayouts); });
  }
}

TEST_CASE("gloo all_gather: every dtype, size, even/uneven and layout", "[collectives][gloo]") {
  for (int world : kWorlds) {
    run_ranks(world, [](int, int) { sweep_all_gather(*init_process_group(Backend::kGloo), kCPU, kCpuLayouts); });
  }
}

TEST_CASE("gloo reduce_scatter: every dtype, op, size, even/uneven and layout", "[collectives][gloo]") {
  // 5 ranks too: dtr's ring (internal/ring_reduce_scatter.h) on more steps than two.
  for (int world : {1, 2, 3, 4, 5}) {
    run_ranks(world, [](int, int) { sweep_reduce_scatter(*init_process_group(Backend::kGloo), kCPU, kCpuLayouts); });
  }
}

TEST_CASE("gloo all_to_all_single: every dtype, size, even/uneven and layout", "[collectives][gloo]") {
  for (int world : kWorlds) {
    run_ranks(world, [](int, int) { sweep_all_to_all(*init_process_group(Backend::kGloo), kCPU, kCpuLayouts); });
  }
}

TEST_CASE("gloo broadcast and barrier: every dtype, size, root and layout", "[collectives][gloo]") {
  for (int world : kWorlds) {
    run_ranks(world, [](int, int) {
      auto pg = init_process_group(Backend::kGloo);
      sweep_broadcast(*pg, kCPU, kCpuLayouts);
      for (int i = 0; i < 3; ++i) pg->barrier().wait();
    });
  }
}

TEST_CASE("gloo bfloat16 and float16 reduce exactly in float32", "[collectives][gloo]") {
  // Rank r holds 1 + r * 2^-8 (exact in bfloat16); the float32 sum is exact. On 4 ranks it
  // is 4 + 6 * 2^-8, which rounds once to 4 + 2^-5; a reduction that rounded to bfloat16
  // after every addition would drop each 2^-8 step and end at 4. float16 likewise with
  // 2^-11 steps (4 + 2^-8 against 4). On 2 ranks both give the correctly rounded 2.
  for (int world : {2, 4}) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);
      for (auto [d, step] : {std::pair{kBFloat16, 0x1p-8}, std::pair{kFloat16, 0x1p-11}}) {
        Tensor t = Tensor::from_vector(std::vector<double>{1.0 + rank * step}, {1}).to(d);
        pg->all_reduce(t).wait();
        const double exact = n + step * n * (n - 1) / 2.0;  // 2 + step, or 4 + 6 step
        const double rounded = Tensor::from_vector(std::vector<double>{exact}, {1}).to(d).item();
        CHECK(t.item() == rounded);
        Tensor in = Tensor::from_vector(std::vector<double>(n, 1.0 + rank * step), {n}).to(d);
        Tensor out = Tensor::empty({1}, d);
        pg->reduce_scatter_tensor(out, in).wait();
        CHECK(out.item() == rounded);
      }
    });
  }
}

TEST_CASE("gloo coalesced forms move several tensors in one collective", "[collectives][gloo]") {
  for (int world : {1, 3}) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);
      collective_counter().reset();
      // all_gather: inputs of 4, 0 and 6 elements (one of them strided).
      std::vector<Tensor> ins = {
          make_tensor(4, 0, kFloat32, [&](int64_t i) { return rank * 10.0 + i; }), Tensor::empty({0, 2}, kFloat32),
          strided_copy_of(make_tensor(2, 3, kFloat32, [&](int64_t i) { return -rank * 10.0 - i; }))};
      std::vector<Tensor> outs = {Tensor::empty({4L * n}, kFloat32), Tensor::empty({0, 2}, kFloat32),
                                  Tensor::empty({2L * n, 3}, kFloat32)};
      pg->all_gather_into_tensor_coalesced(outs, ins).wait();
      std::vector<double> e0, e2;
      for (int r = 0; r < n; ++r) {
        for (int i = 0; i < 4; ++i) e0.push_back(r * 10.0 + i);
        for (int i = 0; i < 6; ++i) e2.push_back(-r * 10.0 - i);
      }
      check_exact(outs[0], e0, "coalesced all_gather [0]");
      check_exact(outs[2], e2, "coalesced all_gather [2]");
      // reduce_scatter (avg): inputs hold n blocks of 2 and of 3 elements.
      std::vector<Tensor> rs_in = {make_tensor(2L * n, 0, kFloat64, [&](int64_t i) { return (rank + 1) * weight(i); }),
                                   make_tensor(n, 3, kFloat64, [&](int64_t i) { return (rank + 1) * weight(i + 5); })};
      std::vector<Tensor> rs_out = {Tensor::empty({2}, kFloat64), strided_copy_of(Tensor::empty({1, 3}, kFloat64))};
      pg->reduce_scatter_tensor_coalesced(rs_out, rs_in, ReduceOp::kAvg).wait();
      check_exact(rs_out[0],
                  {reduced(weight(2 * rank), n, ReduceOp::kAvg), reduced(weight(2 * rank + 1), n, ReduceOp::kAvg)},
                  "coalesced reduce_scatter [0]");
      std::vector<double> e1;
      for (int j = 0; j < 3; ++j) e1.push_back(reduced(weight(3 * rank + j + 5), n, ReduceOp::kAvg));
      check_exact(rs_out[1], e1, "coalesced reduce_scatter [1]");
      // all_reduce (max) over an int64 pair.
      std::vector<Tensor> ar = {make_tensor(3, 0, kInt64, [&](int64_t i) { return (rank + 1) * weight(i); }),
                                make_tensor(2, 2, kInt64, [&](int64_t i) { return (rank + 1) * weight(i + 3); })};
      pg->all_reduce_coalesced(ar, ReduceOp::kMax).wait();
      check_exact(ar[0],
                  {reduced(-3, n, ReduceOp::kMax), reduced(-2, n, ReduceOp::kMax), reduced(-1, n, ReduceOp::kMax)},
                  "coalesced all_reduce [0]");
      check_exact(ar[1],
                  {reduced(0, n, ReduceOp::kMax), reduced(1, n, ReduceOp::kMax), reduced(2, n, ReduceOp::kMax),
                   reduced(3, n, ReduceOp::kMax)},
                  "coalesced all_reduce [1]");
      // One collective each.
      CHECK(collective_counter().calls(CollectiveKind::kAllGather) == 1);
      CHECK(collective_counter().calls(CollectiveKind::kReduceScatter) == 1);
      CHECK(collective_counter().calls(CollectiveKind::kAllReduce) == 1);
      CHECK(collective_counter().bytes(CollectiveKind::kAllGather) == (4 + 6) * n * 4);
      CHECK(collective_counter().bytes(CollectiveKind::kReduceScatter) == 5 * n * 8);
    });
  }
}

TEST_CASE("gloo collectives are asynchronous and run in issue order; the counter sees each", "[collectives][gloo]") {
  run_ranks(3, [](int rank, int n) {
    auto pg = init_process_group(Backend::kGloo);
    collective_counter().reset();
    constexpr int kCalls = 8;
    std::vector<Tensor> tensors;
    std::vector<Work> works;
    // Each all_reduce reads the tensor the previous one wrote: only issue order gives n^k.
    Tensor chained = full({1 << 16}, 1.0, kFloat64);
    for (int k = 0; k < kCalls; ++k) works.push_back(pg->all_reduce(chained));
    Tensor big = full({1 << 20}, rank + 1.0, kFloat32);
    works.push_back(pg->all_reduce(big, ReduceOp::kAvg));
    // Compute goes on while they run.
    double local = 0;
    for (int i = 0; i < 1000000; ++i) local += std::sqrt(static_cast<double>(i));
    CHECK(local > 0);
    // The counter adds up the time spent in wait(), and only that.
    CHECK(collective_counter().wait_ns() == 0);
    const auto waits_begin = std::chrono::steady_clock::now();
    for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
    const auto waits_end = std::chrono::steady_clock::now();
    CHECK(collective_counter().wait_ns() > 0);
    CHECK(collective_counter().wait_ns() <=
          std::chrono::duration_cast<std::chrono::nanoseconds>(waits_end - waits_begin).count());
    for (const Work& w : works) {
      CHECK(w.is_completed());
      CHECK(w.exception() == nullptr);
    }
    check_exact(chained.narrow(0, 0, 3), std::vector<double>(3, std::pow(n, kCalls)), "chained all_reduce");
    check_exact(big.narrow(0, 0, 2), std::vector<double>(2, (n + 1) / 2.0), "avg");
    pg->barrier().wait();
    CHECK(collective_counter().calls(CollectiveKind::kAllReduce) == kCalls + 1);
    CHECK(collective_counter().bytes(CollectiveKind::kAllReduce) ==
          kCalls * (int64_t{1} << 16) * 8 + (int64_t{1} << 20) * 4);
    CHECK(collective_counter().calls(CollectiveKind::kBarrier) == 1);
    const std::vector<CollectiveCount> rows = collective_counter().snapshot();
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].group == "default_pg");
    CHECK(rows[0].kind == CollectiveKind::kAllReduce);
  });
}

TEST_CASE("gloo: destroying a group finishes what it issued; its Works stay valid", "[collectives][gloo]") {
  run_ranks(2, [](int rank, int n) {
    std::vector<Work> works;
    Tensor x = full({1000}, rank + 1.0, kFloat32);
    {
      auto pg = init_process_group(Backend::kGloo);
      for (int i = 0; i < 4; ++i) works.push_back(pg->all_reduce(x, ReduceOp::kMax));
      pg.reset();
      destroy_process_group();  // returns once the four all_reduces ran
    }
    for (const Work& w : works) {
      CHECK(w.is_completed());
      w.wait();  // the group is gone: nothing left to run, nothing to wait for
    }
    check_exact(x.narrow(0, 0, 2), {static_cast<double>(n), static_cast<double>(n)}, "all_reduce max");
  });
}

TEST_CASE("gloo argument errors name the call, the tensors and what is legal", "[collectives][gloo]") {
  run_ranks(2, [](int rank, int n) {
    auto pg = init_process_group(Backend::kGloo);
    Tensor f4 = Tensor::empty({4}, kFloat32);
    Tensor f3 = Tensor::empty({3}, kFloat32);
    Tensor i4 = Tensor::empty({4}, kInt32);
    Tensor b4 = Tensor::empty({4}, kBool);
    CHECK_THROWS_AS(pg->all_gather_into_tensor(f3, f4), ValueError);
    CHECK_THROWS_WITH(pg->all_gather_into_tensor(f3, f4),
                      Catch::Contains("all_gather_into_tensor") && Catch::Contains("float32[3]") &&
                          Catch::Contains("group size 2 x input float32[4] = 8 elements"));
    CHECK_THROWS_AS(pg->reduce_scatter_tensor(f4, f3), ValueError);
    CHECK_THROWS_AS(pg->all_reduce(i4, ReduceOp::kAvg), TypeError);
    CHECK_THROWS_WITH(pg->all_reduce(i4, ReduceOp::kAvg),
                      Catch::Contains("avg needs a floating dtype") && Catch::Contains("int32"));
    CHECK_THROWS_AS(pg->all_reduce(b4), TypeError);
    CHECK_THROWS_WITH(pg->all_reduce(b4), Catch::Contains("bool") && Catch::Contains("int32 or int64"));
    CHECK_THROWS_AS(pg->all_gather_into_tensor(f4, i4), TypeError);
    CHECK_THROWS_AS(pg->broadcast(f4, 2), IndexError);
    CHECK_THROWS_WITH(pg->broadcast(f4, 2), Catch::Contains("root 2") && Catch::Contains("0..1"));
    Tensor rows_out = Tensor::empty({5, 3}, kFloat32);
    Tensor rows_in = Tensor::empty({2, 3}, kFloat32);
    CHECK_THROWS_WITH(pg->all_gather_v(rows_out, rows_in, {2, 3, 0}),
                      Catch::Contains("3 entries") && Catch::Contains("2 ranks"));
    CHECK_THROWS_WITH(pg->all_gather_v(rows_out, rows_in, {1, 4}),
                      Catch::Contains(fmt::format("rank {} must pass an input of counts[{}]", rank, rank)));
    Tensor wide = Tensor::empty({2, 4}, kFloat32);
    CHECK_THROWS_WITH(pg->all_gather_v(rows_out, wide, {2, 3}), Catch::Contains("same sizes after dim 0"));
    CHECK_THROWS_WITH(pg->all_to_all_single(rows_out, rows_out), Catch::Contains("do not split evenly over 2 ranks"));
    CHECK_THROWS_WITH(pg->all_to_all_single(rows_in, rows_in, {1, 1}, {1, 2}), Catch::Contains("add up to 3 rows"));
    // Nothing was issued: the group still works.
    Tensor ok = full({2}, rank + 1.0, kFloat32);
    pg->all_reduce(ok).wait();
    check_exact(ok, {3.0, 3.0}, "all_reduce after rejected calls");
    (void)n;
  });
}

}  // namespace
}  // namespace dtr
