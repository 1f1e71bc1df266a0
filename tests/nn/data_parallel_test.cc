// The causal model trained with the batch sharded (Shard(0)) and Replicate parameters on
// 2, 3 (an uneven batch: 2, 2 and 0 sequences) and 4 ranks matches one rank step by step:
// the loss, the clipped gradient norm and every weight after three AdamW steps.
#include <catch2/catch.hpp>

#include "checkpoint/full_state_dict.h"
#include "collectives/init.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/view_ops.h"
#include "nn/init.h"
#include "nn/parameter.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using checkpoint::full_state_dict;

constexpr int64_t kBatch = 4, kSeq = 8, kVocab = 32;

struct Trace {
  std::vector<double> losses, norms;
  TensorMap weights;
};

// Three steps on `mesh`, the batch sharded over it (Replicate on a one-rank mesh).
Trace train(const DeviceMesh& mesh, const Tensor& tokens, const Tensor& targets) {
  manual_seed(42);
  Transformer model(testing::small_causal_lm(kVocab, kSeq), {.mesh = mesh});
  optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
  const DTensor x = distribute_tensor(tokens, mesh, {Shard(0)});
  const DTensor y = distribute_tensor(targets, mesh, {Shard(0)});
  Trace trace;
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    const DTensor loss = cross_entropy(reshape(model(x), {kBatch * kSeq, kVocab}), reshape(y, {kBatch * kSeq}));
    loss.backward();
    trace.norms.push_back(optim::clip_grad_norm_(model.parameters(), 1.0));
    opt.step();
    trace.losses.push_back(loss.item());
  }
  trace.weights = full_state_dict(model);
  return trace;
}

TEST_CASE("data parallel training on 2, 3 and 4 ranks matches one rank", "[nn][data_parallel]") {
  for (int world : {2, 3, 4}) {
    testing::run_ranks(world, [](int, int world) {
      const Tensor tokens = testing::random_tensor({kBatch, kSeq}, kFloat64, 1, 0, kVocab).to(kInt64);
      const Tensor targets = testing::random_tensor({kBatch, kSeq}, kFloat64, 2, 0, kVocab).to(kInt64);
      const Trace one = train(single_rank_mesh(), tokens, targets);
      const Trace many = train(init_device_mesh(kCPU, {world}), tokens, targets);
      INFO(world << " ranks");
      for (int step = 0; step < 3; ++step) {
        INFO("step " << step + 1);
        CHECK(many.losses[step] == Approx(one.losses[step]).epsilon(1e-5));
        CHECK(many.norms[step] == Approx(one.norms[step]).epsilon(1e-5));
      }
      for (const auto& [name, w] : one.weights) {
        INFO(name);
        if (name.ends_with("in_proj_bias")) {
          // The key third only collects rounding noise (its gradient is exactly zero: softmax
          // ignores a shift of a query's scores), which AdamW turns into +-lr steps either
          // way; the query and value thirds are compared.
          const int64_t e = w.size(0) / 3;
          for (int64_t third : {0, 2}) {
            testing::check_close(many.weights.at(name).narrow(0, third * e, e), w.narrow(0, third * e, e), {1e-4, 1e-4},
                                 name);
          }
          continue;
        }
        testing::check_close(many.weights.at(name), w, {1e-4, 1e-4}, name);
      }
    });
  }
}

}  // namespace
}  // namespace dtr::nn
