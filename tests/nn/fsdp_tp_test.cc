// FSDP x TP (2-D, as torchtitan): parallelize_module on mesh["tp"], then fully_shard on
// mesh["dp"] (HSDP x TP: on the (replicate, shard) sub-mesh), with the batch Shard(0) over
// the mesh's data-parallel dims, trains the seed Transformer and its GPT variant (dropout
// 0.1) as one rank does (losses, gradient norms, and the weights after AdamW within 1e-5),
// on 2x2 with and without sequence parallelism, on 3x2 (uneven FSDP chunks of the tp pieces)
// and on 2x2x2; each parameter rests as FSDP's chunk of its tensor-parallel piece on the
// tp-first view of the mesh, every step issuing FSDP's collectives over dp and tensor
// parallelism's over tp, none implicit; and what cannot be combined is a clear error.
#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "checkpoint/full_state_dict.h"
#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "collectives/process_group.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/view_ops.h"
#include "nn/comm_debug.h"
#include "nn/fully_shard.h"
#include "nn/init.h"
#include "nn/replicate.h"
#include "nn/tensor_parallel.h"
#include "nn/transformer.h"
#include "nn/transformer_plan.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using checkpoint::full_state_dict;

// An odd vocabulary: the vocab-sharded embedding's tp pieces (6 and 5 rows at tp 2) chunk
// unevenly over dp. 12 sequences: whole rows on every dp rank at dp 2, 3 and 4 (the targets'
// reshape keeps Shard(0) only then).
constexpr int64_t kVocab = 11, kSeq = 3, kRows = 12, kSteps = 3;

TransformerConfig tiny_transformer(bool gpt) { return testing::tiny_transformer(kVocab, kSeq, 2, gpt); }

struct Run {
  std::vector<double> losses;  // the global batch's mean loss
  std::vector<double> grad_norms;
  TensorMap weights;
};

// The layout a run uses: one rank (no mesh), or the mesh's dim names FSDP shards over
// ({"dp"}, or {"replicate", "shard"} for HSDP) beside "tp".
struct Layout {
  std::optional<DeviceMesh> mesh;
  std::vector<std::string> fsdp_dims;
  TransformerTpOptions tp;
  bool ddp = false;  // replicate over fsdp_dims (one) instead of fully_shard
};

Run train(const TransformerConfig& config, const Layout& layout, const Tensor& tokens, const Tensor& targets) {
  manual_seed(11);
  Transformer model(config);
  std::optional<CommDebugMode> strict;
  Placements batch = {Replicate()};
  if (layout.mesh) {
    parallelize_module(model, (*layout.mesh)["tp"], transformer_tp_plan(config, layout.tp));
    const DeviceMesh fsdp = layout.mesh->submesh(layout.fsdp_dims);
    FullyShardOptions options;
    if (layout.fsdp_dims.size() == 2) options.shard_mesh_dim = "shard";
    if (layout.ddp) {
      replicate(model, fsdp, {.bucket_cap_mb = 0.001});  // several buckets
    } else {
      for (size_t i = 0; i < model.layers().size(); ++i) {
        fully_shard(model.layers().at<TransformerBlock>(i), fsdp, options);
      }
      fully_shard(model, fsdp, options);
    }
    strict.emplace(model, ImplicitRedistributes::kRaise);
    // The batch split over the data-parallel dims, whole on tp.
    batch = Placements(layout.fsdp_dims.size(), Shard(0));
    batch.push_back(Replicate());
  }
  const DeviceMesh on = layout.mesh.value_or(single_rank_mesh());
  optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
  const DTensor x = distribute_tensor(tokens, on, batch), y = distribute_tensor(targets, on, batch);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    const DTensor loss = cross_entropy(reshape(model(x), {kRows * kSeq, kVocab}), reshape(y, {kRows * kSeq}));
    loss.backward();
    run.grad_norms.push_back(optim::clip_grad_norm_(model.parameters(), INFINITY));
    opt.step();
    run.losses.push_back(loss.item());
  }
  run.weights = full_state_dict(model);
  return run;
}

