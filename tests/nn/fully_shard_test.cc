// fully_shard and replicate on real ranks: 20 AdamW steps of a small causal Transformer
// (each block and the root sharded) on 1, 2, 3 (uneven shards, an empty batch shard) and 4
// ranks give the one-rank unsharded losses, clipped norms and weights, also with
// reshard_after_forward false, explicit prefetch (by hand, and set_prefetch_depth 0 and 2:
// checked also for the order it issues all-gathers in), gradient accumulation, HSDP on 2x2,
// Shard(1) matrices, bf16 parameters (within a stated tolerance) and CPU offload; every step's
// collectives are counted (one all-gather per group in forward, one more per resharded
// group in backward, one reduce-scatter per group; DDP: one all-reduce per bucket); the
// gathered parameters are released after each block's forward, and kept after backward
// with set_reshard_after_backward(false) (the next forward then gathers nothing); a layer
// with an empty shard trains; mistakes are typed errors.
#include <catch2/catch.hpp>

#include "checkpoint/full_state_dict.h"
#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "core/allocator.h"
#include "core/trace.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/reduce.h"
#include "dtensor/ops/view_ops.h"
#include "nn/container.h"
#include "nn/fully_shard.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/parameter.h"
#include "nn/replicate.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using checkpoint::full_state_dict;
using checkpoint::load_full_state_dict;

constexpr int64_t kBatch = 4, kSeq = 8, kVocab = 32, kSteps = 20;

enum class Sharding : uint8_t {
  kNone,
  kFsdp,
  kKeepGathered,
  kExplicitPrefetch,
  kPrefetchOff,     // set_prefetch_depth 0
  kPrefetchDepth2,  // set_prefetch_depth 2
  kMixedPrecision,
  kShardDim1,
  kReshardToPairs,  // reshard_after_forward = 2
  kHsdpByName,      // HSDP sharded over the mesh dim named "shard", mesh dim 0
  kCpuOffload,      // offload_policy (on a CPU mesh the shards are on the host already)
  kDdp,             // the replicated baseline, one bucket
  kDdpBuckets,      // with small buckets
};

// Whether each step is one batch, or two micro-batches (halves of it) with the first one's
// gradients accumulated (under FSDP without sync); or one batch after a forward whose
// result is dropped (no backward: what it gathered must not leak into the step).
enum class Accumulation : uint8_t { kNo, kTwoMicroBatches, kDroppedForwardFirst };

struct Run {
  std::vector<double> losses, norms;
  TensorMap weights;
  int64_t forward_gather_bytes = 0, reduce_scatter_bytes = 0;  // step 1's
};

int64_t calls(CollectiveKind kind) { return collective_counter().calls(kind); }

