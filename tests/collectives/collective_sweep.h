// The collective sweeps both backends' tests run inside each rank: every collective x
// dtype x size (0, 1, 7, 1023, 4097 rows) x even/uneven x layout, with rank-dependent
// fills checked bit for bit against closed forms (rank_data.h), on CPU (Gloo) or a CUDA
// device (NCCL). Layouts: out-of-place, in-place (NCCL's convention: the input is this
// rank's block of the output, or the output this rank's block of the input) and strided
// (non-contiguous views, CPU only).
#pragma once

#include <catch2/catch.hpp>
#include <span>

#include "collectives/process_group.h"
#include "tests/collectives/rank_data.h"

namespace dtr::testing {

enum class Layout { kOutOfPlace, kInPlace, kStrided };
inline constexpr Layout kCpuLayouts[] = {Layout::kOutOfPlace, Layout::kInPlace, Layout::kStrided};
inline constexpr Layout kCudaLayouts[] = {Layout::kOutOfPlace, Layout::kInPlace};
inline constexpr ReduceOp kReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
inline constexpr int64_t kCols = 3;  // rows of the row-counted forms hold 3 elements

inline std::string_view layout_name(Layout l) {
  return l == Layout::kOutOfPlace ? "out-of-place" : l == Layout::kInPlace ? "in-place" : "strided";
}

// Rows each rank holds: all equal, or uneven with some ranks holding none.
inline std::vector<int64_t> rows_per_rank(int64_t size, int world, bool even) {
  std::vector<int64_t> rows(world, size);
  if (!even) {
    for (int r = 0; r < world; ++r) rows[r] = r % 2 == 0 ? size / (r + 1) : size / 2 + r;
  }
  return rows;
}

inline int64_t offset_of(const std::vector<int64_t>& rows, int rank) {
  int64_t o = 0;
  for (int r = 0; r < rank; ++r) o += rows[r];
  return o;
}

// The reduction over ranks r = 0..n-1 of (r + 1) * w, in closed form.
inline double reduced(double w, int n, ReduceOp op) {
  const double s = n * (n + 1) / 2.0;
  switch (op) {
    case ReduceOp::kSum: return w * s;
    case ReduceOp::kAvg: return w * s / n;
    case ReduceOp::kMax: return w >= 0 ? w * n : w;
    case ReduceOp::kMin: return w >= 0 ? w : w * n;
  }
  return 0;
}

inline double weight(int64_t i) { return static_cast<double>(i % 7) - 3.0; }  // -3..3

inline bool op_allowed(ReduceOp op, DType d) { return op != ReduceOp::kAvg || is_floating(d); }

// t (made on the CPU) in the layout's memory on device.
inline Tensor placed(const Tensor& t, Device device, Layout layout) {
  return layout == Layout::kStrided ? strided_copy_of(t) : t.to(device);
}

inline void sweep_all_reduce(ProcessGroup& pg, Device device, std::span<const Layout> layouts) {
  const int rank = pg.rank(), n = pg.size();
  for (DType d : kCollectiveDTypes) {
    for (int64_t size : kCollectiveSizes) {
      for (ReduceOp op : kReduceOps) {
        if (!op_allowed(op, d)) continue;
        for (Layout layout : layouts) {
          if (layout == Layout::kOutOfPlace) continue;  // all_reduce is in place
          Tensor x = placed(make_tensor(size, 0, d, [&](int64_t i) { return (rank + 1) * weight(i); }), device, layout);
          pg.all_reduce(x, op).wait();
          std::vector<double> expected(size);
          for (int64_t i = 0; i < size; ++i) expected[i] = reduced(weight(i), n, op);
          check_exact(
              x, expected,
              fmt::format("all_reduce {} {} {} world {} rank {}", reduce_op_name(op), layout_name(layout), d, n, rank));
        }
      }
    }
  }
}

inline void sweep_all_gather(ProcessGroup& pg, Device device, std::span<const Layout> layouts) {
  const int rank = pg.rank(), n = pg.size();
  auto value = [](int r, int64_t j) { return (r + 1) * 16.0 + static_cast<double>(j % 13); };
  for (DType d : kCollectiveDTypes) {
    for (int64_t size : kCollectiveSizes) {
      for (bool even : {true, false}) {
        const std::vector<int64_t> rows = rows_per_rank(size, n, even);
        const int64_t total = offset_of(rows, n);
        std::vector<double> expected;
        for (int r = 0; r < n; ++r) {
          for (int64_t j = 0; j < rows[r] * kCols; ++j) expected.push_back(value(r, j));
        }
        for (Layout layout : layouts) {
          Tensor mine = make_tensor(rows[rank], kCols, d, [&](int64_t j) { return value(rank, j); });
          Tensor out = placed(full({total, kCols}, -1.0, d), device, layout);
          Tensor in = placed(mine, device, layout);
          if (layout == Layout::kInPlace) {
            in = out.narrow(0, offset_of(rows, rank), rows[rank]);
            in.copy_(mine);
          }
          Work w = even ? pg.all_gather_into_tensor(out, in) : pg.all_gather_v(out, in, rows);
          w.wait();
          check_exact(
              out, expected,
              fmt::format("all_gather{} {} {} rows {} rank {}", even ? "" : "_v", layout_name(layout), d, rows, rank));
        }
      }
    }
  }
}

inline void sweep_reduce_scatter(ProcessGroup& pg, Device device, std::span<const Layout> layouts) {
  const int rank = pg.rank(), n = pg.size();
  for (DType d : kCollectiveDTypes) {
    for (int64_t size : kCollectiveSizes) {
      for (bool even : {true, false}) {
        const std::vector<int64_t> rows = rows_per_rank(size, n, even);
        const int64_t total = offset_of(rows, n), mine_at = offset_of(rows, rank);
        for (ReduceOp op : kReduceOps) {
          if (!op_allowed(op, d)) continue;
          std::vector<double> expected;
          for (int64_t j = mine_at * kCols; j < (mine_at + rows[rank]) * kCols; ++j) {
            expected.push_back(reduced(weight(j), n, op));
          }
          for (Layout layout : layouts) {
            Tensor in =
                placed(make_tensor(total, kCols, d, [&](int64_t j) { return (rank + 1) * weight(j); }), device, layout);
            Tensor out = layout == Layout::kInPlace ? in.narrow(0, mine_at, rows[rank])
                                                    : placed(full({rows[rank], kCols}, -1.0, d), device, layout);
            Work w = even ? pg.reduce_scatter_tensor(out, in, op) : pg.reduce_scatter_v(out, in, rows, op);
            w.wait();
            check_exact(out, expected,
                        fmt::format("reduce_scatter{} {} {} {} rows {} rank {}", even ? "" : "_v", reduce_op_name(op),
                                    layout_name(layout), d, rows, rank));
          }
        }
      }
    }
  }
}

inline void sweep_all_to_all(ProcessGroup& pg, Device device, std::span<const Layout> layouts) {
  const int rank = pg.rank(), n = pg.size();
  for (DType d : kCollectiveDTypes) {
    for (int64_t size : kCollectiveSizes) {
      for (bool even : {true, false}) {
        // Rows rank `from` sends to rank `to`, and their values.
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
        for (Layout layout : layouts) {
          if (layout == Layout::kInPlace && !even) continue;  // in place needs equal input and output sizes
          Tensor in = placed(make_tensor(static_cast<int64_t>(in_values.size()) / kCols, kCols, d,
                                         [&](int64_t i) { return in_values[i]; }),
                             device, layout);
          Tensor out =
              layout == Layout::kInPlace
                  ? in
                  : placed(full({static_cast<int64_t>(expected.size()) / kCols, kCols}, -1.0, d), device, layout);
          Work w = even ? pg.all_to_all_single(out, in) : pg.all_to_all_single(out, in, out_splits, in_splits);
          w.wait();
          check_exact(out, expected,
                      fmt::format("all_to_all_single {} {} {} in_splits {} rank {}", layout_name(layout), d,
                                  even ? "even" : "uneven", in_splits, rank));
        }
      }
    }
  }
}

inline void sweep_broadcast(ProcessGroup& pg, Device device, std::span<const Layout> layouts) {
  const int rank = pg.rank(), n = pg.size();
  for (DType d : kCollectiveDTypes) {
    for (int64_t size : kCollectiveSizes) {
      for (int root : {0, n - 1}) {
        for (Layout layout : layouts) {
          if (layout == Layout::kOutOfPlace) continue;  // broadcast is in place
          Tensor t =
              placed(make_tensor(size, 0, d, [&](int64_t i) { return rank == root ? (root + 1) * weight(i) : -5.0; }),
                     device, layout);
          pg.broadcast(t, root).wait();
          std::vector<double> expected(size);
          for (int64_t i = 0; i < size; ++i) expected[i] = (root + 1) * weight(i);
          check_exact(t, expected, fmt::format("broadcast {} {} from {} rank {}", layout_name(layout), d, root, rank));
        }
      }
    }
  }
}

}  // namespace dtr::testing
