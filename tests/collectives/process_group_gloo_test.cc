// Gloo process groups on 1-4 real rank processes: every collective x dtype x size (0, 1,
// 7, 1023, 4097 rows) x even/uneven x in-place/out-of-place/strided, checked bit for bit
// against closed forms of rank-dependent fills; coalesced forms; the collective counter;
// asynchronous issue; and argument errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "tests/collectives/multi_rank.h"
#include "tests/collectives/rank_data.h"

namespace dtr {
namespace {

using testing::check_exact;
using testing::kCollectiveDTypes;
using testing::kCollectiveSizes;
using testing::make_tensor;
using testing::run_ranks;
using testing::strided_copy_of;

constexpr int64_t kCols = 3;  // rows of the "_v" forms hold 3 elements
enum class Layout { kOutOfPlace, kInPlace, kStrided };
constexpr Layout kLayouts[] = {Layout::kOutOfPlace, Layout::kInPlace, Layout::kStrided};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

std::string_view layout_name(Layout l) {
  return l == Layout::kOutOfPlace ? "out-of-place" : l == Layout::kInPlace ? "in-place" : "strided";
}

// Rows each rank holds: all equal, or uneven with some ranks holding none.
std::vector<int64_t> rows_per_rank(int64_t size, int world, bool even) {
  std::vector<int64_t> rows(world, size);
  if (!even) {
    for (int r = 0; r < world; ++r) rows[r] = r % 2 == 0 ? size / (r + 1) : size / 2 + r;
  }
  return rows;
}

int64_t offset_of(const std::vector<int64_t>& rows, int rank) {
  int64_t o = 0;
  for (int r = 0; r < rank; ++r) o += rows[r];
  return o;
}

int64_t total_of(const std::vector<int64_t>& rows) { return offset_of(rows, static_cast<int>(rows.size())); }

// The reduction of (r + 1) * w over ranks r = 0..n-1, in closed form.
double reduced(double w, int n, ReduceOp op) {
  const double s = n * (n + 1) / 2.0;
  switch (op) {
    case ReduceOp::kSum: return w * s;
    case ReduceOp::kAvg: return w * s / n;
    case ReduceOp::kMax: return w >= 0 ? w * n : w;
    case ReduceOp::kMin: return w >= 0 ? w : w * n;
  }
  return 0;
}

double weight(int64_t i) { return static_cast<double>(i % 7) - 3.0; }  // -3..3

bool op_allowed(ReduceOp op, DType d) { return op != ReduceOp::kAvg || is_floating(d); }

const int kWorlds[] = {1, 2, 3, 4};

TEST_CASE("gloo all_reduce: every dtype, op, size and layout", "[collectives][gloo]") {
  for (int world : kWorlds) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);
      for (DType d : kCollectiveDTypes) {
        for (int64_t size : kCollectiveSizes) {
          for (ReduceOp op : kOps) {
            if (!op_allowed(op, d)) continue;
            for (Layout layout : {Layout::kInPlace, Layout::kStrided}) {
              Tensor x = make_tensor(size, 0, d, [&](int64_t i) { return (rank + 1) * weight(i); });
              if (layout == Layout::kStrided) x = strided_copy_of(x);
              pg->all_reduce(x, op).wait();
              std::vector<double> expected(size);
              for (int64_t i = 0; i < size; ++i) expected[i] = reduced(weight(i), n, op);
              check_exact(x, expected, fmt::format("all_reduce {} {} {} world {} rank {}", reduce_op_name(op),
                                                   layout_name(layout), d, n, rank));
            }
          }
        }
      }
    });
  }
}

