// Activation checkpointing: the causal model with dropout 0.1 trained with every block
// checkpointed, fully or selectively, gives the same bits as without (losses, weights after
// three AdamW steps) on one rank and under fsdp and ddp on 2 and 3 ranks, with exactly the
// same collectives; checkpointing keeps fewer bytes for backward (the allocator's peak
// falls: full below selective below none, by bounds from the model's shapes).
#include "nn/checkpoint.h"

#include <catch2/catch.hpp>

#include "checkpoint/full_state_dict.h"
#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "core/allocator.h"
#include "dtensor/kept_outputs.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/reduce.h"
#include "dtensor/ops/view_ops.h"
#include "nn/container.h"
#include "nn/fully_shard.h"
#include "nn/init.h"
#include "nn/replicate.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using checkpoint::full_state_dict;

constexpr int64_t kBatch = 4, kSeq = 8, kVocab = 32;
constexpr int kSteps = 3;

enum class Sharding : uint8_t { kNone, kFsdp, kDdp };
enum class Checkpointed : uint8_t { kNo, kYes, kFirstBlock, kSelective };

// Checkpoints every TransformerBlock of `model`: fully, or selectively with the default policy.
void checkpoint_blocks(Module& model, Checkpointed how) {
  for (auto& [name, m] : model.named_modules()) {
    if (m->type_name() == "TransformerBlock") {
      checkpoint(*m, how == Checkpointed::kSelective ? selective_policy() : CheckpointOptions{});
    }
  }
}

struct Run {
  std::vector<double> losses;
  TensorMap weights;
  std::vector<int64_t> collectives;  // per step
};

Run train(const DeviceMesh& mesh, Sharding sharding, Checkpointed checkpointed) {
  manual_seed(17);
  TransformerConfig config = testing::small_causal_lm(kVocab, kSeq);
  config.dropout = 0.1;
  Transformer model(config, {.mesh = sharding == Sharding::kFsdp ? single_rank_mesh() : mesh});
  if (checkpointed == Checkpointed::kYes || checkpointed == Checkpointed::kSelective) {
    checkpoint_blocks(model, checkpointed);
  }
  if (checkpointed == Checkpointed::kFirstBlock) checkpoint(model.layers().child("0"));
  if (sharding == Sharding::kFsdp) {
    for (auto& [name, m] : model.named_modules()) {
      if (m->type_name() == "TransformerBlock") fully_shard(*m, mesh);
    }
    fully_shard(model, mesh);
  }
  if (sharding == Sharding::kDdp) replicate(model, mesh);
  optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
  const Tensor tokens = testing::random_tensor({kBatch, kSeq}, kFloat64, 1, 0, kVocab).to(kInt64);
  const Tensor targets = testing::random_tensor({kBatch, kSeq}, kFloat64, 2, 0, kVocab).to(kInt64);
  const Placements batch{sharding == Sharding::kNone ? Replicate() : Shard(0)};
  const DTensor x = distribute_tensor(tokens, mesh, batch), y = distribute_tensor(targets, mesh, batch);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    collective_counter().reset();
    const DTensor loss = cross_entropy(reshape(model(x), {kBatch * kSeq, kVocab}), reshape(y, {kBatch * kSeq}));
    loss.backward();
    opt.step();
    run.collectives.push_back(issued_collectives());
    run.losses.push_back(loss.item());
  }
  run.weights = full_state_dict(model);
  return run;
}

void check_same_bits(const Run& checkpointed, const Run& plain) {
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step + 1);
    CHECK(checkpointed.losses[step] == plain.losses[step]);
    CHECK(checkpointed.collectives[step] == plain.collectives[step]);
  }
  for (const auto& [name, w] : plain.weights) testing::check_equal(checkpointed.weights.at(name), w, name);
}

TEST_CASE("checkpointed blocks train bit for bit as plain ones on one rank", "[nn][checkpoint]") {
  const Run plain = train(single_rank_mesh(), Sharding::kNone, Checkpointed::kNo);
  check_same_bits(train(single_rank_mesh(), Sharding::kNone, Checkpointed::kYes), plain);
  check_same_bits(train(single_rank_mesh(), Sharding::kNone, Checkpointed::kSelective), plain);
}

// The CPU allocator's peak over one forward and backward of a 3-block model whose
// activations outweigh its parameters (1024 tokens of width 16).
int64_t peak_of_step(Checkpointed checkpointed, int64_t batch, int64_t seq, const TransformerConfig& config) {
  manual_seed(5);
  Transformer model(config);
  if (checkpointed != Checkpointed::kNo) checkpoint_blocks(model, checkpointed);
  const Tensor tokens = testing::random_tensor({batch, seq}, kFloat64, 1, 0, kVocab).to(kInt64);
  const DTensor x = distribute_tensor(tokens, single_rank_mesh(), {Replicate()});
  const DTensor y = distribute_tensor(tokens, single_rank_mesh(), {Replicate()});
  reset_peak_memory_stats(kCPU);
  const int64_t before = memory_stats(kCPU).bytes_in_use;
  cross_entropy(reshape(model(x), {batch * seq, kVocab}), reshape(y, {batch * seq})).backward();
  return memory_stats(kCPU).peak_bytes - before;
}

