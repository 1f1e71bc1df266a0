// dtr's ring reduce-scatter and all-reduce on raw Gloo contexts, 1-5 real rank processes:
// results for every op and wire dtype, even and uneven blocks (some empty, some of several
// pieces), in place and not; and the bytes each rank sends: for the reduce-scatter every
// block but its own, once ((n-1)/n of the input for even blocks, the least a
// reduce-scatter can move), and for the all-reduce 2(n-1)/n.
#include "collectives/internal/ring_reduce_scatter.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include "collectives/gloo_store.h"
#include "collectives/init.h"
#include "collectives/prefix_store.h"
#include "tests/collectives/collective_sweep.h"
#include "tests/collectives/multi_rank.h"
#include "tests/collectives/rank_data.h"

namespace dtr {
namespace {

using namespace testing;

// A raw Gloo context of this rank over the test group's store (the rings run on it alone).
std::shared_ptr<gloo::rendezvous::Context> ring_context(int rank, int n, ProcessGroup& pg, const std::string& name) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  attr.ai_family = AF_INET;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, n);
  GlooStore store(std::make_shared<PrefixStore>(name, pg.store()));
  context->connectFullMesh(store, device);
  return context;
}

// Block sizes: even; uneven with empty blocks; blocks of more than one piece.
std::vector<std::vector<int64_t>> ring_layouts(int n) {
  const int64_t big = (gloo_ring::kPieceBytes / 4) * 5 / 4 + 3;
  std::vector<std::vector<int64_t>> layouts = {std::vector<int64_t>(n, 7), std::vector<int64_t>(n, big)};
  std::vector<int64_t> uneven;
  for (int r = 0; r < n; ++r) uneven.push_back(r % 3 == 1 ? 0 : 1000 * r + 5);
  layouts.push_back(uneven);
  return layouts;
}

TEST_CASE("ring reduce_scatter: results and the bytes each rank sends", "[collectives][ring]") {
  for (int world : {1, 2, 3, 4, 5}) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);  // for its store only
      auto context = ring_context(rank, n, *pg, "ring_test");
      const std::vector<std::vector<int64_t>> layouts = ring_layouts(n);
      uint32_t tag = 0;
      Tensor scratch;  // reused across calls, grown by the larger ones
      for (const std::vector<int64_t>& counts : layouts) {
        const int64_t total = offset_of(counts, n), mine_at = offset_of(counts, rank);
        for (DType d : {kFloat32, kFloat64, kInt32, kInt64}) {
          for (ReduceOp op : kReduceOps) {
            if (!op_allowed(op, d)) continue;
            for (bool in_place : {false, true}) {
              Tensor in = make_tensor(total, 0, d, [&](int64_t i) { return (rank + 1) * weight(i); });
              Tensor out = in_place ? in.narrow(0, mine_at, counts[rank]) : Tensor::empty({counts[rank]}, d);
              const int64_t sent = gloo_ring::reduce_scatter(*context, d, op, in.data(), out.data(), counts, tag++,
                                                             std::chrono::seconds(30), scratch);
              const std::string what =
                  fmt::format("{} {} counts {} in place {} rank {}", reduce_op_name(op), d, counts, in_place, rank);
              INFO(what);
              CHECK(sent == (total - counts[rank]) * static_cast<int64_t>(itemsize(d)));
              std::vector<double> expected;
              for (int64_t j = mine_at; j < mine_at + counts[rank]; ++j) expected.push_back(reduced(weight(j), n, op));
              check_exact(out, expected, what);
            }
          }
        }
      }
    });
  }
}

// The all-reduce sends its reduce-scatter's bytes, then its own block and every block it
// forwards: all but the one received last, rank+1's ((n-1)/n of the data again when even).
TEST_CASE("ring all_reduce: results in place and the bytes each rank sends", "[collectives][ring]") {
  for (int world : {1, 2, 3, 4, 5}) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);
      auto context = ring_context(rank, n, *pg, "ring_all_reduce_test");
      uint32_t tag = 0;
      Tensor scratch;
      for (const std::vector<int64_t>& counts : ring_layouts(n)) {
        const int64_t total = offset_of(counts, n);
        for (DType d : {kFloat32, kFloat64, kInt32, kInt64}) {
          for (ReduceOp op : kReduceOps) {
            if (!op_allowed(op, d)) continue;
            Tensor data = make_tensor(total, 0, d, [&](int64_t i) { return (rank + 1) * weight(i); });
            const int64_t sent =
                gloo_ring::all_reduce(*context, d, op, data.data(), counts, tag++, std::chrono::seconds(30), scratch);
            const std::string what = fmt::format("{} {} counts {} rank {}", reduce_op_name(op), d, counts, rank);
            INFO(what);
            const int64_t expected_sent = n == 1 ? 0 : 2 * total - counts[rank] - counts[(rank + 1) % n];
            CHECK(sent == expected_sent * static_cast<int64_t>(itemsize(d)));
            std::vector<double> expected;
            for (int64_t j = 0; j < total; ++j) expected.push_back(reduced(weight(j), n, op));
            check_exact(data, expected, what);
          }
        }
      }
    });
  }
}

}  // namespace
}  // namespace dtr