TEST_CASE("gloo all_gather: every dtype, size, even/uneven and layout", "[collectives][gloo]") {
  for (int world : kWorlds) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);
      for (DType d : kCollectiveDTypes) {
        for (int64_t size : kCollectiveSizes) {
          for (bool even : {true, false}) {
            const std::vector<int64_t> rows = rows_per_rank(size, n, even);
            const int64_t total = total_of(rows);
            auto value = [](int r, int64_t j) { return (r + 1) * 16.0 + static_cast<double>(j % 13); };
            std::vector<double> expected;
            for (int r = 0; r < n; ++r) {
              for (int64_t j = 0; j < rows[r] * kCols; ++j) expected.push_back(value(r, j));
            }
            for (Layout layout : kLayouts) {
              Tensor mine = make_tensor(rows[rank], kCols, d, [&](int64_t j) { return value(rank, j); });
              Tensor out = full({total, kCols}, -1.0, d);
              Tensor in = mine;
              if (layout == Layout::kInPlace) {
                in = out.narrow(0, offset_of(rows, rank), rows[rank]);
                in.copy_(mine);
              } else if (layout == Layout::kStrided) {
                in = strided_copy_of(mine);
                out = strided_copy_of(out);
              }
              Work w = even ? pg->all_gather_into_tensor(out, in) : pg->all_gather_v(out, in, rows);
              w.wait();
              check_exact(out, expected, fmt::format("all_gather{} {} {} rows {} rank {}", even ? "" : "_v",
                                                     layout_name(layout), d, rows, rank));
            }
          }
        }
      }
    });
  }
}

TEST_CASE("gloo reduce_scatter: every dtype, op, size, even/uneven and layout", "[collectives][gloo]") {
  for (int world : kWorlds) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);
      for (DType d : kCollectiveDTypes) {
        for (int64_t size : kCollectiveSizes) {
          for (bool even : {true, false}) {
            const std::vector<int64_t> rows = rows_per_rank(size, n, even);
            const int64_t total = total_of(rows), mine_at = offset_of(rows, rank);
            for (ReduceOp op : kOps) {
              if (!op_allowed(op, d)) continue;
              std::vector<double> expected;
              for (int64_t j = mine_at * kCols; j < (mine_at + rows[rank]) * kCols; ++j) {
                expected.push_back(reduced(weight(j), n, op));
              }
              for (Layout layout : kLayouts) {
                Tensor in = make_tensor(total, kCols, d, [&](int64_t j) { return (rank + 1) * weight(j); });
                Tensor out = full({rows[rank], kCols}, -1.0, d);
                if (layout == Layout::kInPlace) {
                  out = in.narrow(0, mine_at, rows[rank]);
                } else if (layout == Layout::kStrided) {
                  in = strided_copy_of(in);
                  out = strided_copy_of(out);
                }
                Work w = even ? pg->reduce_scatter_tensor(out, in, op) : pg->reduce_scatter_v(out, in, rows, op);
                w.wait();
                check_exact(out, expected, fmt::format("reduce_scatter{} {} {} {} rows {} rank {}", even ? "" : "_v",
                                                       reduce_op_name(op), layout_name(layout), d, rows, rank));
              }
            }
          }
        }
      }
    });
  }
}

TEST_CASE("gloo all_to_all_single: every dtype, size, even/uneven and layout", "[collectives][gloo]") {
  for (int world : kWorlds) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);
      for (DType d : kCollectiveDTypes) {
        for (int64_t size : kCollectiveSizes) {
          for (bool even : {true, false}) {
            // Rows rank `from` sends to rank `to`.
            auto rows = [&](int from, int to) { return even ? size : (size + from + 2 * to) % (size + 3); };
            auto value = [](int from, int to, int64_t k) { return from * 32.0 + to * 8.0 + static_cast<double>(k % 8); };
            std::vector<int64_t> in_splits(n), out_splits(n);
            std::vector<double> in_values, expected;
            for (int j = 0; j < n; ++j) {
              in_splits[j] = rows(rank, j);
              out_splits[j] = rows(j, rank);
              for (int64_t k = 0; k < in_splits[j] * kCols; ++k) in_values.push_back(value(rank, j, k));
              for (int64_t k = 0; k < out_splits[j] * kCols; ++k) expected.push_back(value(j, rank, k));
            }
            for (Layout layout : kLayouts) {
              if (layout == Layout::kInPlace && !even) continue;  // in place needs equal in and out sizes
              Tensor in = make_tensor(static_cast<int64_t>(in_values.size()) / kCols, kCols, d,
                                      [&](int64_t i) { return in_values[i]; });
              Tensor out = full({static_cast<int64_t>(expected.size()) / kCols, kCols}, -1.0, d);
              if (layout == Layout::kInPlace) out = in;
              if (layout == Layout::kStrided) {
                in = strided_copy_of(in);
                out = strided_copy_of(out);
              }
              Work w = even ? pg->all_to_all_single(out, in) : pg->all_to_all_single(out, in, out_splits, in_splits);
              w.wait();
              check_exact(out, expected, fmt::format("all_to_all_single {} {} {} in_splits {} rank {}",
                                                     layout_name(layout), d, even ? "even" : "uneven", in_splits, rank));
            }
          }
        }
      }
    });
  }
}