// kSteps of AdamW on `mesh` with the batch sharded over it; with FSDP, checks each step's
// collectives and that blocks hold no gathered parameters after forward.
Run train(const DeviceMesh& mesh, Sharding sharding, Accumulation accumulation = Accumulation::kNo) {
  manual_seed(42);
  Transformer model(testing::small_causal_lm(kVocab, kSeq));
  std::vector<FSDPModule*> blocks;
  FSDPModule* root = nullptr;
  DDPModule* ddp = nullptr;
  if (sharding == Sharding::kDdp || sharding == Sharding::kDdpBuckets) {
    ddp = &replicate(model, mesh, {.bucket_cap_mb = sharding == Sharding::kDdp ? 25 : 0.01});
    for (auto& [name, p] : model.named_parameters()) CHECK(p->placements() == Placements{Replicate()});
  } else if (sharding != Sharding::kNone) {
    FullyShardOptions options;
    if (sharding == Sharding::kKeepGathered) options.reshard_after_forward = false;
    if (sharding == Sharding::kReshardToPairs) options.reshard_after_forward = 2;
    if (sharding == Sharding::kHsdpByName) options.shard_mesh_dim = "shard";
    if (sharding == Sharding::kCpuOffload) options.offload_policy = CPUOffloadPolicy{};
    if (sharding == Sharding::kMixedPrecision) options.mp_policy = {.param_dtype = kBFloat16, .reduce_dtype = kFloat32};
    if (sharding == Sharding::kShardDim1) {  // matrices on their dim 1; vectors keep Shard(0)
      options.shard_placement_fn = [](const std::string&, const DTensor& p) -> std::optional<Placement> {
        return p.dim() == 2 ? std::optional(Shard(1)) : std::nullopt;
      };
    }
    for (auto& [name, m] : model.named_modules()) {
      if (m->type_name() == "TransformerBlock") blocks.push_back(&fully_shard(*m, mesh, options));
    }
    options.mp_policy.output_dtype = kFloat32;                                         // float32 logits for the loss
    if (sharding == Sharding::kReshardToPairs) options.reshard_after_forward.reset();  // the blocks only
    root = &fully_shard(model, mesh, options);
    if (sharding == Sharding::kExplicitPrefetch) {
      root->set_modules_to_forward_prefetch({blocks[0], blocks[1]});
      blocks[1]->set_modules_to_backward_prefetch({blocks[0]});
    }
    if (sharding == Sharding::kPrefetchOff) set_prefetch_depth(*root, blocks, 0);
    if (sharding == Sharding::kPrefetchDepth2) set_prefetch_depth(*root, blocks, 2);
    for (auto& [name, p] : model.named_parameters()) {
      INFO(name);
      const Placement shard = sharding == Sharding::kShardDim1 && p->dim() == 2 ? Shard(1) : Shard(0);
      Placements expected = mesh.ndim() == 1 ? Placements{shard} : Placements{Replicate(), shard};
      if (sharding == Sharding::kHsdpByName) expected = {shard, Replicate()};
      CHECK(p->placements() == expected);
      // Pinned memory is for copies to a CUDA device: a CPU mesh's host shards are pageable.
      if (sharding == Sharding::kCpuOffload) CHECK(!p->to_local().is_pinned());
    }
  }
  const DeviceMesh& data_mesh = sharding == Sharding::kNone ? single_rank_mesh() : mesh;
  // The batch is sharded over every mesh dim (HSDP's too).
  const Placements batch(data_mesh.ndim(), Shard(0));
  const Tensor tokens = testing::random_tensor({kBatch, kSeq}, kFloat64, 1, 0, kVocab).to(kInt64);
  const Tensor targets = testing::random_tensor({kBatch, kSeq}, kFloat64, 2, 0, kVocab).to(kInt64);
  const DTensor x = distribute_tensor(tokens, data_mesh, batch);
  const DTensor y = reshape(distribute_tensor(targets, data_mesh, batch), {kBatch * kSeq});
  optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
  Run run;
  // Collectives per step (none on one rank: a move over one rank is local).
  // Shard(1) matrices and Shard(0) vectors gather in two collectives per group; HSDP adds
  // one all-reduce over the replicate dim per group.
  const int64_t moves = sharding == Sharding::kShardDim1 ? 2 : 1;
  const int64_t groups = mesh.size() > 1 ? moves * (static_cast<int64_t>(blocks.size()) + 1) : 0;
  const int64_t all_reduces = mesh.ndim() == 2 ? groups : 0;
  const int64_t resharded =
      sharding == Sharding::kKeepGathered || mesh.size() == 1 ? 0 : moves * static_cast<int64_t>(blocks.size());
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step + 1);
    opt.zero_grad();
    if (accumulation == Accumulation::kDroppedForwardFirst) model(x);
    if (accumulation == Accumulation::kTwoMicroBatches) {
      // The first half's gradients, kept unreduced: no reduce-scatter (DDP: no all-reduce).
      if (root != nullptr) root->set_requires_gradient_sync(false);
      if (ddp != nullptr) ddp->set_requires_gradient_sync(false);
      const DTensor first = distribute_tensor(tokens.narrow(0, 0, kBatch / 2), data_mesh, batch);
      const DTensor first_y =
          reshape(distribute_tensor(targets.narrow(0, 0, kBatch / 2), data_mesh, batch), {kBatch / 2 * kSeq});
      const DTensor first_loss = cross_entropy(reshape(model(first), {kBatch / 2 * kSeq, kVocab}), first_y);
      collective_counter().reset();
      first_loss.backward();
      CHECK(calls(CollectiveKind::kReduceScatter) == 0);
      CHECK(calls(CollectiveKind::kAllReduce) == 0);
      if (root != nullptr) root->set_requires_gradient_sync(true);
      if (ddp != nullptr) ddp->set_requires_gradient_sync(true);
    }
    const DTensor xs = accumulation != Accumulation::kTwoMicroBatches
                           ? x
                           : distribute_tensor(tokens.narrow(0, kBatch / 2, kBatch / 2), data_mesh, batch);
    const DTensor ys = accumulation != Accumulation::kTwoMicroBatches
                           ? y
                           : reshape(distribute_tensor(targets.narrow(0, kBatch / 2, kBatch / 2), data_mesh, batch),
                                     {kBatch / 2 * kSeq});
    collective_counter().reset();
    const DTensor logits = model(xs);
    // The module's forward: one all-gather per FSDP group and nothing else (DDP: nothing).
    if (step == 0) run.forward_gather_bytes = collective_counter().bytes(CollectiveKind::kAllGather);
    // (After a dropped forward the groups it left gathered are dropped and gathered again.)
    if (root != nullptr && accumulation != Accumulation::kDroppedForwardFirst) {
      CHECK(calls(CollectiveKind::kAllGather) == groups);
      CHECK(issued_collectives() == groups);
      // The root keeps its parameters for backward; blocks release theirs (one rank moves
      // nothing: its "gathered" parameters are the shards).
      const bool many = mesh.size() > 1;
      for (FSDPModule* b : blocks) CHECK((b->gathered_bytes() > 0) == (many && sharding == Sharding::kKeepGathered));
      CHECK((root->gathered_bytes() > 0) == many);
    }
    if (ddp != nullptr) CHECK(issued_collectives() == 0);
    // When backward reaches the logits the root has prefetched the last block, and only it:
    // the other blocks gather when their own backward begins (memory stays one block deep).
    int64_t gathered_at_backward = -1;
    if (sharding == Sharding::kFsdp && mesh.size() > 1 && accumulation == Accumulation::kNo) {
      logits.register_hook([&](const DTensor&) {
        gathered_at_backward =
            std::count_if(blocks.begin(), blocks.end(), [](FSDPModule* b) { return b->gathered_bytes() > 0; });
        return DTensor();
      });
    }
    const DTensor loss = cross_entropy(reshape(logits, {xs.size(0) * kSeq, kVocab}), ys);
    collective_counter().reset();
    loss.backward();
    if (step == 0) run.reduce_scatter_bytes = collective_counter().bytes(CollectiveKind::kReduceScatter);
    if (gathered_at_backward >= 0) CHECK(gathered_at_backward == 1);
    if (ddp != nullptr && mesh.size() > 1) {  // one all-reduce per bucket, nothing else
      CHECK(calls(CollectiveKind::kAllReduce) == static_cast<int64_t>(ddp->buckets().size()));
      // With even batch shards nothing else moves. (3 ranks, whose batch shards are 2, 2
      // and 0 sequences, also issue two all_to_all in the first backward: the model's
      // own ops, not the buckets.)
      if (kBatch % mesh.size() == 0) CHECK(issued_collectives() == static_cast<int64_t>(ddp->buckets().size()));
      for (DTensor* p : model.parameters()) CHECK(p->grad().placements() == Placements{Replicate()});
    }
    if (root != nullptr) {
      CHECK(calls(CollectiveKind::kAllGather) == resharded);
      if (sharding == Sharding::kReshardToPairs) {  // backward's all-gathers stay within pairs of ranks
        for (const CollectiveCount& c : collective_counter().snapshot()) {
          INFO(c.group);
          if (c.kind == CollectiveKind::kAllGather) CHECK(c.group != mesh.group(0).name());
        }
      }
      CHECK(calls(CollectiveKind::kReduceScatter) == groups);
      CHECK(calls(CollectiveKind::kAllReduce) == all_reduces);
      CHECK(root->gathered_bytes() == 0);
      for (FSDPModule* b : blocks) CHECK(b->gathered_bytes() == 0);
    }
    run.norms.push_back(optim::clip_grad_norm_(model.parameters(), 1.0));
    opt.step();
    run.losses.push_back(loss.item());
  }
  run.weights = full_state_dict(model);
  return run;
}

