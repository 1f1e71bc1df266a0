// Activation checkpointing: the causal model with dropout 0.1 trained with every block
// checkpointed, fully or selectively, gives the same bits as without (losses, weights after
// three AdamW steps) on one rank and under fsdp and ddp on 2 and 3 ranks, with exactly the
// same collectives; checkpointing keeps fewer bytes for backward (the allocator's peak
// falls: full below selective below none, by bounds from the model's shapes); a forward's
// in-place ops leave the inputs its recompute starts from; a MultiheadAttention checkpointed
// alone (absent masks among its inputs) recomputes its self-attention's bits.
#include "nn/checkpoint.h"

#include <catch2/catch.hpp>

#include "checkpoint/full_state_dict.h"
#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "core/allocator.h"
#include "core/trace.h"
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
  // until its backward; with full checkpointing only the block being recomputed does: at
  // least two blocks' worth of the hidden activation fewer at the peak. Selective keeps
  // neither ReLU's output nor the first feed-forward layer's (it recomputes that product),
  // but it does keep the attention's result and the down-projection's ([tokens, dim] each):
  // between the two, by at least those.
  const int64_t hidden = batch * seq * 4 * config.dim * 4;
  const int64_t width = batch * seq * config.dim * 4;
  INFO("peak " << plain << " B plain, " << selective << " B selective, " << checkpointed << " B full");
  CHECK(plain - checkpointed >= (config.n_layers - 1) * hidden);
  CHECK(plain - selective >= (config.n_layers - 1) * hidden);
  CHECK(selective - checkpointed >= (config.n_layers - 1) * 2 * width);
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

TEST_CASE("a store keeps the products with the most FLOPs per byte, and its replay computes the others",
          "[nn][checkpoint]") {
  // A block's products as (contraction, result elements): q, k, v and the output projection
  // (64, 8 each), the feed-forward's up-projection (64, 32) and down-projection (256, 8);
  // FLOPs 1024 each, 4096 and 4096 (total 12288), and a redistribute between. Keeping half
  // the FLOPs: the down-projection first (128 FLOPs per byte), then of the ties at 32 per byte
  // the smaller results in call order: q and k reach 6144. The up-projection, as costly per
  // byte but four times the bytes, and v and the output projection are recomputed.
  struct Call {
    const char* op;
    int64_t contraction, elements;
  };
  const Call calls[] = {{"linear", 64, 8}, {"linear", 64, 8},  {"redistribute", 0, 3}, {"linear", 64, 8},
                        {"linear", 64, 8}, {"linear", 64, 32}, {"linear", 256, 8}};
  for (const auto& [share, recomputed] :
       {std::pair{0.5, std::vector<size_t>{3, 4, 5}}, {1.0, {}}, {0.0, {0, 1, 3, 4, 5, 6}}}) {
    INFO("product_flops " << share);
    KeptOutputs store({"linear", "redistribute"}, share);
    std::vector<size_t> computed;
    for (KeptOutputs::Mode mode : {KeptOutputs::Mode::kRecord, KeptOutputs::Mode::kReplay}) {
      const KeptOutputs::Scope scope(&store, mode);
      computed.clear();
      for (size_t i = 0; i < std::size(calls); ++i) {
        const double value = 100.0 * static_cast<int>(mode) + static_cast<double>(i);
        const Tensor out = kept_or_computed(
            calls[i].op,
            [&] {
              computed.push_back(i);
              return std::vector{full({calls[i].elements}, value)};
            },
            calls[i].contraction)[0];
        // A kept result is the forward's (value i), a recomputed one the replay's (100 + i).
        const bool replayed = mode == KeptOutputs::Mode::kReplay &&
                              std::find(recomputed.begin(), recomputed.end(), i) != recomputed.end();
        CHECK(out.to(kFloat64).select(0, 0).item() == (replayed ? 100.0 + static_cast<double>(i) : i));
      }
      if (mode == KeptOutputs::Mode::kRecord) {
        CHECK(computed.size() == std::size(calls));
        store.select();
      }
    }
    CHECK(computed == recomputed);
  }
  CHECK_THROWS_WITH(KeptOutputs({"linear"}, 1.5), Catch::Contains("product_flops 1.5 must be in [0, 1]"));
}

// y = x + 1 written over x where nothing else holds it (add_), then y * y: a forward whose
// values depend on an input it may overwrite.
class AddsInPlace : public UnaryModule {
 public:
  AddsInPlace() : UnaryModule("AddsInPlace") {}

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override {
    const DTensor y = add_(x, testing::on_one_rank(full(x.shape(), 1.0, x.dtype())));
    return mul(y, y);
  }
};

TEST_CASE("a checkpointed module's in-place ops leave the inputs its recompute starts from", "[nn][checkpoint]") {
  // The input's only handle is the call's, so add_ may overwrite it; the checkpoint saves the
  // inputs first, which keeps them: the recompute sees x, and the gradient is 2 (x + 1).
  for (bool checkpointed : {false, true}) {
    AddsInPlace module;
    if (checkpointed) checkpoint(module);
    DTensor x = testing::on_one_rank(Tensor::from_vector<double>({1, -2, 3}));
    x.requires_grad_();
    Values in;
    in.push_back(mul(x, 1.0));  // the call's Values hold its only handle
    sum(module(std::move(in)).at(0)).backward();
    INFO((checkpointed ? "checkpointed" : "plain"));
    CHECK(testing::to_f64(x.grad().to_local()) == std::vector<double>{4, -2, 8});
  }
}

TEST_CASE("a checkpointed self-attention recomputes its one projection: the plain module's bits", "[nn][checkpoint]") {
  // One tensor given as query, key and value is saved and recomputed as one leaf, so the
  // recompute projects it in one product as the forward did (the in_proj and out_proj
  // products: 2 matmul_bias kernels per forward, where three projections would make 4), the
  // selective replay meets the products the forward kept, and the gradients, the one
  // leaf's summed once, are the plain module's. Its masks, absent, stay absent.
  struct Run {
    std::vector<double> x, in_proj;
    int64_t products = 0;  // matmul_bias kernels in forward and backward
  };
  auto run = [](Checkpointed how) {
    manual_seed(5);
    MultiheadAttention attn(8, 2, {.batch_first = true, .dropout = 0.1});
    if (how != Checkpointed::kNo)
      checkpoint(attn, how == Checkpointed::kSelective ? selective_policy() : CheckpointOptions{});
    DTensor x = testing::on_one_rank(testing::random_tensor({2, 5, 8}, kFloat32, 3));
    x.requires_grad_();
    const DTensor h = mul(x, 2.0);
    trace::start(trace::bit(trace::Category::kKernel));
    sum(attn(h, h, h, {.is_causal = true}).first).backward();
    Run out{testing::to_f64(x.grad().to_local()), testing::to_f64(attn.parameter("in_proj_weight").grad().to_local())};
    for (const trace::ThreadEvents& t : trace::stop()) {
      for (const trace::Event& e : t.events) out.products += e.name == std::string_view("matmul_bias");
    }
    return out;
  };
  const Run plain = run(Checkpointed::kNo);
  CHECK(plain.products == 2);
  for (Checkpointed how : {Checkpointed::kYes, Checkpointed::kSelective}) {
    INFO((how == Checkpointed::kYes ? "full" : "selective"));
    const Run checkpointed = run(how);
    if (how == Checkpointed::kYes) CHECK(checkpointed.products == 4);  // the forward's two, recomputed
    CHECK(checkpointed.x == plain.x);
    CHECK(checkpointed.in_proj == plain.in_proj);
  }
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
