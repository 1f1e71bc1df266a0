// Training steps of the small causal LM on one GPU against the same steps on the CPU: the
// same parameters (drawn on the host from one seed), the same batch, three AdamW steps;
// the losses, every gradient after the first backward and every parameter after the last
// step agree within float32 tolerance. With dropout the masks are the CPU's (the same
// Philox draw at each global index), so the comparison holds there too. Tagged gpu (Bazel)
// and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <vector>

#include "dtensor/ops/view_ops.h"
#include "kernels/random.h"
#include "nn/init.h"
#include "nn/loss.h"
#include "optim/adam.h"
#include "tests/nn/nn_test_util.h"

namespace dtr {
namespace {

using testing::relative_max_error;

struct Run {
  std::vector<double> losses;
  std::vector<Tensor> first_grads;  // on the host, in parameter order
  std::vector<Tensor> final_params;
};

// Three steps of the model on a one-rank mesh of `device`, from manual_seed(0).
Run train(DeviceType device, double dropout) {
  constexpr int64_t kVocab = 64, kSeq = 16, kBatch = 4;
  const DeviceMesh mesh = DeviceMesh::row_major(device, {1}, {}, 0, 1);
  nn::manual_seed(0);
  nn::TransformerConfig config = testing::small_causal_lm(kVocab, kSeq);
  config.dropout = dropout;
  nn::Transformer model(config, {.mesh = mesh});
  optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
  Tensor u = Tensor::empty({kBatch, kSeq + 1}, kFloat64);
  uniform_(u, 0, kVocab - 0.5, 7);
  const Tensor ids = u.to(kInt64).to(Device(device, 0));
  const DTensor x = distribute_tensor(ids.narrow(1, 0, kSeq).contiguous(), mesh, {Replicate()});
  const DTensor y =
      reshape(distribute_tensor(ids.narrow(1, 1, kSeq).contiguous(), mesh, {Replicate()}), {kBatch * kSeq});
  Run run;
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    const DTensor loss = nn::cross_entropy(reshape(model(x), {kBatch * kSeq, kVocab}), y);
    loss.backward();
    run.losses.push_back(loss.item());
    if (step == 0) {
      for (DTensor* p : model.parameters()) run.first_grads.push_back(p->grad().to_local().to(kCPU));
    }
    opt.step();
  }
  for (DTensor* p : model.parameters()) run.final_params.push_back(p->to_local().to(kCPU));
  return run;
}

void check_same_training(double dropout) {
  const Run cpu = train(kCPU, dropout), gpu = train(kCUDA, dropout);
  for (size_t s = 0; s < cpu.losses.size(); ++s) {
    INFO("dropout " << dropout << " step " << s << ": cpu loss " << cpu.losses[s] << ", gpu " << gpu.losses[s]);
    CHECK(gpu.losses[s] == Approx(cpu.losses[s]).epsilon(1e-5));
  }
  REQUIRE(gpu.first_grads.size() == cpu.first_grads.size());
  for (size_t k = 0; k < cpu.first_grads.size(); ++k) {
    INFO("dropout " << dropout << " parameter " << k);
    CHECK(relative_max_error(gpu.first_grads[k], cpu.first_grads[k]) < 1e-4);
    CHECK(relative_max_error(gpu.final_params[k], cpu.final_params[k]) < 1e-4);
  }
}

TEST_CASE("training steps on one GPU match the same steps on the CPU", "[gpu]") {
  check_same_training(0.0);
  check_same_training(0.1);
}

}  // namespace
}  // namespace dtr