void check_same(const Run& many, const Run& one) {
  for (int64_t step = 0; step < kSteps; ++step) {
    INFO("step " << step + 1);
    CHECK(many.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
    CHECK(many.norms[step] == Approx(one.norms[step]).epsilon(1e-5));
  }
  REQUIRE(many.weights.size() == one.weights.size());
  for (const auto& [name, w] : one.weights) {
    INFO(name);
    REQUIRE(many.weights.count(name) == 1);
    if (name.ends_with("in_proj_bias")) continue;  // its key third is AdamW on rounding noise
    testing::check_close(many.weights.at(name), w, {1e-3, 1e-4}, name);
  }
}

TEST_CASE("fully_shard trains like one rank on 1, 2, 3 and 4 ranks", "[nn][fully_shard]") {
  for (int world : {1, 2, 3, 4}) {
    testing::run_ranks(world, [](int, int world) {
      INFO(world << " ranks");
      const Run one = train(single_rank_mesh(), Sharding::kNone);
      check_same(train(init_device_mesh(kCPU, {world}, {"dp"}), Sharding::kFsdp), one);
    });
  }
}

TEST_CASE("fully_shard with gathered parameters kept, explicit prefetch and prefetch off trains like one rank",
          "[nn][fully_shard]") {
  testing::run_ranks(3, [](int, int) {
    const Run one = train(single_rank_mesh(), Sharding::kNone);
    const DeviceMesh mesh = init_device_mesh(kCPU, {3}, {"dp"});
    {
      INFO("reshard_after_forward = false");
      check_same(train(mesh, Sharding::kKeepGathered), one);
    }
    {
      INFO("explicit prefetch");
      check_same(train(mesh, Sharding::kExplicitPrefetch), one);
    }
    {
      INFO("prefetch off");
      check_same(train(mesh, Sharding::kPrefetchOff), one);
    }
    {
      INFO("prefetch 2 blocks ahead");
      check_same(train(mesh, Sharding::kPrefetchDepth2), one);
    }
  });
}

// The modules of the FSDP spans named `name` that began before (forward) or after `split_ns`.
std::vector<std::string> fsdp_modules(const std::vector<trace::ThreadEvents>& run, std::string_view name, bool forward,
                                      int64_t split_ns) {
  std::vector<std::string> out;
  for (const trace::ThreadEvents& t : run) {
    for (const trace::Event& e : t.events) {
      if (e.category != kFsdpCategory || e.name != name || (e.begin_ns < split_ns) != forward) continue;
      for (const trace::Arg& a : e.args) {
        if (a.key == "module") out.push_back(a.json);
      }
    }
  }
  return out;
}

TEST_CASE("set_prefetch_depth issues the next blocks' all-gathers ahead, nearest first, or none", "[nn][fully_shard]") {
  testing::run_ranks(2, [](int, int) {
    for (int64_t depth : {0, 1, 2}) {
      INFO("depth " << depth);
      manual_seed(1);
      TransformerConfig config = testing::small_causal_lm(kVocab, kSeq);
      config.n_layers = 4;
      Transformer model(config);
      const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
      std::vector<FSDPModule*> blocks;
      for (auto& [name, m] : model.named_modules()) {
        if (m->type_name() == "TransformerBlock") blocks.push_back(&fully_shard(*m, mesh));
      }
      FSDPModule& root = fully_shard(model, mesh);
      set_prefetch_depth(root, blocks, depth);
      const Tensor tokens = testing::random_tensor({kBatch, kSeq}, kFloat64, 1, 0, kVocab).to(kInt64);
      const DTensor x = distribute_tensor(tokens, mesh, {Shard(0)});
      trace::start(trace::bit(kFsdpCategory));
      const DTensor loss = sum(model(x));
      const int64_t split = trace::now_ns();
      loss.backward();
      const std::vector<trace::ThreadEvents> run = trace::stop();
      const std::vector<std::string> all = {"\"layers.0\"", "\"layers.1\"", "\"layers.2\"", "\"layers.3\""};
      const std::vector<std::string> reversed(all.rbegin(), all.rend());
      if (depth == 0) {  // each block gathers itself, in forward and again in backward
        CHECK(fsdp_modules(run, "unshard (issued)", true, split).empty());
        CHECK(fsdp_modules(run, "unshard (issued)", false, split).empty());
        CHECK(fsdp_modules(run, "unshard", true, split) ==
              std::vector<std::string>{"\"root\"", all[0], all[1], all[2], all[3]});
        CHECK(fsdp_modules(run, "unshard", false, split) == reversed);
      } else {  // every block's gather issued ahead, in the order they run; the root's alone waited for
        CHECK(fsdp_modules(run, "unshard (issued)", true, split) == all);
        CHECK(fsdp_modules(run, "unshard (issued)", false, split) == reversed);
        CHECK(fsdp_modules(run, "unshard", true, split) == std::vector<std::string>{"\"root\""});
        CHECK(fsdp_modules(run, "unshard", false, split).empty());
      }
    }
  });
}

TEST_CASE("HSDP on a 2x2 mesh, resharding onto pairs and Shard(1) parameters train like one rank",
          "[nn][fully_shard]") {
  testing::run_ranks(4, [](int, int) {
    const Run one = train(single_rank_mesh(), Sharding::kNone);
    {
      INFO("HSDP (Replicate, Shard(0)) on 2x2");
      check_same(train(init_device_mesh(kCPU, {2, 2}, {"replicate", "shard"}), Sharding::kFsdp), one);
    }
    {
      INFO("HSDP sharded over mesh dim 0, chosen by name");
      check_same(train(init_device_mesh(kCPU, {2, 2}, {"shard", "replicate"}), Sharding::kHsdpByName), one);
    }
    {
      INFO("reshard_after_forward = 2 on 4 ranks");
      check_same(train(init_device_mesh(kCPU, {4}, {"dp"}), Sharding::kReshardToPairs), one);
    }
    {
      INFO("shard_placement_fn: Shard(1) for matrices, on 4 ranks");
      check_same(train(init_device_mesh(kCPU, {4}, {"dp"}), Sharding::kShardDim1), one);
    }
  });
}

TEST_CASE("resharding onto pairs within a sub-mesh of the world trains like one rank", "[nn][fully_shard]") {
  testing::run_ranks(8, [](int, int) {
    // FSDP over mesh["dp"] (4 of the 8 ranks) with reshard_after_forward = 2: backward's
    // all-gathers run within pairs of the dp group's ranks.
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 4}, {"pp", "dp"});
    check_same(train(mesh["dp"], Sharding::kReshardToPairs), train(single_rank_mesh(), Sharding::kNone));
  });
}

