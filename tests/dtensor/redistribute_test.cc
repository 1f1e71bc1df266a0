// DTensor on real ranks: distribute_tensor, from_local, redistribute (blocking, async,
// coalesced) and full_tensor over Gloo, checked against the global tensor every rank can
// compute, with the collectives issued counted and compared with the plan.
#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <random>

#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "dtensor/chunking.h"
#include "dtensor/dtensor.h"
#include "dtensor/explain.h"
#include "kernels/fill.h"
#include "tests/dtensor/distributed_data.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::contiguous_chunk_of;
using testing::global_tensor;
using testing::partial_terms;
using testing::run_ranks;
using testing::to_f64;

// Same dtype, shape and bytes: exact even where float64 cannot hold the values (int64's limits).
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data(), y.data(), static_cast<size_t>(x.numel()) * itemsize(x.dtype())) == 0;
}

Placement random_placement(std::mt19937_64& gen, int64_t ndim) {
  const int kind = static_cast<int>(gen() % 6);
  if (kind <= 1 && ndim > 0) return Shard(static_cast<int64_t>(gen() % ndim));
  if (kind == 2) return Partial(static_cast<ReduceOp>(gen() % 4));
  if (kind == 5 && ndim > 0)
    return StridedShard(static_cast<int64_t>(gen() % ndim), 2 + static_cast<int64_t>(gen() % 2));
  return Replicate();
}

// The nccl-tests size the counter records for each collective step, summed per kind.
std::map<CollectiveKind, std::pair<int64_t, int64_t>> expected_counts(const RedistributePlan& plan) {
  std::map<CollectiveKind, std::pair<int64_t, int64_t>> out;  // kind -> (calls, bytes)
  const DeviceMesh& mesh = plan.mesh();
  const int64_t me = std::find(mesh.ranks().begin(), mesh.ranks().end(), mesh.this_rank()) - mesh.ranks().begin();
  for (const RedistributeStep& step : plan.steps()) {
    if (!is_collective(step.op)) continue;
    const CollectiveKind kind = step.op == StepOp::kAllGather       ? CollectiveKind::kAllGather
                                : step.op == StepOp::kReduceScatter ? CollectiveKind::kReduceScatter
                                : step.op == StepOp::kAllToAll      ? CollectiveKind::kAllToAll
                                                                    : CollectiveKind::kAllReduce;
    const int64_t bytes = step.buffer_bytes[me];
    out[kind].first += 1;
    out[kind].second += bytes;
  }
  return out;
}

void check_counts_match(const RedistributePlan& plan, const std::string& what) {
  const auto expected = expected_counts(plan);
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllToAll,
                              CollectiveKind::kAllReduce}) {
    const auto it = expected.find(kind);
    INFO(what << ": " << collective_kind_name(kind) << "\n" << explain_plan(plan));
    CHECK(collective_counter().calls(kind) == (it == expected.end() ? 0 : it->second.first));
    CHECK(collective_counter().bytes(kind) == (it == expected.end() ? 0 : it->second.second));
  }
  CHECK(collective_counter().calls(CollectiveKind::kBroadcast) == 0);
}

// One seeded random case: redistribute from random to random placements and compare.
// Returns false when the drawn placements are not a legal spec or move (then nothing ran).
bool run_random_case(const DeviceMesh& mesh, std::mt19937_64& gen, uint64_t seed) {
  const int64_t ndim = static_cast<int64_t>(gen() % 4);
  Shape shape;
  for (int64_t d = 0; d < ndim; ++d) shape.push_back(static_cast<int64_t>(gen() % 7));  // 0..6: empty shards too
  Placements from, to;
  for (int64_t m = 0; m < mesh.ndim(); ++m) from.push_back(random_placement(gen, ndim));
  for (int64_t m = 0; m < mesh.ndim(); ++m) to.push_back(random_placement(gen, ndim));
  std::optional<DTensorSpec> source, target;
  try {
    source.emplace(mesh, from, shape, kFloat64);
    target.emplace(mesh, to, shape, kFloat64);
    plan_redistribute(*source, to);
  } catch (const ValueError&) {
    return false;  // a mix of Partial ops the spec or planner rejects: tested in redistribute_plan_test
  }
  const std::string what = fmt::format("case {}: {} {} -> {} on {}", seed, shape, placements_str(from),
                                       placements_str(to), mesh.to_string());
  const Tensor full = global_tensor(shape, seed);
  DTensor x = from_local(partial_terms(full, *source, seed), mesh, from, shape);
  collective_counter().reset();
  DTensor y = x.redistribute(to);
  check_counts_match(plan_redistribute(*source, to), what);
  INFO(what);
  CHECK(y.placements() == to);
  CHECK(y.to_local().shape() == target->local_shape());
  if (!target->has_partial())
    CHECK(to_f64(y.to_local()) == to_f64(ranges_of(full, target->local_ranges()).contiguous()));
  CHECK(to_f64(y.full_tensor()) == to_f64(full));
  // Every plan the planner weighed gives the same tensor: merged or not, in any order.
  for (const RedistributePlan& alt : plan_alternatives(*source, to)) {
    INFO("alternative: " << alt.strategy() << "\n" << explain_plan(alt));
    const std::vector<Tensor> locals = execute_redistribute(alt, {x.to_local()});
    CHECK(to_f64(from_local(locals[0], mesh, to, shape).full_tensor()) == to_f64(full));
  }
  return true;
}

