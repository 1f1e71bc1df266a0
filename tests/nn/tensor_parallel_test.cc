// Tensor parallelism: an MLP of two column-then-row blocks trained with parallelize_module on
// 2, 3 (uneven: 16 hidden features as 6, 5, 5) and 4 ranks matches one rank step by step
// (loss, weights after AdamW), with the placements the styles give and exactly the
// collectives the plan implies, none implicit (CommDebugMode's strict mode watches every
// parallel run); so do sequence parallelism, a tied vocab-sharded embedding and output, loss
// parallelism and the Prepare styles; and the plan's mistakes are clear errors.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <ostream>

#include "checkpoint/full_state_dict.h"
#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/reduce.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/block_reduce.h"
#include "kernels/fill.h"
#include "kernels/shape_ops.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/checkpoint.h"
#include "nn/comm_debug.h"
#include "nn/container.h"
#include "nn/embedding.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "nn/tensor_parallel.h"
#include "nn/transformer.h"
#include "nn/transformer_plan.h"
#include "optim/adam.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using checkpoint::full_state_dict;

constexpr int kSteps = 3;

// fc1 (col) -> ReLU -> fc2 (row) -> fc3 (col) -> ReLU -> fc4 (row, no bias).
std::shared_ptr<Sequential> make_mlp() {
  manual_seed(7);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(8, 16), std::make_shared<ReLU>(), std::make_shared<Linear>(16, 8),
      std::make_shared<Linear>(8, 12), std::make_shared<ReLU>(),
      std::make_shared<Linear>(12, 8, LinearOptions{.bias = false})});
}

ParallelPlan mlp_plan() {
  return {{"0", std::make_shared<ColwiseParallel>()},
          {"2", std::make_shared<RowwiseParallel>()},
          {"3", std::make_shared<ColwiseParallel>()},
          {"5", std::make_shared<RowwiseParallel>()}};
}

// The collectives one phase of a step issued, by kind.
struct Issued {
  int64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0, other = 0;
  friend bool operator==(const Issued&, const Issued&) = default;
  friend std::ostream& operator<<(std::ostream& os, const Issued& i) {
    return os << "{all_reduce " << i.all_reduce << ", all_gather " << i.all_gather << ", reduce_scatter "
              << i.reduce_scatter << ", other " << i.other << "}";
  }
};

// What collective_counter() saw since its last reset; resets it.
Issued take_issued() {
  CollectiveCounter& c = collective_counter();
  Issued i{c.calls(CollectiveKind::kAllReduce), c.calls(CollectiveKind::kAllGather),
           c.calls(CollectiveKind::kReduceScatter), 0};
  i.other = issued_collectives() - i.all_reduce - i.all_gather - i.reduce_scatter;
  c.reset();
  return i;
}

struct Run {
  std::vector<double> losses;
  TensorMap weights;
  std::vector<Issued> forward, backward, optimizer;  // per step
};

// kSteps steps of `opt` on `loss` (forward included), each phase's collectives counted, and
// the weights after them.
Run run_steps(Module& model, optim::Optimizer& opt, const std::function<DTensor()>& loss_of_step) {
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    collective_counter().reset();
    const DTensor loss = loss_of_step();
    run.forward.push_back(take_issued());
    loss.backward();
    run.backward.push_back(take_issued());
    opt.step();
    run.optimizer.push_back(take_issued());
    run.losses.push_back(loss.item());
  }
  run.weights = full_state_dict(model);
  return run;
}

// LayerNorm (SP) -> col -> ReLU -> row -> Dropout (SP) -> LayerNorm (SP) -> col, the
// activations between the row and the next col layer sharded along the sequence (dim 1).
std::shared_ptr<Sequential> make_sp_mlp() {
  manual_seed(9);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<LayerNorm>(Shape{8}), std::make_shared<Linear>(8, 16), std::make_shared<ReLU>(),
      std::make_shared<Linear>(16, 8), std::make_shared<Dropout>(0.25), std::make_shared<LayerNorm>(Shape{8}),
      std::make_shared<Linear>(8, 8)});
}