TEST_CASE("the DDP baseline (replicate) trains like one rank, one all-reduce per bucket", "[nn][replicate]") {
  for (int world : {2, 3, 4}) {
    testing::run_ranks(world, [](int, int world) {
      INFO(world << " ranks");
      const Run one = train(single_rank_mesh(), Sharding::kNone);
      const DeviceMesh mesh = init_device_mesh(kCPU, {world}, {"dp"});
      check_same(train(mesh, Sharding::kDdp), one);
      check_same(train(mesh, Sharding::kDdpBuckets), one);
    });
  }
}

TEST_CASE("fully_shard and replicate with gradient accumulation without sync train like one rank",
          "[nn][fully_shard][replicate]") {
  testing::run_ranks(2, [](int, int) {
    const Run one = train(single_rank_mesh(), Sharding::kNone, Accumulation::kTwoMicroBatches);
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    check_same(train(mesh, Sharding::kFsdp, Accumulation::kTwoMicroBatches), one);
    check_same(train(mesh, Sharding::kDdpBuckets, Accumulation::kTwoMicroBatches), one);
  });
}

TEST_CASE("CPU offload trains like one rank, with HSDP and with gradient accumulation", "[nn][fully_shard]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    check_same(train(mesh, Sharding::kCpuOffload), train(single_rank_mesh(), Sharding::kNone));
    check_same(train(mesh, Sharding::kCpuOffload, Accumulation::kTwoMicroBatches),
               train(single_rank_mesh(), Sharding::kNone, Accumulation::kTwoMicroBatches));
  });
  testing::run_ranks(4, [](int, int) {
    check_same(train(init_device_mesh(kCPU, {2, 2}, {"replicate", "shard"}), Sharding::kCpuOffload),
               train(single_rank_mesh(), Sharding::kNone));
  });
}