TEST_CASE("random redistributes on 1-D meshes of 1, 2 and 3 ranks", "[dtensor][redistribute]") {
  for (int world : {1, 2, 3}) {
    run_ranks(world, [](int, int world) {
      DeviceMesh mesh = init_device_mesh(kCPU, {world});
      std::mt19937_64 gen(1000 + world);
      int ran = 0;
      for (uint64_t c = 0; c < 50; ++c) ran += run_random_case(mesh, gen, c);
      CHECK(ran >= 40);
    });
  }
}

TEST_CASE("random redistributes on 4 ranks: 1-D, 2x2, 1x4 and 4x1 meshes", "[dtensor][redistribute]") {
  run_ranks(4, [](int, int) {
    init_process_group(Backend::kGloo);
    int ran = 0;
    for (Shape shape : {Shape{4}, Shape{2, 2}, Shape{1, 4}, Shape{4, 1}}) {
      DeviceMesh mesh = init_device_mesh(
          kCPU, shape, shape.size() == 1 ? std::vector<std::string>{"dp"} : std::vector<std::string>{"dp", "tp"});
      std::mt19937_64 gen(7 + shape[0]);
      for (uint64_t c = 0; c < 70; ++c) ran += run_random_case(mesh, gen, c);
      if (shape.size() == 1) continue;
      // The transposed view (FSDP x TP's tp-first mesh): the same groups, the ranks in
      // another order, placements nesting tp first.
      const std::vector<std::string> tp_dp = {"tp", "dp"};
      for (uint64_t c = 0; c < 30; ++c) ran += run_random_case(mesh.submesh(tp_dp), gen, 100 + c);
    }
    CHECK(ran >= 250);  // at least 250 random cases on 4 ranks per run
  });
}

TEST_CASE("random redistributes on a 2x2x2 mesh of 8 ranks", "[dtensor][redistribute]") {
  run_ranks(8, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2, 2, 2}, {"pp", "dp", "tp"});
    // One flattened group per range of adjacent mesh dims; sub-meshes keep those still adjacent.
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {1, 2}, {0, 3}}) {
      CHECK(mesh.flattened_group(first, count).size() == (count == 3 ? 8 : 4));
      CHECK(mesh.flattened_group(first, count).rank() == mesh.flat_index(first, count));
    }
    const std::vector<std::string> dp_tp = {"dp", "tp"}, pp_tp = {"pp", "tp"};
    CHECK(&mesh.submesh(dp_tp).flattened_group(0, 2) == &mesh.flattened_group(1, 2));
    CHECK_FALSE(mesh.submesh(pp_tp).can_flatten(0, 2));
    CHECK_FALSE(plan_redistribute(DTensorSpec(mesh.submesh(pp_tp), {Shard(0), Shard(0)}, {8}, kFloat32),
                                  {Replicate(), Replicate()})
                    .steps()[0]
                    .num_mesh_dims > 1);
    // HSDP x TP's tp-first view keeps (pp, dp)'s flattened group, now at mesh dims 1 and 2.
    const std::vector<std::string> tp_pp_dp = {"tp", "pp", "dp"};
    const DeviceMesh tp_first = mesh.submesh(tp_pp_dp);
    CHECK(&tp_first.flattened_group(1, 2) == &mesh.flattened_group(0, 2));
    CHECK_FALSE(tp_first.can_flatten(0, 2));
    std::mt19937_64 gen(2026);
    int ran = 0;
    for (uint64_t c = 0; c < 40; ++c) ran += run_random_case(mesh, gen, c);
    for (uint64_t c = 0; c < 20; ++c) ran += run_random_case(tp_first, gen, 100 + c);
    CHECK(ran >= 37);
  });
}

