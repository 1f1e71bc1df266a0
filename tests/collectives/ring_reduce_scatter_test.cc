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
#include "kernels/fill.h"
#include "tests/collectives/collective_sweep.h"
#include "tests/collectives/rank_data.h"
#include "tests/testing/multi_rank.h"

namespace dtr {
namespace {

using namespace testing;

// A raw Gloo context of this rank over the test group's store (the rings run on it alone).
std::shared_ptr<gloo::rendezvous::Context> ring_context(int rank, int n, ProcessGroup& pg, const std::string& name,
                                                        std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  attr.ai_family = AF_INET;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, n);
  context->setTimeout(timeout);  // before connecting: the pairs take it
  GlooStore store(std::make_shared<PrefixStore>(name, pg.store()));
  context->connectFullMesh(store, device);
  return context;
}

// A ring shape and the block sizes it runs: the default ring with even blocks, uneven ones
// (some empty) and blocks of more than one piece; rings of 1 KiB pieces in two and three
// slots, whose blocks span many windows and whose senders wait for credits.
struct RingCase {
  gloo_ring::RingShape shape;
  std::vector<std::vector<int64_t>> layouts;
};
std::vector<RingCase> ring_cases(int n) {
  const int64_t big = (gloo_ring::kPieceBytes / 4) * 5 / 4 + 3;
  std::vector<int64_t> uneven;
  for (int r = 0; r < n; ++r) uneven.push_back(r % 3 == 1 ? 0 : 1000 * r + 5);
  const std::vector<int64_t> windows(n, 3001);  // 12 float32 or 24 float64 pieces of 1 KiB
  return {{{}, {std::vector<int64_t>(n, 7), std::vector<int64_t>(n, big), uneven}},
          {{1024, 2}, {windows, uneven}},
          {{1024, 3}, {windows, uneven}}};
}

std::string shape_name(const gloo_ring::RingShape& shape) {
  return fmt::format("pieces of {} B in {} slots", shape.piece_bytes, shape.slots);
}

// Both collectives, alternating on one ring per shape, back to back (credits carry over
// between calls and kinds). The all-reduce sends its reduce-scatter's bytes, then its own
// block and every block it forwards: all but the one received last, rank+1's ((n-1)/n of
// the data again when even).
TEST_CASE("ring reduce_scatter and all_reduce: results and the bytes each rank sends", "[collectives][ring]") {
  for (int world : {1, 2, 3, 4, 5}) {
    run_ranks(world, [](int rank, int n) {
      auto pg = init_process_group(Backend::kGloo);  // for its store only
      auto context = ring_context(rank, n, *pg, "ring_test");
      uint32_t tag = 0;
      for (const RingCase& ring_case : ring_cases(n)) {
        gloo_ring::Ring ring(*context, ring_case.shape);
        for (const std::vector<int64_t>& counts : ring_case.layouts) {
          const int64_t total = offset_of(counts, n), mine_at = offset_of(counts, rank);
          for (DType d : {kFloat32, kFloat64, kInt32, kInt64}) {
            for (ReduceOp op : kReduceOps) {
              if (!op_allowed(op, d)) continue;
              const std::string what = fmt::format("{} {} counts {} rank {} {}", reduce_op_name(op), d, counts, rank,
                                                   shape_name(ring_case.shape));
              for (bool in_place : {false, true}) {
                INFO(what << " reduce_scatter in place " << in_place);
                Tensor in = make_tensor(total, 0, d, [&](int64_t i) { return (rank + 1) * weight(i); });
                Tensor out = in_place ? in.narrow(0, mine_at, counts[rank]) : Tensor::empty({counts[rank]}, d);
                const int64_t sent = ring.reduce_scatter(d, op, in.data(), out.data(), counts);
                CHECK(sent == (total - counts[rank]) * static_cast<int64_t>(itemsize(d)));
                std::vector<double> expected;
                for (int64_t j = mine_at; j < mine_at + counts[rank]; ++j) {
                  expected.push_back(reduced(weight(j), n, op));
                }
                check_exact(out, expected, what);
              }
              INFO(what << " all_reduce");
              Tensor data = make_tensor(total, 0, d, [&](int64_t i) { return (rank + 1) * weight(i); });
              const int64_t sent = ring.all_reduce(d, op, data.data(), counts, tag++);
              const int64_t expected_sent = n == 1 ? 0 : 2 * total - counts[rank] - counts[(rank + 1) % n];
              CHECK(sent == expected_sent * static_cast<int64_t>(itemsize(d)));
              std::vector<double> expected;
              for (int64_t j = 0; j < total; ++j) expected.push_back(reduced(weight(j), n, op));
              check_exact(data, expected, what);
            }
          }
        }
      }
    });
  }
}

// A rank that never joins the call: the others' waits give up after the context's timeout,
// naming the ring's step; the failed ring refuses the next call at once, and its destructor
// waits for none of the credits it is owed (they died with the connections).
TEST_CASE("ring: an absent rank fails the call; the ring refuses later calls and goes away at once",
          "[collectives][ring][failure]") {
  run_ranks(3, [](int rank, int n) {
    auto pg = init_process_group(Backend::kGloo);
    const auto timeout = std::chrono::milliseconds(2000);
    auto context = ring_context(rank, n, *pg, "ring_failure_test", timeout);
    auto ring = std::make_unique<gloo_ring::Ring>(*context);
    if (rank == 2) {  // built its ring (peers may send to its pool), never runs a call
      pg->store()->wait({"test/survivors_done"}, std::chrono::seconds(60));
      return;
    }
    Tensor data = full({int64_t{1} << 18}, 1.0, kFloat32);  // 1 MiB: one piece per block
    std::vector<int64_t> blocks(n, (int64_t{1} << 18) / n);
    blocks[0] += (int64_t{1} << 18) % n;
    CHECK_THROWS_WITH(ring->all_reduce(kFloat32, ReduceOp::kSum, data.data(), blocks, 0),
                      Catch::Contains("ring reduce_scatter step") || Catch::Contains("closed"));
    CHECK_THROWS_WITH(ring->all_reduce(kFloat32, ReduceOp::kSum, data.data(), blocks, 1),
                      Catch::Contains("an earlier collective on this context failed"));
    const auto start = std::chrono::steady_clock::now();
    ring.reset();  // a ring that waited for its credits would take the whole timeout
    CHECK(std::chrono::steady_clock::now() - start < timeout / 2);
    pg->store()->add("test/survivors", 1);
    if (pg->store()->add("test/survivors", 0) == 2) pg->store()->set("test/survivors_done", "");
  });
}

}  // namespace
}  // namespace dtr