TEST_CASE("fully_shard: a forward without backward changes nothing, and loaded weights are followed",
          "[nn][fully_shard]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    check_same(train(mesh, Sharding::kFsdp, Accumulation::kDroppedForwardFirst),
               train(single_rank_mesh(), Sharding::kNone));
    // Weights loaded after fully_shard (a resumed run) are what the next forward gathers.
    manual_seed(5);
    Transformer other(testing::small_causal_lm(kVocab, kSeq));
    const TensorMap weights = full_state_dict(other);
    manual_seed(42);
    Transformer model(testing::small_causal_lm(kVocab, kSeq));
    for (auto& [name, m] : model.named_modules()) {
      if (m->type_name() == "TransformerBlock") fully_shard(*m, mesh);
    }
    fully_shard(model, mesh);
    const Tensor tokens = testing::random_tensor({kBatch, kSeq}, kFloat64, 1, 0, kVocab).to(kInt64);
    model(distribute_tensor(tokens, mesh, {Shard(0)}));  // gathers the initial weights once
    load_full_state_dict(model, weights);
    const Tensor sharded_logits = model(distribute_tensor(tokens, mesh, {Shard(0)})).full_tensor();
    const Tensor expected = other(distribute_tensor(tokens, single_rank_mesh(), {Replicate()})).full_tensor();
    testing::check_close(sharded_logits, expected, {1e-5, 1e-5}, "logits after load");
  });
}

TEST_CASE("a sharded forward that threw leaves nothing behind: the next model's forward is its own",
          "[nn][fully_shard]") {
  // The open forward's root is kept per thread; a forward that throws never closes it. The
  // next forward, of another model, must not take that root (alive, or freed) for its own.
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    const Run reference = train(mesh, Sharding::kFsdp);
    for (const bool keep_alive : {true, false}) {
      INFO((keep_alive ? "the model whose forward threw is alive" : "the model whose forward threw is gone"));
      auto broken = std::make_unique<Transformer>(testing::small_causal_lm(kVocab, kSeq));
      for (auto& [name, m] : broken->named_modules()) {
        if (m->type_name() == "TransformerBlock") fully_shard(*m, mesh);
      }
      fully_shard(*broken, mesh);
      // Float tokens: the root's pre-forward runs, then the embedding refuses them.
      const Tensor floats = testing::random_tensor({kBatch, kSeq}, kFloat32, 1, 0, kVocab);
      CHECK_THROWS_AS((*broken)(distribute_tensor(floats, mesh, {Shard(0)})), TypeError);
      if (!keep_alive) broken.reset();
      check_same(train(mesh, Sharding::kFsdp), reference);
    }
  });
}

TEST_CASE("fully_shard with bfloat16 parameters and float32 reduction tracks float32 training", "[nn][fully_shard]") {
  testing::run_ranks(2, [](int, int) {
    const Run one = train(single_rank_mesh(), Sharding::kNone);
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    const Run full = train(mesh, Sharding::kFsdp);
    const Run mixed = train(mesh, Sharding::kMixedPrecision);
    // The all-gathers move bfloat16, half the bytes; the reduce-scatters float32.
    CHECK(mixed.forward_gather_bytes * 2 == full.forward_gather_bytes);
    CHECK(mixed.reduce_scatter_bytes == full.reduce_scatter_bytes);
    // bfloat16 keeps 8 significant bits (a relative rounding of 2^-9 per value), in every
    // weight and activation of the blocks; over 20 AdamW steps at lr 1e-2 the two runs'
    // losses drift apart by about 1.4% (measured), so 2% is the bound.
    double worst = 0;
    for (int64_t step = 0; step < kSteps; ++step) {
      worst = std::max(worst, std::abs(mixed.losses[step] - one.losses[step]) / one.losses[step]);
    }
    INFO("worst relative loss difference " << worst);
    CHECK(worst < 2e-2);
    for (const auto& [name, w] : mixed.weights) CHECK(w.dtype() == kFloat32);
  });
}

// Two layers of which forward uses only the first.
class OneOfTwo : public UnaryModule {
 public:
  OneOfTwo() : UnaryModule("OneOfTwo") {
    used_ = register_module("used", std::make_shared<Linear>(4, 4));
    unused_ = register_module("unused", std::make_shared<Linear>(4, 4));
  }

 protected:
  DTensor forward(const DTensor& x) override { return (*used_)(x); }

 private:
  std::shared_ptr<Linear> used_, unused_;
};

TEST_CASE("a parameter unused in the step joins its group's one reduce-scatter with a zero gradient",
          "[nn][fully_shard]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    manual_seed(3);
    OneOfTwo model;
    fully_shard(model, mesh);
    const DTensor x = distribute_tensor(testing::random_tensor({4, 4}, kFloat32, 5), mesh, {Shard(0)});
    const DTensor y = model(x);
    collective_counter().reset();
    sum(y).backward();
    CHECK(calls(CollectiveKind::kReduceScatter) == 1);
    CHECK(issued_collectives() == 1);
    std::vector<Tensor> grads;
    for (auto& [name, p] : model.named_parameters()) {
      INFO(name);
      REQUIRE(p->grad().defined());
      CHECK(p->grad().placements() == Placements{Shard(0)});
      const double magnitude = sum(mul(p->grad(), p->grad())).item();
      CHECK((magnitude == 0) == name.starts_with("unused"));
      grads.push_back(p->grad().full_tensor());
    }
    // A divide factor of 1: the sum over the 2 ranks of their local-mean gradients, twice
    // the global gradient.
    fsdp_module(model)->set_gradient_divide_factor(1.0);
    model.zero_grad();
    sum(model(x)).backward();
    const std::vector<DTensor*> params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      testing::check_close(params[i]->grad().full_tensor(), mul(grads[i], 2.0), {1e-6, 1e-6}, "grad");
    }
    CHECK_THROWS_MATCHES(fsdp_module(model)->set_gradient_divide_factor(0), ValueError,
                         testing::MessageContains("must be positive"));
  });
}