ParallelPlan sp_plan() {
  return {{"0", std::make_shared<SequenceParallel>()},
          {"1", std::make_shared<ColwiseParallel>(Layouts{Shard(1), Shard(-1)})},
          {"3", std::make_shared<RowwiseParallel>(Layouts{Shard(-1), Shard(1)})},
          {"4", std::make_shared<SequenceParallel>()},
          {"5", std::make_shared<SequenceParallel>()},
          {"6", std::make_shared<ColwiseParallel>(Layouts{Shard(1), Replicate()})}};
}

// kSteps AdamW steps on the loss sum(y^2) / numel of the model `make` builds; `mesh` is the
// tp mesh (the input laid out as `input_placement` there), or none for one rank.
Run train(const std::function<std::shared_ptr<Sequential>()>& make, const ParallelPlan& plan,
          const std::optional<DeviceMesh>& mesh, const Tensor& input, Placement input_placement = Replicate()) {
  std::shared_ptr<Sequential> mlp = make();
  std::optional<CommDebugMode> strict;  // every collective the plan declares, none implicit
  if (mesh) {
    parallelize_module(*mlp, *mesh, plan);
    strict.emplace(*mlp, ImplicitRedistributes::kRaise);
  }
  const DeviceMesh on = mesh.value_or(single_rank_mesh());
  optim::AdamW opt({{.params = mlp->parameters(), .lr = 1e-2, .weight_decay = 0.1}});
  const DTensor x = distribute_tensor(input, on, {mesh ? input_placement : Replicate()});
  return run_steps(*mlp, opt, [&] {
    const DTensor y = (*mlp)(x);
    return mean(mul(y, y));
  });
}