void check_matches(const Run& many, const Run& one) {
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step + 1);
    CHECK(many.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
    CHECK(many.grad_norms[step] == Approx(one.grad_norms[step]).epsilon(1e-5));
  }
  testing::check_weights_close(many.weights, one.weights, {1e-5, 1e-5});
}

Tensor random_ids(int64_t seed) { return testing::random_tensor({kRows, kSeq}, kFloat64, seed, 0, kVocab).to(kInt64); }

TEST_CASE("FSDP x TP on 2x2 trains the seed Transformer and its GPT variant as one rank", "[nn][fsdp_tp]") {
  testing::run_ranks(4, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 2}, {"dp", "tp"});
    const Tensor tokens = random_ids(5), targets = random_ids(6);
    for (bool gpt : {false, true}) {
      const TransformerConfig config = tiny_transformer(gpt);
      const Run one = train(config, {}, tokens, targets);
      for (const TransformerTpOptions options :
           {TransformerTpOptions{}, TransformerTpOptions{.sequence_parallel = true, .loss_parallel = true}}) {
        INFO((gpt ? "gpt" : "seed") << (options.sequence_parallel ? ", sp and loss parallel" : ""));
        check_matches(train(config, {mesh, {"dp"}, options}, tokens, targets), one);
      }
    }
  });
}

TEST_CASE("DDP x TP on 2x2 trains as one rank, with and without sequence parallelism", "[nn][fsdp_tp]") {
  testing::run_ranks(4, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 2}, {"dp", "tp"});
    const Tensor tokens = random_ids(5), targets = random_ids(6);
    const TransformerConfig config = tiny_transformer(true);
    const Run one = train(config, {}, tokens, targets);
    for (const TransformerTpOptions options :
         {TransformerTpOptions{}, TransformerTpOptions{.sequence_parallel = true, .loss_parallel = true}}) {
      INFO((options.sequence_parallel ? "sp and loss parallel" : "tp"));
      check_matches(train(config, {mesh, {"dp"}, options, /*ddp=*/true}, tokens, targets), one);
    }
  });
}

TEST_CASE("FSDP x TP on 3x2: uneven FSDP chunks of the tensor-parallel pieces train as one rank", "[nn][fsdp_tp]") {
  testing::run_ranks(6, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {3, 2}, {"dp", "tp"});
    const Tensor tokens = random_ids(7), targets = random_ids(8);
    const TransformerConfig config = tiny_transformer(false);
    check_matches(train(config, {mesh, {"dp"}, {}}, tokens, targets), train(config, {}, tokens, targets));
  });
}

TEST_CASE("HSDP x TP on 2x2x2 trains as one rank", "[nn][fsdp_tp]") {
  testing::run_ranks(8, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 2, 2}, {"replicate", "shard", "tp"});
    const Tensor tokens = random_ids(9), targets = random_ids(10);
    const TransformerConfig config = tiny_transformer(true);
    check_matches(train(config, {mesh, {"replicate", "shard"}, {.sequence_parallel = true}}, tokens, targets),
                  train(config, {}, tokens, targets));
  });
}