// Two layers, each its own group (or replicated), whose outputs are summed; with
// `drop_second` the forward still runs the second but returns the first alone, so the loss
// does not reach the second layer (as on a rank whose batch skips a branch). The second
// has no bias: its weight's gradient is Partial (each rank's own rows), so the ranks'
// different graphs still define it; a bias gradient would be Replicate, which claims every
// rank computed the same thing.
class TwoBranches : public UnaryModule {
 public:
  TwoBranches() : UnaryModule("TwoBranches") {
    first = register_module("first", std::make_shared<Linear>(4, 4));
    second = register_module("second", std::make_shared<Linear>(4, 4, LinearOptions{.bias = false}));
  }
  std::shared_ptr<Linear> first, second;
  bool drop_second = false;

 protected:
  DTensor forward(const DTensor& x) override {
    const DTensor a = (*first)(x), b = (*second)(x);
    return drop_second ? a : add(a, b);
  }
};

// The gradients when the loss is sum(first(x)) + sum(second(rows)) on one rank: what two
// ranks give when rank 1's loss drops the second branch and rank 0 holds `rows` of x.
TensorMap unreached_reference(const Tensor& x, const Tensor& rows) {
  manual_seed(3);
  TwoBranches model;
  const DeviceMesh& one = single_rank_mesh();
  add(sum((*model.first)(distribute_tensor(x, one, {Replicate()}))),
      sum((*model.second)(distribute_tensor(rows, one, {Replicate()}))))
      .backward();
  TensorMap grads;
  for (auto& [name, p] : model.named_parameters()) grads.emplace(name, p->grad().full_tensor());
  return grads;
}

TEST_CASE("a group or parameter the loss does not reach on one rank is reduced with zero gradients there",
          "[nn][fully_shard][replicate]") {
  testing::run_ranks(2, [](int rank, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    const Tensor x = testing::random_tensor({4, 4}, kFloat32, 5);
    const TensorMap expected = unreached_reference(x, x.narrow(0, 0, 2));
    for (const bool sharded : {true, false}) {
      INFO((sharded ? "fully_shard" : "replicate"));
      manual_seed(3);
      TwoBranches model;
      model.drop_second = rank == 1;
      if (sharded) {
        fully_shard(*model.first, mesh);
        fully_shard(*model.second, mesh);
        fully_shard(model, mesh);
      } else {
        replicate(model, mesh, {.bucket_cap_mb = 1e-5});  // a bucket per parameter
      }
      const DTensor input = distribute_tensor(x, mesh, {Shard(0)});
      for (int step = 0; step < 2; ++step) {  // the second step finds no state left behind
        INFO("step " << step);
        model.zero_grad();
        const DTensor y = model(input);
        collective_counter().reset();
        sum(y).backward();
        // Every rank issues the same reductions: one reduce-scatter per group (the root's
        // holds no parameter), or one all-reduce per parameter's bucket.
        if (sharded) CHECK(calls(CollectiveKind::kReduceScatter) == 2);
        if (!sharded) CHECK(calls(CollectiveKind::kAllReduce) == 3);
        for (auto& [name, p] : model.named_parameters()) {
          INFO(name);
          REQUIRE(p->grad().defined());
          testing::check_close(p->grad().full_tensor(), expected.at(name), {1e-6, 1e-6}, name);
        }
      }
    }
  });
}

TEST_CASE("a reduce-scatter still in flight after a backward that is not the last", "[nn][fully_shard]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    manual_seed(3);
    OneOfTwo model;
    FSDPModule& root = fully_shard(model, mesh);
    const DTensor x = distribute_tensor(testing::random_tensor({4, 4}, kFloat32, 5), mesh, {Shard(0)});
    sum(model(x)).backward();
    std::vector<Tensor> once;
    for (DTensor* p : model.parameters()) {
      CHECK_FALSE(p->grad().is_pending());  // a last backward waits for its reduction
      once.push_back(p->grad().full_tensor());
    }
    model.zero_grad();
    root.set_is_last_backward(false);
    sum(model(x)).backward();
    for (DTensor* p : model.parameters()) CHECK(p->grad().is_pending());
    // A second micro-batch accumulates into the pending gradients (reading them waits).
    root.set_is_last_backward(true);
    sum(model(x)).backward();
    const std::vector<DTensor*> params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      CHECK_FALSE(params[i]->grad().is_pending());
      testing::check_close(params[i]->grad().full_tensor(), mul(once[i], 2.0), {1e-6, 1e-6}, "accumulated grad");
    }
  });
}