TEST_CASE("col-then-row tensor parallelism on 2, 3 and 4 ranks matches one rank", "[nn][tensor_parallel]") {
  for (int world : {2, 3, 4}) {
    testing::run_ranks(world, [](int, int world) {
      const Tensor input = testing::random_tensor({4, 3, 8}, kFloat32, 11);
      const Run one = train(make_mlp, mlp_plan(), std::nullopt, input);
      const Run many = train(make_mlp, mlp_plan(), init_device_mesh(kCPU, {world}, {"tp"}), input);
      INFO(world << " ranks");
      for (int step = 0; step < kSteps; ++step) {
        INFO("step " << step + 1);
        CHECK(many.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
        // Forward: each row layer's Partial product is all-reduced once. Backward: the second
        // col layer's input gradient (Partial over its output features) is all-reduced once;
        // the first layer's input needs no gradient. Nothing else, and nothing in AdamW.
        CHECK(many.forward[step] == Issued{.all_reduce = 2});
        CHECK(many.backward[step] == Issued{.all_reduce = 1});
        CHECK(many.optimizer[step] == Issued{});
      }
      for (const auto& [name, w] : one.weights) {
        INFO(name);
        testing::check_close(many.weights.at(name), w, {1e-5, 1e-5}, name);
      }
    });
  }
}

TEST_CASE("PrepareModuleInput and PrepareModuleOutput lay out a block's input and output", "[nn][tensor_parallel]") {
  testing::run_ranks(2, [](int, int) {
    const Tensor input = testing::random_tensor({2, 4, 8}, kFloat32, 14);
    const Run one = train(make_mlp, mlp_plan(), std::nullopt, input);
    ParallelPlan plan = mlp_plan();
    plan["5"] = std::make_shared<RowwiseParallel>(Layouts{Shard(-1), Shard(1)});
    plan.emplace("", std::make_shared<PrepareModuleInput>(PrepareLayouts{{Shard(1)}, {Replicate()}}));
    const Run many = train(make_mlp, plan, init_device_mesh(kCPU, {2}, {"tp"}), input, Shard(1));
    for (int step = 0; step < kSteps; ++step) {
      INFO("step " << step + 1);
      CHECK(many.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
      // The input gathered once; the last row layer reduce-scatters instead of all-reducing,
      // and backward gathers its output's gradient back.
      CHECK(many.forward[step] == Issued{.all_reduce = 1, .all_gather = 1, .reduce_scatter = 1});
      CHECK(many.backward[step] == Issued{.all_reduce = 1, .all_gather = 1});
    }
    // The block's Replicate output handed on sequence-sharded: a local slice forward, its
    // gradient gathered back in backward.
    ParallelPlan out_plan = mlp_plan();
    out_plan.emplace("", std::make_shared<PrepareModuleOutput>(PrepareLayouts{{Replicate()}, {Shard(1)}}));
    const Run sliced = train(make_mlp, out_plan, init_device_mesh(kCPU, {2}, {"tp"}), input);
    for (int step = 0; step < kSteps; ++step) {
      INFO("step " << step + 1 << ", PrepareModuleOutput");
      CHECK(sliced.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
      CHECK(sliced.forward[step] == Issued{.all_reduce = 2});
      CHECK(sliced.backward[step] == Issued{.all_reduce = 1, .all_gather = 1});
    }
  });
}

TEST_CASE("sequence parallelism around a col/row block on 2, 3 and 4 ranks matches one rank", "[nn][tensor_parallel]") {
  for (int world : {2, 3, 4}) {
    testing::run_ranks(world, [](int, int world) {
      const Tensor input = testing::random_tensor({2, 6, 8}, kFloat32, 12);  // 6 positions: 2, 2, 1, 1 on 4 ranks
      const Run one = train(make_sp_mlp, sp_plan(), std::nullopt, input);
      const Run many = train(make_sp_mlp, sp_plan(), init_device_mesh(kCPU, {world}, {"tp"}), input, Shard(1));
      INFO(world << " ranks");
      for (int step = 0; step < kSteps; ++step) {
        INFO("step " << step + 1);
        CHECK(many.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
        // Forward: the first col layer gathers the sequence, the row layer reduce-scatters its
        // Partial product back to it, the last col layer gathers its input and its output.
        // Backward: the reverse of each (an all-gather for the reduce-scatter, a
        // reduce-scatter for each input gather; the output's gather needs none), and the two
        // norms' weight and bias gradients (Partial: each rank sums its positions) all-reduced.
        CHECK(many.forward[step] == Issued{.all_gather = 3, .reduce_scatter = 1});
        CHECK(many.backward[step] == Issued{.all_reduce = 1, .all_gather = 1, .reduce_scatter = 2});
        CHECK(many.optimizer[step] == Issued{});
      }
      for (const auto& [name, w] : one.weights) {
        INFO(name);
        testing::check_close(many.weights.at(name), w, {1e-5, 1e-5}, name);
      }
    });
  }
}

// Each parameter's gradient after two backwards on two micro-batches (accumulated), whole.
std::map<std::string, Tensor> accumulated_grads(const std::optional<DeviceMesh>& mesh, const Tensor& input) {
  std::shared_ptr<Sequential> mlp = make_sp_mlp();
  mlp->eval();  // no dropout: the two runs draw their masks at different points
  if (mesh) parallelize_module(*mlp, *mesh, sp_plan());
  const DeviceMesh on = mesh.value_or(single_rank_mesh());
  for (int64_t micro = 0; micro < 2; ++micro) {
    const DTensor x = distribute_tensor(input.narrow(0, micro, 1).contiguous(), on, {mesh ? Shard(1) : Replicate()});
    const DTensor y = (*mlp)(x);
    mean(mul(y, y)).backward();
  }
  std::map<std::string, Tensor> grads;
  for (const auto& [name, p] : mlp->named_parameters()) {
    REQUIRE(p->grad().placements() == p->placements());  // reduced by the end of each backward
    grads.emplace(name, p->grad().full_tensor());
  }
  return grads;
}

TEST_CASE("sequence-parallel gradients accumulate over micro-batches as on one rank", "[nn][tensor_parallel]") {
  testing::run_ranks(2, [](int, int) {
    const Tensor input = testing::random_tensor({2, 5, 8}, kFloat32, 13);
    const std::map<std::string, Tensor> one = accumulated_grads(std::nullopt, input);
    const std::map<std::string, Tensor> many = accumulated_grads(init_device_mesh(kCPU, {2}, {"tp"}), input);
    for (const auto& [name, g] : one) testing::check_close(many.at(name), g, {1e-5, 1e-5}, name);
  });
}

constexpr int64_t kVocab = 10, kSeq = 3;

// Two sequences of kSeq token ids below kVocab, drawn from `seed`.
Tensor random_ids(uint64_t seed) { return testing::random_tensor({2, kSeq}, kFloat64, seed, 0, kVocab).to(kInt64); }

// A tiny language model: a vocab-sharded embedding (rowwise), one col/row block, and an
// output projection tied to the embedding (colwise: the same rows of the vocabulary).
std::shared_ptr<Sequential> make_lm() {
  manual_seed(5);
  auto embed = std::make_shared<Embedding>(kVocab, 8);
  auto output = std::make_shared<Linear>(8, kVocab, LinearOptions{.bias = false});
  output->weight() = embed->weight();
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      embed, std::make_shared<Linear>(8, 16), std::make_shared<ReLU>(), std::make_shared<Linear>(16, 8), output});
}

enum class LossParallel : uint8_t { kNo, kYes };

// With LossParallel::kYes the logits stay sharded over the vocabulary into cross_entropy.
ParallelPlan lm_plan(LossParallel loss_parallel) {
  const Placement logits = loss_parallel == LossParallel::kYes ? Shard(-1) : Replicate();
  return {{"0", std::make_shared<RowwiseParallel>(Layouts{Replicate(), Replicate()})},
          {"1", std::make_shared<ColwiseParallel>()},
          {"3", std::make_shared<RowwiseParallel>()},
          {"4", std::make_shared<ColwiseParallel>(Layouts{Replicate(), logits})}};
}

Run train_lm(const std::optional<DeviceMesh>& mesh, const Tensor& tokens, const Tensor& targets,
             LossParallel loss_parallel = LossParallel::kNo) {
  std::shared_ptr<Sequential> lm = make_lm();
  std::optional<CommDebugMode> strict;
  if (mesh) {
    parallelize_module(*lm, *mesh, lm_plan(loss_parallel));
    strict.emplace(*lm, ImplicitRedistributes::kRaise);
  }
  const DeviceMesh on = mesh.value_or(single_rank_mesh());
  REQUIRE(lm->child("4").parameter("weight").is_same(lm->child("0").parameter("weight")));
  optim::AdamW opt({{.params = lm->parameters(), .lr = 1e-2, .weight_decay = 0.1}});
  const DTensor x = distribute_tensor(tokens, on, {Replicate()});
  const DTensor y = distribute_tensor(targets, on, {Replicate()});
  return run_steps(*lm, opt, [&] {
    return cross_entropy(reshape((*lm)(x), {2 * kSeq, kVocab}), reshape(y, {2 * kSeq}));
  });
}

TEST_CASE("a vocab-sharded embedding tied to a column-parallel output trains as one rank, loss parallel too",
          "[nn][tensor_parallel]") {
  for (int world : {2, 3}) {
    testing::run_ranks(world, [](int, int world) {
      const Tensor tokens = random_ids(3);
      const Tensor targets = random_ids(4);
      const Run one = train_lm(std::nullopt, tokens, targets);
      const DeviceMesh mesh = init_device_mesh(kCPU, {world}, {"tp"});
      const Run many = train_lm(mesh, tokens, targets);
      const Run sharded_loss = train_lm(mesh, tokens, targets, LossParallel::kYes);
      INFO(world << " ranks");
      for (int step = 0; step < kSteps; ++step) {
        INFO("step " << step + 1);
        CHECK(many.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
        CHECK(sharded_loss.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
        // Loss parallel: the logits are never gathered; cross_entropy's row max, sum of
        // exponentials and target logit are three all-reduces of [B * T] instead.
        CHECK(sharded_loss.forward[step] == Issued{.all_reduce = 5});
        CHECK(sharded_loss.backward[step] == Issued{.all_reduce = 2});
        CHECK(sharded_loss.optimizer[step] == Issued{});
        // Forward: the embedding's Partial rows and the row layer's product are all-reduced,
        // the logits all-gathered. Backward: the two col layers' input gradients are
        // all-reduced; the tied weight's two gradients add up locally (both Shard(0)).
        CHECK(many.forward[step] == Issued{.all_reduce = 2, .all_gather = 1});
        CHECK(many.backward[step] == Issued{.all_reduce = 2});
        CHECK(many.optimizer[step] == Issued{});
      }
      for (const auto& [name, w] : one.weights) {
        INFO(name);
        testing::check_close(many.weights.at(name), w, {1e-5, 1e-5}, name);
        testing::check_close(sharded_loss.weights.at(name), w, {1e-5, 1e-5}, name + ", loss parallel");
      }
    });
  }
}

// The seed Transformer (and its GPT variant: causal, position embedding, final norm, tied
// output, dropout) under transformer_tp_plan, against one rank.
TransformerConfig tiny_transformer(bool gpt) { return testing::tiny_transformer(kVocab, kSeq, 4, gpt); }

enum class Checkpointed : uint8_t { kNo, kFull, kSelective };

Run train_transformer(const TransformerConfig& config, const std::optional<DeviceMesh>& mesh,
                      TransformerTpOptions options, const Tensor& tokens, const Tensor& targets,
                      Checkpointed checkpointed = Checkpointed::kNo) {
  manual_seed(11);
  Transformer model(config);
  if (checkpointed != Checkpointed::kNo) {  // before the styles, as torchtitan applies it
    const CheckpointOptions policy =
        checkpointed == Checkpointed::kSelective ? selective_policy() : CheckpointOptions{};
    for (size_t i = 0; i < model.layers().size(); ++i) checkpoint(model.layers().at<TransformerBlock>(i), policy);
  }
  std::optional<CommDebugMode> strict;
  if (mesh) {
    parallelize_module(model, *mesh, transformer_tp_plan(config, options));
    strict.emplace(model, ImplicitRedistributes::kRaise);
  }
  const DeviceMesh on = mesh.value_or(single_rank_mesh());
  optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
  const DTensor x = distribute_tensor(tokens, on, {Replicate()});
  const DTensor y = distribute_tensor(targets, on, {Replicate()});
  return run_steps(model, opt, [&] {
    return cross_entropy(reshape(model(x), {2 * kSeq, kVocab}), reshape(y, {2 * kSeq}));
  });
}

// The collectives of one step of transformer_tp_plan on `config`, from the plan: per block
// the attention's and the FFN's col layers take their input (all-gather under sequence
// parallelism; in backward their input gradient is reduced: all-reduce, or reduce-scatter)
// and the row layers hand their output on (all-reduce, or reduce-scatter; in backward an
// all-gather); the embedding is a row layer, the output a col layer whose logits are
// all-gathered unless loss parallel keeps them sharded (cross_entropy's 3 all-reduces).
// Under sequence parallelism the norms' gradients are reduced in one coalesced all-reduce and
// the Replicate position embedding, added to Shard(1) activations, gathers its gradient.
struct StepIssued {
  Issued forward, backward;
};
StepIssued expected_issued(const TransformerConfig& config, TransformerTpOptions options) {
  const int64_t blocks = 2 * config.n_layers;  // attention and FFN
  if (!options.sequence_parallel) {
    return {{.all_reduce = 1 + blocks, .all_gather = options.loss_parallel ? 0 : 1}, {.all_reduce = blocks + 1}};
  }
  return {{.all_reduce = options.loss_parallel ? 3 : 0,
           .all_gather = blocks + 1 + (options.loss_parallel ? 0 : 1),
           .reduce_scatter = 1 + blocks},
          {.all_reduce = 1, .all_gather = 1 + blocks + (config.max_seq_len > 0 ? 1 : 0), .reduce_scatter = blocks + 1}};
}

TEST_CASE("the seed Transformer and its GPT variant under tensor parallelism match one rank", "[nn][tensor_parallel]") {
  for (int world : {2, 4}) {
    testing::run_ranks(world, [](int, int world) {
      const Tensor tokens = random_ids(5);
      const Tensor targets = random_ids(6);
      const DeviceMesh mesh = init_device_mesh(kCPU, {world}, {"tp"});
      for (bool gpt : {false, true}) {
        const TransformerConfig config = tiny_transformer(gpt);
        const Run one = train_transformer(config, std::nullopt, {}, tokens, targets);
        for (const TransformerTpOptions options :
             {TransformerTpOptions{}, TransformerTpOptions{.sequence_parallel = true},
              TransformerTpOptions{.sequence_parallel = true, .loss_parallel = true}}) {
          if (world == 4 && options.sequence_parallel != options.loss_parallel) continue;  // CI's time
          const Run many = train_transformer(config, mesh, options, tokens, targets);
          INFO(world << " ranks, " << (gpt ? "gpt" : "seed") << (options.sequence_parallel ? ", sp" : "")
                     << (options.loss_parallel ? ", loss parallel" : ""));
          for (int step = 0; step < kSteps; ++step) {
            INFO("step " << step + 1);
            CHECK(many.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
            const StepIssued expected = expected_issued(config, options);
            CHECK(many.forward[step] == expected.forward);
            CHECK(many.backward[step] == expected.backward);
            CHECK(many.optimizer[step] == Issued{});
          }
          testing::check_weights_close(many.weights, one.weights, {1e-5, 1e-5});
        }
      }
    });
  }
}

// The loss and every parameter's gradient (whole, as float64) of one forward and backward of
// `config` on tokens [2, kSeq], on one rank or under transformer_tp_plan with the vocabulary
// kept whole (train --deterministic's plan).
std::map<std::string, Tensor> loss_and_grads(const TransformerConfig& config, const std::optional<DeviceMesh>& mesh,
                                             const Tensor& tokens, const Tensor& targets) {
  manual_seed(11);
  Transformer model(config);
  if (mesh) parallelize_module(model, *mesh, transformer_tp_plan(config, {.split_vocab = false}));
  const DeviceMesh on = mesh.value_or(single_rank_mesh());
  const DTensor loss =
      model(distribute_tensor(tokens, on, {Replicate()}), distribute_tensor(targets, on, {Replicate()}));
  loss.backward();
  std::map<std::string, Tensor> out{{"loss", loss.full_tensor()}};
  for (const auto& [name, p] : model.named_parameters()) out[name] = p->grad().full_tensor();
  return out;
}

// --deterministic's settings (kernels/block_reduce.h) for a scope, off again after it.
class DeterministicScope {
 public:
  DeterministicScope(int64_t block_tokens, int64_t feature_blocks) {
    set_deterministic_block_tokens(block_tokens);
    set_deterministic_feature_blocks(feature_blocks);
  }
  ~DeterministicScope() {
    set_deterministic_block_tokens(0);
    set_deterministic_feature_blocks(1);
  }
  DeterministicScope(const DeterministicScope&) = delete;
  DeterministicScope& operator=(const DeterministicScope&) = delete;
};

TEST_CASE("tensor parallelism under --deterministic with feature blocks gives one rank's bits",
          "[nn][tensor_parallel]") {
  // Every product over features sums 4 fixed blocks of its contraction in the canonical
  // tree (kernels/block_reduce.h): a row-parallel layer's rank holds 2 (tp 2) or 1 (tp 4) of
  // them and the all-reduce adds the ranks' nodes in the same tree, as does each of an
  // input's three Partial gradients from q, k and v (reduced apart, then added). Without
  // the blocks the ranks' sums round differently.
  for (int world : {2, 4}) {
    testing::run_ranks(world, [](int, int world) {
      const Tensor tokens = random_ids(5);
      const Tensor targets = random_ids(6);
      const DeviceMesh mesh = init_device_mesh(kCPU, {world}, {"tp"});
      for (bool gpt : {false, true}) {
        TransformerConfig config = tiny_transformer(gpt);
        config.dim = 16;
        INFO(world << " ranks, " << (gpt ? "gpt" : "seed"));
        std::map<std::string, Tensor> one, many, plain_one, plain_many;
        {
          const DeterministicScope blocked(kSeq, 4);
          one = loss_and_grads(config, std::nullopt, tokens, targets);
          many = loss_and_grads(config, mesh, tokens, targets);
        }
        {
          const DeterministicScope unblocked(kSeq, 1);
          plain_one = loss_and_grads(config, std::nullopt, tokens, targets);
          plain_many = loss_and_grads(config, mesh, tokens, targets);
        }
        REQUIRE(many.size() == one.size());
        bool plain_differs = false;
        for (const auto& [name, value] : one) {
          testing::check_equal(many.at(name), value, name);
          plain_differs = plain_differs || testing::to_f64(plain_many.at(name)) != testing::to_f64(plain_one.at(name));
        }
        CHECK(plain_differs);
      }
    });
  }
}

TEST_CASE(
    "full and selective checkpointing under tensor parallelism train bit for bit as without; selective's recompute "
    "communicates nothing",
    "[nn][tensor_parallel][checkpoint]") {
  testing::run_ranks(2, [](int, int world) {
    const Tensor tokens = random_ids(5);
    const Tensor targets = random_ids(6);
    const DeviceMesh mesh = init_device_mesh(kCPU, {world}, {"tp"});
    const TransformerConfig config = tiny_transformer(/*gpt=*/true);  // dropout 0.1: the recompute replays it
    for (const TransformerTpOptions options :
         {TransformerTpOptions{}, TransformerTpOptions{.sequence_parallel = true, .loss_parallel = true}}) {
      INFO((options.sequence_parallel ? "tp + sp + loss parallel" : "tp"));
      const Run plain = train_transformer(config, mesh, options, tokens, targets);
      const Run recomputed = train_transformer(config, mesh, options, tokens, targets, Checkpointed::kFull);
      // Selective keeps the collectives' results: its recompute issues none.
      const Run selective = train_transformer(config, mesh, options, tokens, targets, Checkpointed::kSelective);
      // Full: each block's forward runs again in backward, its collectives with it: 2 per block.
      const int64_t blocks = 2 * config.n_layers;
      Issued again = plain.backward.front();
      if (options.sequence_parallel) {
        again.all_gather += blocks;
        again.reduce_scatter += blocks;
      } else {
        again.all_reduce += blocks;
      }
      for (int step = 0; step < kSteps; ++step) {
        INFO("step " << step + 1);
        CHECK(recomputed.losses[step] == plain.losses[step]);
        CHECK(recomputed.forward[step] == plain.forward[step]);
        CHECK(recomputed.backward[step] == again);
        CHECK(selective.losses[step] == plain.losses[step]);
        CHECK(selective.forward[step] == plain.forward[step]);
        CHECK(selective.backward[step] == plain.backward[step]);
      }
      for (const auto& [name, w] : plain.weights) {
        testing::check_equal(recomputed.weights.at(name), w, name);
        testing::check_equal(selective.weights.at(name), w, name + ", selective");
      }
    }
  });
}

TEST_CASE("the styles place Linear weights and biases as Megatron does", "[nn][tensor_parallel]") {
  const DeviceMesh mesh = DeviceMesh::row_major(kCPU, {2}, {"tp"}, 1, 2);  // rank 1's view
  std::shared_ptr<Sequential> mlp = make_mlp();
  const Tensor fc1 = mlp->child("0").parameter("weight").to_local().clone();
  parallelize_module(*mlp, mesh, mlp_plan());
  const auto placement = [&](const std::string& module, const std::string& param) {
    const DTensor& p = mlp->child(module).parameter(param);
    CHECK(p.mesh() == mesh);
    CHECK(p.is_leaf());
    CHECK(p.requires_grad());
    return p.placements().at(0);
  };
  CHECK(placement("0", "weight") == Shard(0));
  CHECK(placement("0", "bias") == Shard(0));
  CHECK(placement("2", "weight") == Shard(1));
  CHECK(placement("2", "bias") == Replicate());
  CHECK(placement("5", "weight") == Shard(1));
  // Rank 1 holds output features 8..15 of fc1, taken from the model as built.
  testing::check_equal(mlp->child("0").parameter("weight").to_local(), fc1.narrow(0, 8, 8), "rank 1's rows");
}

TEST_CASE("plan mistakes are errors naming the module and what is legal", "[nn][tensor_parallel]") {
  const DeviceMesh mesh = DeviceMesh::row_major(kCPU, {2}, {"tp"}, 0, 2);
  SECTION("sequence or loss parallelism with the vocabulary kept whole") {
    const TransformerConfig config = tiny_transformer(false);
    CHECK_THROWS_WITH(transformer_tp_plan(config, {.sequence_parallel = true, .split_vocab = false}),
                      "transformer_tp_plan: sequence_parallel=true and loss_parallel=false with split_vocab=false; "
                      "sequence and loss parallelism start and end at the vocabulary's split layers; legal: "
                      "split_vocab=true, or neither");
  }
  SECTION("a pattern that names no module") {
    std::shared_ptr<Sequential> mlp = make_mlp();
    CHECK_THROWS_WITH(parallelize_module(*mlp, mesh, {{"7", std::make_shared<ColwiseParallel>()}}),
                      "parallelize_module: plan entry '7' names no module of Sequential; its modules: \"\", '0', '1', "
                      "'2', '3', '4', '5'");
  }
  SECTION("a module two patterns name") {
    std::shared_ptr<Sequential> mlp = make_mlp();
    CHECK_THROWS_WITH(
        parallelize_module(*mlp, mesh,
                           {{"0", std::make_shared<ColwiseParallel>()}, {"*", std::make_shared<RowwiseParallel>()}}),
        Catch::Contains("module '0' is named by plan entries"));
  }
  SECTION("a module the styles do not know") {
    std::shared_ptr<Sequential> mlp = make_mlp();
    CHECK_THROWS_AS(parallelize_module(*mlp, mesh, {{"1", std::make_shared<ColwiseParallel>()}}), NotImplementedError);
    CHECK_THROWS_WITH(
        parallelize_module(*mlp, mesh, {{"1", std::make_shared<ColwiseParallel>()}}),
        "ColwiseParallel: module '1' is a ReLU; the styles parallelise Linear and Embedding, and ColwiseParallel a "
        "MultiheadAttention's input projection (its out_proj takes RowwiseParallel)");
  }
  SECTION("attention heads that do not split over the tp ranks") {
    MultiheadAttention attn(6, 3);
    CHECK_THROWS_MATCHES(parallelize_module(attn, mesh, std::make_shared<ColwiseParallel>()), ValueError,
                         testing::MessageContains("ColwiseParallel '': 3 heads do not split over the 2 ranks") &&
                             testing::MessageContains("multiple of the tp size"));
  }
  SECTION("attention's packed q, k, v rows: each rank its heads' rows of all three") {
    MultiheadAttention attn(4, 2);
    const Tensor full = attn.parameter("in_proj_weight").to_local().clone();
    parallelize_module(attn, mesh, std::make_shared<ColwiseParallel>());
    const DTensor& w = attn.parameter("in_proj_weight");
    CHECK(w.placements() == Placements{StridedShard(0, 3)});
    // Rank 0 of 2: rows 0:2 (q), 4:6 (k), 8:10 (v).
    const Tensor expected = cat({full.narrow(0, 0, 2), full.narrow(0, 4, 2), full.narrow(0, 8, 2)}, 0);
    testing::check_equal(w.to_local(), expected, "in_proj_weight");
  }
  SECTION("a tied weight two styles place differently") {
    std::shared_ptr<Sequential> lm = make_lm();
    CHECK_THROWS_WITH(
        parallelize_module(*lm, mesh,
                           {{"0", std::make_shared<ColwiseParallel>()}, {"4", std::make_shared<ColwiseParallel>()}}),
        "parallelize_module: '4.weight' is tied to a parameter another style places as Shard(dim=1); ColwiseParallel "
        "wants Shard(dim=0) (a tied weight needs one placement)");
  }
  SECTION("prepared layouts that do not fit the inputs") {
    std::shared_ptr<Sequential> mlp = make_mlp();
    parallelize_module(*mlp, mesh, {{"", std::make_shared<PrepareModuleInput>(PrepareLayouts{{Shard(1)}, {}})}});
    const DTensor x(zeros({3, 8}, kFloat32), DTensorSpec(mesh, {Replicate()}, {3, 8}, kFloat32));
    CHECK_THROWS_WITH((*mlp)(x),
                      "PrepareModuleInput '': it has 1 inputs but the layouts give 1 to arrive as and 0 "
                      "desired; give one (or nullopt) for each");
  }
  SECTION("a 2-D mesh") {
    std::shared_ptr<Sequential> mlp = make_mlp();
    const DeviceMesh two_d = DeviceMesh::row_major(kCPU, {2, 2}, {"dp", "tp"}, 0, 4);
    CHECK_THROWS_WITH(parallelize_module(*mlp, two_d, mlp_plan()),
                      Catch::Contains("has 2 dims; give a 1-D mesh, or mesh[\"tp\"] of a larger one"));
  }
  SECTION("a model already parallelised") {
    std::shared_ptr<Sequential> mlp = make_mlp();
    parallelize_module(*mlp, mesh, mlp_plan());
    CHECK_THROWS_WITH(parallelize_module(*mlp, mesh, mlp_plan()),
                      Catch::Contains("parameter '0.weight' is DTensor(") && Catch::Contains("already sharded"));
  }
  SECTION("an input that does not arrive as the plan says") {
    Linear row(4, 2);
    parallelize_module(row, mesh, std::make_shared<RowwiseParallel>());
    const DTensor x(zeros({3, 4}, kFloat32), DTensorSpec(mesh, {Replicate()}, {3, 4}, kFloat32));
    CHECK_THROWS_WITH(row(x), Catch::StartsWith("RowwiseParallel '': its input arrives as Replicate() but the plan "
                                                "says input layout Shard(dim=-1)"));
  }
}

}  // namespace
}  // namespace dtr::nn