TEST_CASE("checkpointing drops what the blocks keep for backward", "[nn][checkpoint]") {
  constexpr int64_t batch = 16, seq = 64;
  TransformerConfig config = testing::small_causal_lm(kVocab, seq);
  config.n_layers = 3;
  const int64_t plain = peak_of_step(Checkpointed::kNo, batch, seq, config);
  const int64_t checkpointed = peak_of_step(Checkpointed::kYes, batch, seq, config);
  const int64_t selective = peak_of_step(Checkpointed::kSelective, batch, seq, config);
  // Without checkpointing every block keeps, among others, its feed-forward hidden
  // activation ([tokens, 4 dim] float32: ReLU's output, which the second layer reads too)
  // and its attention probabilities ([batch, heads, seq, seq]) until its backward; with full
  // checkpointing only the block being recomputed does: at least two blocks' worth of the
  // hidden activation fewer at the peak. Selective keeps every second product of each block
  // (the attention's input projection and the feed-forward's first layer, a hidden
  // activation) but neither ReLU's output nor the probabilities: between the two, by at
  // least those.
  const int64_t hidden = batch * seq * 4 * config.dim * 4;
  const int64_t probabilities = batch * config.n_heads * seq * seq * 4;
  INFO("peak " << plain << " B plain, " << selective << " B selective, " << checkpointed << " B full");
  CHECK(plain - checkpointed >= (config.n_layers - 1) * hidden);
  CHECK(plain - selective >= (config.n_layers - 1) * (hidden + probabilities));
  CHECK(selective - checkpointed >= (config.n_layers - 1) * hidden);
}

TEST_CASE("checkpointed blocks under fsdp and ddp on 2 and 3 ranks: the same bits, the same collectives",
          "[nn][checkpoint]") {
  for (int world : {2, 3}) {
    testing::run_ranks(world, [](int, int world) {
      const DeviceMesh mesh = init_device_mesh(kCPU, {world});
      for (Sharding sharding : {Sharding::kFsdp, Sharding::kDdp}) {
        INFO(world << " ranks, " << (sharding == Sharding::kFsdp ? "fsdp" : "ddp"));
        const Run plain = train(mesh, sharding, Checkpointed::kNo);
        check_same_bits(train(mesh, sharding, Checkpointed::kYes), plain);
        check_same_bits(train(mesh, sharding, Checkpointed::kFirstBlock), plain);
        check_same_bits(train(mesh, sharding, Checkpointed::kSelective), plain);
      }
    });
  }
}

// Two micro-batches per step, the first without gradient sync, each through two blocks one
// checkpointed block applied twice (a module called twice in one forward); on rank 1 the
// second block's output is left out of the loss (its recompute never runs there, and its
// parameters get zero gradients, reduced with rank 0's).
// Returns every parameter's gradient after one step (two micro-batches), whole.
struct Interplay {
  bool twice = false;      // the first block applied twice
  bool leave_out = false;  // rank 1's loss leaves the second block's output out
};

// Two blocks returning both outputs: h = first(x) (or first(first(x))) and second(h).
class TwoBlocks : public Module {
 public:
  explicit TwoBlocks(bool twice)
      : Module("TwoBlocks"),
        twice_(twice),
        first_(register_module("first", std::make_shared<TransformerBlock>(16, 2, true, ParameterOptions{}, 0.1))),
        second_(register_module("second", std::make_shared<TransformerBlock>(16, 2, true, ParameterOptions{}, 0.1))) {}
  TransformerBlock& first() { return *first_; }
  TransformerBlock& second() { return *second_; }

 protected:
  Values forward(const Values& inputs) override {
    const DTensor h = twice_ ? (*first_)((*first_)(inputs[0])) : (*first_)(inputs[0]);
    return {h, (*second_)(h)};
  }

 private:
  bool twice_;
  std::shared_ptr<TransformerBlock> first_, second_;
};