TEST_CASE("set_reshard_after_backward(false) keeps the gathered parameters: the next forward gathers nothing",
          "[nn][fully_shard]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    const Tensor tokens = testing::random_tensor({kBatch, kSeq}, kFloat64, 1, 0, kVocab).to(kInt64);
    const DTensor x = distribute_tensor(tokens, mesh, {Shard(0)});
    // Two micro-batches, their gradients accumulated, with every group resharded after
    // backward or kept gathered; the second micro-batch's collectives.
    struct Accumulated {
      int64_t groups = 0, blocks = 0;
      int64_t forward_gathers = 0, backward_gathers = 0, reduce_scatters = 0;
      std::vector<Tensor> grads;
    };
    auto accumulate = [&](bool reshard_after_backward) {
      manual_seed(42);
      Transformer model(testing::small_causal_lm(kVocab, kSeq));
      std::vector<FSDPModule*> groups;
      for (auto& [name, m] : model.named_modules()) {
        if (m->type_name() == "TransformerBlock") groups.push_back(&fully_shard(*m, mesh));
      }
      Accumulated a;
      a.blocks = static_cast<int64_t>(groups.size());
      groups.push_back(&fully_shard(model, mesh));
      a.groups = static_cast<int64_t>(groups.size());
      for (FSDPModule* g : groups) g->set_reshard_after_backward(reshard_after_backward);
      sum(model(x)).backward();
      // Kept: every group still holds its whole parameters on every rank.
      for (FSDPModule* g : groups) CHECK((g->gathered_bytes() > 0) == !reshard_after_backward);
      collective_counter().reset();
      const DTensor loss = sum(model(x));
      a.forward_gathers = calls(CollectiveKind::kAllGather);
      collective_counter().reset();
      loss.backward();
      a.backward_gathers = calls(CollectiveKind::kAllGather);
      a.reduce_scatters = calls(CollectiveKind::kReduceScatter);
      for (FSDPModule* g : groups) CHECK((g->gathered_bytes() > 0) == !reshard_after_backward);
      for (DTensor* p : model.parameters()) a.grads.push_back(p->grad().full_tensor());
      return a;
    };
    const Accumulated resharded = accumulate(true), kept = accumulate(false);
    REQUIRE(resharded.blocks == 2);
    CHECK(resharded.forward_gathers == resharded.groups);  // each group gathers again
    CHECK(kept.forward_gathers == 0);                      // each uses what it kept
    // Blocks release their parameters after forward either way (reshard_after_forward), so
    // their backward gathers them again; the root keeps its own through forward.
    CHECK(resharded.backward_gathers == resharded.blocks);
    CHECK(kept.backward_gathers == kept.blocks);
    CHECK(resharded.reduce_scatters == resharded.groups);
    CHECK(kept.reduce_scatters == kept.groups);
    // The kept parameters are the same values: the accumulated gradients agree bit for bit.
    REQUIRE(kept.grads.size() == resharded.grads.size());
    for (size_t i = 0; i < kept.grads.size(); ++i) {
      testing::check_equal(kept.grads[i], resharded.grads[i], fmt::format("gradient {}", i));
    }
  });
}

TEST_CASE("a layer with an empty shard trains, and unshard/reshard move the allocator's bytes", "[nn][fully_shard]") {
  testing::run_ranks(3, [](int, int) {
    auto run = [](const DeviceMesh& mesh, bool shard) {
      manual_seed(7);
      Linear layer(4, 2);  // weight [2, 4] and bias [2]: rows 1, 1 and 0 over 3 ranks
      const DeviceMesh& data_mesh = shard ? mesh : single_rank_mesh();
      FSDPModule* fsdp = shard ? &fully_shard(layer, mesh) : nullptr;
      const DTensor x = distribute_tensor(testing::random_tensor({6, 4}, kFloat32, 3), data_mesh, {Shard(0)});
      const DTensor target = distribute_tensor(testing::random_tensor({6, 2}, kFloat32, 4), data_mesh, {Shard(0)});
      optim::AdamW opt({{.params = layer.parameters(), .lr = 1e-1}});
      std::vector<double> losses;
      for (int step = 0; step < 5; ++step) {
        opt.zero_grad();
        const DTensor loss = mse_loss(layer(x), target);
        loss.backward();
        opt.step();
        losses.push_back(loss.item());
      }
      if (fsdp != nullptr) {
        const int64_t before = memory_stats(kCPU).bytes_in_use;
        fsdp->unshard();
        CHECK(fsdp->gathered_bytes() == (2 * 4 + 2) * 4);
        CHECK(memory_stats(kCPU).bytes_in_use - before >= fsdp->gathered_bytes());
        fsdp->reshard();
        CHECK(fsdp->gathered_bytes() == 0);
        CHECK(memory_stats(kCPU).bytes_in_use == before);
      }
      return losses;
    };
    const DeviceMesh mesh = init_device_mesh(kCPU, {3}, {"dp"});
    const std::vector<double> one = run(mesh, false), many = run(mesh, true);
    for (size_t i = 0; i < one.size(); ++i) CHECK(many[i] == Approx(one[i]).epsilon(1e-5));
  });
}