TEST_CASE("a 1-D sub-mesh unflattened gets its own groups, made among its ranks only", "[dtensor][redistribute]") {
  run_ranks(8, [](int rank, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 4}, {"pp", "dp"});
    const DeviceMesh dp = mesh["dp"];  // ranks 0..3 or 4..7
    const DeviceMesh pairs = dp.unflatten({2, 2}, {"replicate", "shard"});
    CHECK(pairs.ranks() == dp.ranks());
    const int base = rank / 4 * 4;
    const std::vector<int> pair =
        rank % 4 < 2 ? std::vector<int>{base, base + 1} : std::vector<int>{base + 2, base + 3};
    CHECK(pairs.group(1).global_ranks() == pair);
    CHECK(&pairs.flattened_group(0, 2) == &dp.group(0));
    std::mt19937_64 gen(7);
    int ran = 0;
    for (uint64_t c = 0; c < 20; ++c) ran += run_random_case(pairs, gen, c);
    CHECK(ran >= 10);
    CHECK_THROWS_MATCHES(mesh.unflatten({4, 2}, {}), ValueError, testing::MessageContains("must be a 1-D mesh"));
    CHECK_THROWS_MATCHES(dp.unflatten({3, 2}, {}), ValueError, testing::MessageContains("holds 6 ranks"));
  });
}

TEST_CASE("merged collectives run over the flattened group, even and uneven", "[dtensor][redistribute][merged]") {
  run_ranks(4, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2, 2}, {"dp", "tp"});
    // 8 rows: the chosen plan merges; 5 rows (nested 2,1,1,1): it does not, but the merged
    // alternative still gives the exact tensor.
    for (int64_t rows : {8, 7, 5, 0}) {
      for (const auto& [from, to] : std::vector<std::pair<Placements, Placements>>{
               {{Shard(0), Shard(0)}, {Replicate(), Replicate()}},
               {{Partial(), Partial()}, {Replicate(), Replicate()}},
               {{Partial(), Partial()}, {Shard(0), Shard(0)}},
               {{Partial(ReduceOp::kMax), Partial(ReduceOp::kMax)}, {Shard(0), Shard(0)}}}) {
        const Shape shape = {rows, 3};
        const Tensor full = global_tensor(shape, 40 + rows);
        const DTensorSpec spec(mesh, from, shape, kFloat64);
        const DTensor x = from_local(partial_terms(full, spec, 5), mesh, from, shape);
        int merged_plans = 0;
        for (const RedistributePlan& alt : plan_alternatives(spec, to)) {
          const bool merged = alt.num_collectives() == 1;
          merged_plans += merged;
          INFO(explain_plan(alt));
          collective_counter().reset();
          const std::vector<Tensor> locals = execute_redistribute(alt, {x.to_local()});
          CHECK(collective_counter().snapshot().size() == static_cast<size_t>(alt.num_collectives()));
          if (merged) CHECK(collective_counter().snapshot()[0].group == mesh.flattened_group(0, 2).name());
          const DTensor y = from_local(locals[0], mesh, to, shape);
          CHECK(to_f64(y.full_tensor()) == to_f64(full));
          if (to[0].is_shard()) CHECK(to_f64(locals[0]) == to_f64(contiguous_chunk_of(full, y.spec().local_chunk())));
        }
        CHECK(merged_plans == 1);
        // An all_reduce always gains from merging (2(n-1)/n of the tensor over n ranks); the
        // others lose at 5 rows, where padding every block to 2 rows costs more.
        const bool all_reduce = to[0].is_replicate() && from[0].is_partial();
        CHECK((plan_redistribute(spec, to).num_collectives() == 1) == (all_reduce || rows != 5));
      }
    }
  });
}

TEST_CASE("Shard -> Partial is local: pads with the reduction's identity", "[dtensor][redistribute][partial]") {
  run_ranks(3, [](int rank, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {3});
    for (DType dtype : {kFloat64, kInt64, kInt32, kBool}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        if (dtype == kBool && op == ReduceOp::kSum) continue;
        // Values at the dtype's extremes: the identity must not win against them.
        Tensor full = global_tensor({7, 2}, 3).to(dtype);
        if (dtype == kInt64) {
          full.data_ptr<int64_t>()[0] = std::numeric_limits<int64_t>::max();
          full.data_ptr<int64_t>()[1] = std::numeric_limits<int64_t>::lowest();
        }
        const DTensor x = distribute_tensor(full, mesh, {Shard(0)});
        collective_counter().reset();
        const DTensor y = x.redistribute({Partial(op)});
        INFO(dtype_name(dtype) << " " << reduce_op_name(op));
        CHECK(collective_counter().snapshot().empty());
        CHECK(y.to_local().shape() == Shape{7, 2});
        // This rank's rows hold its shard; the others the identity (zeros for sum).
        const ChunkRange mine = chunk_range(7, 3, rank);
        CHECK(same_bits(y.to_local().narrow(0, mine.offset, mine.length), x.to_local()));
        CHECK(same_bits(y.full_tensor(), full));
      }
    }
  });
}