TEST_CASE("gloo broadcast and barrier: every dtype, size, root and layout", "[collectives][gloo]") {
  for (int world : kWorlds) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);
      for (DType d : kCollectiveDTypes) {
        for (int64_t size : kCollectiveSizes) {
          for (int root : {0, n - 1}) {
            for (Layout layout : {Layout::kInPlace, Layout::kStrided}) {
              Tensor t = make_tensor(size, 0, d, [&](int64_t i) { return rank == root ? (root + 1) * weight(i) : -5.0; });
              if (layout == Layout::kStrided) t = strided_copy_of(t);
              pg->broadcast(t, root).wait();
              std::vector<double> expected(size);
              for (int64_t i = 0; i < size; ++i) expected[i] = (root + 1) * weight(i);
              check_exact(t, expected, fmt::format("broadcast {} {} from {} rank {}", layout_name(layout), d, root, rank));
            }
          }
        }
      }
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
      std::vector<Tensor> ins = {make_tensor(4, 0, kFloat32, [&](int64_t i) { return rank * 10.0 + i; }),
                                 Tensor::empty({0, 2}, kFloat32),
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
      check_exact(rs_out[0], {reduced(weight(2 * rank), n, ReduceOp::kAvg), reduced(weight(2 * rank + 1), n, ReduceOp::kAvg)},
                  "coalesced reduce_scatter [0]");
      std::vector<double> e1;
      for (int j = 0; j < 3; ++j) e1.push_back(reduced(weight(3 * rank + j + 5), n, ReduceOp::kAvg));
      check_exact(rs_out[1], e1, "coalesced reduce_scatter [1]");
      // all_reduce (max) over an int64 pair.
      std::vector<Tensor> ar = {make_tensor(3, 0, kInt64, [&](int64_t i) { return (rank + 1) * weight(i); }),
                                make_tensor(2, 2, kInt64, [&](int64_t i) { return (rank + 1) * weight(i + 3); })};
      pg->all_reduce_coalesced(ar, ReduceOp::kMax).wait();
      check_exact(ar[0], {reduced(-3, n, ReduceOp::kMax), reduced(-2, n, ReduceOp::kMax), reduced(-1, n, ReduceOp::kMax)},
                  "coalesced all_reduce [0]");
      check_exact(ar[1], {reduced(0, n, ReduceOp::kMax), reduced(1, n, ReduceOp::kMax), reduced(2, n, ReduceOp::kMax),
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
    for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
    for (const Work& w : works) {
      CHECK(w.is_completed());
      CHECK(w.exception() == nullptr);
    }
    check_exact(chained.narrow(0, 0, 3), std::vector<double>(3, std::pow(n, kCalls)), "chained all_reduce");
    check_exact(big.narrow(0, 0, 2), std::vector<double>(2, (n + 1) / 2.0), "avg");
    pg->barrier().wait();
    CHECK(collective_counter().calls(CollectiveKind::kAllReduce) == kCalls + 1);
    CHECK(collective_counter().bytes(CollectiveKind::kAllReduce) == kCalls * (int64_t{1} << 16) * 8 + (int64_t{1} << 20) * 4);
    CHECK(collective_counter().calls(CollectiveKind::kBarrier) == 1);
    const std::vector<CollectiveCount> rows = collective_counter().snapshot();
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].group == "default_pg");
    CHECK(rows[0].kind == CollectiveKind::kAllReduce);
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
    CHECK_THROWS_WITH(pg->all_reduce(i4, ReduceOp::kAvg), Catch::Contains("avg needs a floating dtype") &&
                                                              Catch::Contains("int32"));
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