TensorMap train_interplay(const DeviceMesh& mesh, Sharding sharding, Checkpointed checkpointed, Interplay how) {
  manual_seed(23);
  TwoBlocks model(how.twice);
  TransformerBlock* first = &model.first();
  TransformerBlock* second = &model.second();
  if (checkpointed != Checkpointed::kNo) {
    const CheckpointOptions policy =
        checkpointed == Checkpointed::kSelective ? selective_policy() : CheckpointOptions{};
    checkpoint(*first, policy);
    checkpoint(*second, policy);
  }
  FSDPModule* fsdp = nullptr;
  DDPModule* ddp = nullptr;
  if (sharding == Sharding::kFsdp) {
    fully_shard(*first, mesh);
    fully_shard(*second, mesh);
    fsdp = &fully_shard(model, mesh);
  } else {
    ddp = &replicate(model, mesh);
  }
  const bool rank1 = mesh.this_rank() == 1 && how.leave_out;
  {
    const int step = 0;
    for (int micro = 0; micro < 2; ++micro) {
      if (fsdp != nullptr) fsdp->set_requires_gradient_sync(micro == 1);
      if (ddp != nullptr) ddp->set_requires_gradient_sync(micro == 1);
      const Tensor input = testing::random_tensor({4, kSeq, 16}, kFloat32, 30 + 2 * step + micro);
      const DTensor x = distribute_tensor(input, mesh, {Shard(0)});
      const Values outs = model(Values{x});
      const DTensor out = rank1 ? outs[0] : outs[1];
      sum(mul(out, out)).backward();
    }
  }
  TensorMap grads;
  for (const auto& [name, p] : model.named_parameters()) grads.emplace(name, p->grad().full_tensor());
  return grads;
}

TEST_CASE("checkpointing with accumulation, no sync, a module called twice and an output one rank leaves out",
          "[nn][checkpoint]") {
  testing::run_ranks(2, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2});
    for (Sharding sharding : {Sharding::kFsdp, Sharding::kDdp}) {
      for (const Interplay how : {Interplay{.twice = true}, Interplay{.leave_out = true}}) {
        INFO((sharding == Sharding::kFsdp ? "fsdp" : "ddp") << (how.twice ? ", called twice" : ", left out on rank 1"));
        if (how.twice) {
          // Not built: each call's recompute would hand the parameters' gradients to
          // fully_shard and replicate apart. A clear error, not lost gradients.
          CHECK_THROWS_WITH(train_interplay(mesh, sharding, Checkpointed::kYes, how),
                            Catch::StartsWith("checkpoint: TransformerBlock runs a second time before the backward "
                                              "of its first call"));
          continue;
        }
        const TensorMap plain = train_interplay(mesh, sharding, Checkpointed::kNo, how);
        for (Checkpointed policy : {Checkpointed::kYes, Checkpointed::kSelective}) {
          const TensorMap checkpointed = train_interplay(mesh, sharding, policy, how);
          for (const auto& [name, g] : plain) testing::check_equal(checkpointed.at(name), g, name);
        }
      }
    }
  });
}

TEST_CASE("a store keeps every k-th product, and its replay computes exactly the others", "[nn][checkpoint]") {
  // Three products and a redistribute, every second product kept: the first and third, and
  // the redistribute's result; the replay takes those back and computes the second.
  KeptOutputs store({"linear", "redistribute"}, 2);
  const char* calls[] = {"linear", "redistribute", "linear", "linear"};
  int computed = 0;
  std::vector<double> values;
  for (KeptOutputs::Mode mode : {KeptOutputs::Mode::kRecord, KeptOutputs::Mode::kReplay}) {
    const KeptOutputs::Scope scope(&store, mode);
    computed = 0;
    values.clear();
    for (const char* op : calls) {
      const double value = 10.0 * static_cast<int>(mode) + static_cast<double>(values.size());
      values.push_back(kept_or_computed(op,
                                        [&] {
                                          ++computed;
                                          return std::vector{full({}, value)};
                                        })[0]
                           .item());
    }
    if (mode == KeptOutputs::Mode::kRecord) CHECK(computed == 4);
  }
  CHECK(computed == 1);
  CHECK(values == std::vector<double>{0, 1, 12, 3});  // the second product computed in the replay
  CHECK_THROWS_WITH(KeptOutputs({"linear"}, 0), Catch::Contains("products_every 0 must be at least 1"));
}

TEST_CASE("a module is checkpointed once; a policy names ops whose results can be kept", "[nn][checkpoint]") {
  Transformer model(testing::small_causal_lm(kVocab, kSeq));
  Module& block = model.layers().child("0");
  checkpoint(block);
  CHECK_THROWS_WITH(checkpoint(block),
                    "TransformerBlock: its forward already runs through another runner (checkpointed twice?)");
  CHECK_THROWS_WITH(checkpoint(model.layers().child("1"), {.keep_ops = {"matmul", "softmax"}}),
                    "selective checkpointing: the policy names 'softmax', whose outputs cannot be kept; it keeps "
                    "those of matmul, bmm, linear, scaled_dot_product_attention, redistribute");
}

}  // namespace
}  // namespace dtr::nn