TEST_CASE("an optimizer built before fully_shard steps the sharded leaves, as one built after", "[nn][fully_shard]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    const DTensor x = distribute_tensor(testing::random_tensor({4, 4}, kFloat32, 5), mesh, {Shard(0)});
    auto trained = [&](bool optimizer_first) {
      manual_seed(9);
      Linear layer(4, 3);
      std::unique_ptr<optim::AdamW> opt;
      if (optimizer_first)
        opt = std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{.params = layer.parameters(), .lr = 0.1}});
      fully_shard(layer, mesh);
      if (!optimizer_first)
        opt = std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{.params = layer.parameters(), .lr = 0.1}});
      for (int step = 0; step < 3; ++step) {
        opt->zero_grad();
        const DTensor y = layer(x);
        sum(mul(y, y)).backward();
        opt->step();
      }
      for (auto& [name, p] : layer.named_parameters()) CHECK(p->placements() == Placements{Shard(0)});
      return full_state_dict(layer);
    };
    const TensorMap before = trained(true), after = trained(false);
    for (const auto& [name, w] : after) testing::check_close(before.at(name), w, {0, 0}, name);
  });
}

TEST_CASE("cast_forward_inputs casts one tensor given as several inputs once: self-attention stays one product",
          "[nn][fully_shard]") {
  // fully_shard with bf16 parameters casts a float32 input; self-attention's query, key and
  // value, one tensor, become one bf16 tensor, which MultiheadAttention projects in one product
  // (in_proj and out_proj: 2 matmul_bias kernels), not three copies in three (4).
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    manual_seed(3);
    MultiheadAttention attn(8, 2, {.batch_first = true});
    fully_shard(attn, mesh, {.mp_policy = {.param_dtype = kBFloat16, .output_dtype = kFloat32}});
    const DTensor h = distribute_tensor(testing::random_tensor({4, 5, 8}, kFloat32, 9), mesh, {Shard(0)});
    trace::start(trace::bit(trace::Category::kKernel));
    const DTensor out = attn(h, h, h, {.is_causal = true, .need_weights = false}).first;
    int64_t products = 0;
    for (const trace::ThreadEvents& t : trace::stop()) {
      for (const trace::Event& e : t.events) products += e.name == std::string_view("matmul_bias");
    }
    CHECK(out.dtype() == kFloat32);
    CHECK(products == 2);
  });
}

TEST_CASE("fully_shard mistakes are typed errors", "[nn][fully_shard]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2}, {"dp"});
    {
      auto inner = std::make_shared<Linear>(4, 4);
      Sequential seq({inner});
      FSDPModule& root = fully_shard(seq, mesh);
      CHECK_THROWS_MATCHES(fully_shard(seq, mesh), ValueError, testing::MessageContains("already sharded"));
      CHECK_THROWS_MATCHES(set_prefetch_depth(root, {}, -1), ValueError,
                           testing::MessageContains("set_prefetch_depth: depth -1 for 0 blocks"));
      CHECK_THROWS_MATCHES(fully_shard(*inner, mesh), ValueError,
                           testing::MessageContains("weight' is DTensor(float32[4, 4] (S(0))"));
    }
    {
      // The tied embedding and output layer in two groups: an error at the first forward.
      Transformer model(testing::small_causal_lm(kVocab, kSeq));
      for (auto& [name, m] : model.named_modules()) {
        if (name == "output") fully_shard(*m, mesh);
      }
      fully_shard(model, mesh);
      const DTensor tokens = distribute_tensor(
          testing::random_tensor({kBatch, kSeq}, kFloat64, 1, 0, kVocab).to(kInt64), mesh, {Shard(0)});
      CHECK_THROWS_MATCHES(model(tokens), ValueError,
                           testing::MessageContains("is tied to one of 'output' (Linear), which was sharded apart"));
    }
    {
      Linear layer(4, 4);
      replicate(layer, mesh);
      CHECK_THROWS_MATCHES(fully_shard(layer, mesh), ValueError, testing::MessageContains("already replicated"));
      CHECK_THROWS_MATCHES(replicate(layer, mesh), ValueError,
                           testing::MessageContains("already replicated or sharded"));
    }
    {
      Linear layer(4, 4);
      CHECK_THROWS_MATCHES(fully_shard(layer, init_device_mesh(kCPU, {1, 1, 2})), ValueError,
                           testing::MessageContains("the mesh must be 1-D (FSDP) or 2-D"));
    }
    {
      Linear layer(4, 4);
      const FullyShardOptions options{
          .shard_placement_fn = [](const std::string&, const DTensor&) { return std::optional(Shard(2)); }};
      CHECK_THROWS_MATCHES(fully_shard(layer, mesh, options), ValueError,
                           testing::MessageContains("chose Shard(dim=2) for Linear parameter 'weight'"));
      CHECK_THROWS_MATCHES(fully_shard(layer, mesh, {.shard_mesh_dim = "tp"}), ValueError,
                           testing::MessageContains("shard_mesh_dim 'tp' names no mesh dim"));
    }
    {
      Linear layer(4, 4);
      fully_shard(layer, mesh);
      const DTensor x =
          distribute_tensor(testing::random_tensor({2, 4}, kFloat32, 5), single_rank_mesh(), {Replicate()});
      CHECK_THROWS_MATCHES(layer(x), ValueError, testing::MessageContains("on another mesh"));
    }
  });
}

}  // namespace
}  // namespace dtr::nn