TEST_CASE("classic transitions issue the expected collectives", "[dtensor][redistribute]") {
  run_ranks(4, [](int rank, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {4});
    const Tensor full = global_tensor({10, 6}, 3);  // 10 rows over 4 ranks: 3, 3, 3, 1
    struct Case {
      Placement from, to;
      CollectiveKind kind;
    };
    for (const Case& c :
         {Case{Shard(0), Replicate(), CollectiveKind::kAllGather}, Case{Shard(0), Shard(1), CollectiveKind::kAllToAll},
          Case{Partial(), Replicate(), CollectiveKind::kAllReduce},
          Case{Partial(), Shard(0), CollectiveKind::kReduceScatter},
          Case{Partial(ReduceOp::kAvg), Shard(1), CollectiveKind::kReduceScatter}}) {
      DTensorSpec spec(mesh, {c.from}, full.shape(), kFloat64);
      DTensor x = from_local(partial_terms(full, spec, 9), mesh, {c.from}, full.shape());
      collective_counter().reset();
      DTensor y = x.redistribute({c.to});
      INFO(c.from.str() << " -> " << c.to.str());
      CHECK(collective_counter().calls(c.kind) == 1);
      CHECK(collective_counter().snapshot().size() == 1);
      CHECK(to_f64(y.full_tensor()) == to_f64(full));
    }
    // Replicate -> Shard is local, and Replicate -> Partial(sum) keeps the value on coordinate 0 only.
    DTensor r = distribute_tensor(full, mesh, {Replicate()});
    collective_counter().reset();
    DTensor s = r.redistribute({Shard(1)});
    DTensor p = r.redistribute({Partial()});
    CHECK(collective_counter().snapshot().empty());
    CHECK(to_f64(s.to_local()) == to_f64(contiguous_chunk_of(full, s.spec().local_chunk())));
    CHECK(to_f64(p.to_local()) == (rank == 0 ? to_f64(full) : std::vector<double>(60, 0.0)));
    CHECK(to_f64(p.full_tensor()) == to_f64(full));
  });
}

TEST_CASE("distribute_tensor broadcasts coordinate 0's data; uneven and empty shards", "[dtensor]") {
  run_ranks(4, [](int rank, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2, 2}, {"dp", "tp"});
    const Tensor full = global_tensor({5, 3}, 11);
    // Only rank 0's values count: the others pass garbage of the same shape.
    Tensor mine = rank == 0 ? full : global_tensor({5, 3}, 99 + rank);
    DTensor x = distribute_tensor(mine, mesh, {Shard(0), Shard(0)});  // rows 0:2, 2:3, 3:4, 4:5
    CHECK(x.to_local().shape() == Shape{rank == 0 ? 2 : 1, 3});
    CHECK(to_f64(x.full_tensor()) == to_f64(full));
    CHECK(to_f64(x.to_local()) == to_f64(contiguous_chunk_of(full, x.spec().local_chunk())));
    DTensor y = distribute_tensor(mine, mesh, {Replicate(), Shard(1)});
    CHECK(to_f64(y.redistribute({Shard(1), Shard(0)}).full_tensor()) == to_f64(full));
    // A dim smaller than the mesh: ranks past its end hold empty shards.
    DTensor tiny = distribute_tensor(rank == 0 ? global_tensor({1, 2}, 5) : zeros({1, 2}, kFloat64), mesh,
                                     {Shard(0), Replicate()});
    CHECK(tiny.to_local().shape() == Shape{rank < 2 ? 1 : 0, 2});
    CHECK(to_f64(tiny.full_tensor()) == to_f64(global_tensor({1, 2}, 5)));
  });
}

TEST_CASE("async and coalesced redistribute", "[dtensor][redistribute]") {
  run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    std::vector<DTensor> params;
    std::vector<Tensor> fulls;
    for (int i = 0; i < 3; ++i) {
      fulls.push_back(global_tensor({3 + i, 4}, 20 + i));  // 3 and 5 rows are uneven over 2 ranks
      params.push_back(distribute_tensor(fulls.back(), mesh, {Shard(0)}));
    }
    collective_counter().reset();
    std::vector<DTensor> gathered = redistribute_coalesced(params, {Replicate()}, Async::kYes);
    for (const DTensor& g : gathered) CHECK(g.is_pending());
    for (size_t i = 0; i < gathered.size(); ++i) {
      CHECK(to_f64(gathered[i].to_local()) == to_f64(fulls[i]));
      CHECK_FALSE(gathered[i].is_pending());
    }
    CHECK(collective_counter().calls(CollectiveKind::kAllGather) == 1);  // one collective for three tensors
    DTensor pending = params[1].redistribute({Replicate()}, Async::kYes);
    CHECK(pending.is_pending());
    CHECK(to_f64(pending.full_tensor()) == to_f64(fulls[1]));
  });
}