TEST_CASE("under FSDP x TP a parameter rests as FSDP's chunk of its tensor-parallel piece", "[nn][fsdp_tp]") {
  testing::run_ranks(4, [](int rank, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 2}, {"dp", "tp"});
    const TransformerConfig config = tiny_transformer(false);
    manual_seed(11);
    Transformer model(config);
    parallelize_module(model, mesh["tp"], transformer_tp_plan(config, {}));
    for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers().at<TransformerBlock>(i), mesh["dp"]);
    fully_shard(model, mesh["dp"]);
    const std::vector<std::string> tp_dp = {"tp", "dp"};
    const DeviceMesh tp_first = mesh.submesh(tp_dp);
    const int64_t dp = rank / 2, tp = rank % 2;
    auto param = [&](const std::string& name) {
      for (auto& [n, p] : model.named_parameters()) {
        if (n == name) return *p;
      }
      FAIL("no parameter " << name);
      return DTensor();
    };
    // in_proj_weight [24, 8]: tp's rows of q, k and v (4 of each block of 8), then dp's
    // half of those 12: block 0's 4 and block 1's first 2, or block 1's last 2 and block 2's 4.
    const DTensor in_proj = param("layers.0.attn.in_proj_weight");
    CHECK(in_proj.mesh() == tp_first);
    CHECK(in_proj.placements() == Placements{StridedShard(0, 3), Shard(0)});
    const DimRanges in_proj_rows =
        dp == 0 ? DimRanges{{4 * tp, 4}, {8 + 4 * tp, 2}} : DimRanges{{8 + 4 * tp + 2, 2}, {16 + 4 * tp, 4}};
    CHECK(in_proj.spec().local_ranges()[0] == in_proj_rows);
    CHECK(in_proj.to_local().size(0) == 6);
    // The embedding [11, 8], vocab-sharded by tp (rows 0:6 and 6:11), each piece over dp:
    // 3 + 3 rows, 3 + 2 rows.
    const DTensor embed = param("embed.weight");
    CHECK(embed.placements() == Placements{Shard(0), Shard(0)});
    const int64_t offsets[2][2] = {{0, 3}, {6, 9}}, lengths[2][2] = {{3, 3}, {3, 2}};
    CHECK(embed.spec().local_chunk().offset[0] == offsets[tp][dp]);
    CHECK(embed.to_local().size(0) == lengths[tp][dp]);
    // A LayerNorm weight: Replicate over tp, FSDP's chunk over dp.
    CHECK(param("layers.0.norm1.weight").placements() == Placements{Replicate(), Shard(0)});
  });
}

TEST_CASE("FSDP x TP mistakes are errors naming the parameter, the meshes and what is legal", "[nn][fsdp_tp]") {
  testing::run_ranks(4, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 2}, {"dp", "tp"});
    const TransformerConfig config = tiny_transformer(false);
    auto parallelized = [&] {
      manual_seed(11);
      auto model = std::make_unique<Transformer>(config);
      parallelize_module(*model, mesh["tp"], transformer_tp_plan(config, {}));
      return model;
    };
    // FSDP over the tp dim itself: the parameters are already sharded there.
    CHECK_THROWS_WITH(fully_shard(parallelized()->layers().at<TransformerBlock>(0), mesh["tp"]),
                      Catch::Contains("already sharded; fully_shard takes Replicate parameters, or tensor-parallel "
                                      "ones on another dim of the FSDP mesh's root"));
    // The batch on the tp mesh alone (PyTorch's local batch per dp rank): it belongs on (dp, tp).
    std::unique_ptr<Transformer> sharded = parallelized();
    fully_shard(*sharded, mesh["dp"]);
    const Tensor tokens = random_ids(5);
    CHECK_THROWS_WITH(
        (*sharded)(distribute_tensor(tokens, mesh["tp"], {Replicate()})),
        Catch::Contains("got input") && Catch::Contains("under FSDP x TP the batch is one DTensor on "
                                                        "that mesh, Shard(0) over its data-parallel dims"));
    // A rank count for reshard_after_forward (here 2 of dp 4) cuts its mesh from a 1-D FSDP mesh only.
    const DeviceMesh dp4 = init_device_mesh(kCPU, {4, 1}, {"dp", "tp"});
    Transformer model(config);
    parallelize_module(model, dp4["tp"], transformer_tp_plan(config, {}));
    CHECK_THROWS_WITH(fully_shard(model.layers().at<TransformerBlock>(0), dp4["dp"],
                                  {.reshard_after_forward = std::variant<bool, int>(2)}),
                      Catch::Contains("reshard_after_forward as a rank count takes parameters on the FSDP mesh") &&
                          Catch::Contains("take true or false"));
  });
}

}  // namespace
}  // namespace dtr::nn