TEST_CASE("redistribute is differentiable: gradients go back to the source placements", "[dtensor][autograd]") {
  run_ranks(2, [](int rank, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor full = global_tensor({5, 3}, 4);
    DTensor x = distribute_tensor(full, mesh, {Shard(0)});
    x.requires_grad_();
    // S(0) -> R forward; a Replicate gradient comes back as a local chunk (no collective).
    DTensor y = x.redistribute({Replicate()});
    CHECK(y.grad_fn() != nullptr);
    DTensor replicated_grad = distribute_tensor(full, mesh, {Replicate()});
    collective_counter().reset();
    y.backward(replicated_grad, RetainGraph::kYes);
    CHECK(collective_counter().snapshot().empty());
    CHECK(to_f64(x.grad().to_local()) == to_f64(contiguous_chunk_of(full, x.spec().local_chunk())));
    // A Partial(sum) gradient (each rank's term is full) is reduce-scattered: FSDP's gradient path.
    x.set_grad({});
    DTensor partial_grad = from_local(full, mesh, {Partial()});
    collective_counter().reset();
    y.backward(partial_grad);
    CHECK(collective_counter().calls(CollectiveKind::kReduceScatter) == 1);
    CHECK(x.grad().placements() == Placements{Shard(0)});
    std::vector<double> twice = to_f64(contiguous_chunk_of(full, x.spec().local_chunk()));
    for (double& v : twice) v *= 2;
    CHECK(to_f64(x.grad().to_local()) == twice);
    // Saved state is released after backward: a second backward is an error.
    CHECK_THROWS_WITH(y.backward(from_local(full, mesh, {Partial()})), Catch::Contains("RetainGraph::kYes"));
    // Gradients accumulate (+=) across backward calls, and hooks see them.
    x.set_grad({});
    int seen = 0;
    x.register_hook([&](const DTensor& g) {
      ++seen;
      CHECK(g.placements() == Placements{Shard(0)});
      return DTensor();
    });
    for (int i = 0; i < 2; ++i) x.redistribute({Replicate()}).backward(distribute_tensor(full, mesh, {Replicate()}));
    CHECK(seen == 2);
    // Two backward passes of `full` sum to 2 * full.
    CHECK(to_f64(x.grad().to_local()) == twice);
    CHECK(rank < 2);
  });
}

TEST_CASE("bad input: typed errors naming tensors, shapes, meshes and placements", "[dtensor][errors]") {
  run_ranks(2, [](int rank, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    const Tensor full = global_tensor({4, 2}, 1);
    CHECK_THROWS_AS(distribute_tensor(full, mesh, {Shard(2)}), IndexError);
    CHECK_THROWS_AS(distribute_tensor(full, mesh, {Shard(0), Replicate()}), ValueError);
    CHECK_THROWS_WITH(distribute_tensor(full, mesh, {Shard(0), Replicate()}), Catch::Contains("mesh"));
    // Ranks passing different local shapes to from_local: every rank raises.
    CHECK_THROWS_WITH(from_local(zeros({rank == 0 ? 2 : 3, 2}, kFloat64), mesh, {Shard(0)}),
                      Catch::Contains("from_local") && Catch::Contains("uneven"));
    CHECK_THROWS_AS(from_local(zeros({2, 2}, kFloat64), mesh, {Shard(0)}, Shape{5, 2}), ValueError);
    DTensor p = from_local(zeros({4, 2}, kFloat64), mesh, {Partial()});
    CHECK_THROWS_WITH(p.redistribute({Partial(ReduceOp::kAvg)}),
                      Catch::Contains("P(sum)") && Catch::Contains("P(avg)"));
    DeviceMesh other = DeviceMesh::row_major(kCPU, {2}, {"tp"}, rank, 2);
    CHECK_THROWS_WITH(p.redistribute(other, {Replicate()}), Catch::Contains("cross-mesh"));
    // A mesh that is not the world.
    CHECK_THROWS_WITH(init_device_mesh(kCPU, {3}), Catch::Contains("world has 2"));
  });
}

}  // namespace
}  // namespace dtr
