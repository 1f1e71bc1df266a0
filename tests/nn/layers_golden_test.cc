// Each nn layer against PyTorch 2.15: the same weights (loaded from the file through
// load_full_state_dict), the same input and upstream gradient give the output and every
// gradient within 1e-5 relative (max norm) in float32. The data: tests/nn/testdata/make_nn_testdata.py.
#include <catch2/catch.hpp>

#include <memory>

#include "checkpoint/full_state_dict.h"
#include "dtensor/autograd.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/norm.h"
#include "nn/parameter.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using checkpoint::load_full_state_dict;
using safetensors::load_file;

using testing::on_one_rank;
using testing::relative_max_error;

void check_against_torch(const std::string& name, Module& module) {
  INFO(name);
  const TensorMap data = load_file("tests/nn/testdata/layers/" + name + ".safetensors");
  TensorMap state;
  for (const auto& [key, t] : data) {
    if (key.starts_with("state.")) state.emplace(key.substr(6), t);
  }
  load_full_state_dict(module, state);
  DTensor x = on_one_rank(data.at("input"));
  const bool floating = is_floating(x.dtype());
  if (floating) x.requires_grad_();
  DTensor y = module(Values{x}).at(0);
  CHECK(y.shape() == data.at("output").shape());
  CHECK(relative_max_error(y.to_local(), data.at("output")) <= 1e-5);
  y.backward(on_one_rank(data.at("grad_output")));
  if (floating) CHECK(relative_max_error(x.grad().to_local(), data.at("grad.input")) <= 1e-5);
  int grads = 0;
  for (auto& [param, p] : module.named_parameters()) {
    INFO("gradient of " << param);
    REQUIRE(p->grad().defined());
    CHECK(relative_max_error(p->grad().to_local(), data.at("grad." + param)) <= 1e-5);
    ++grads;
  }
  CHECK(grads == static_cast<int>(state.size()));
}

TEST_CASE("layers match PyTorch 2.15: outputs and gradients", "[nn][golden]") {
  check_against_torch("linear", *std::make_shared<Linear>(5, 3));
  check_against_torch("linear_nobias", *std::make_shared<Linear>(5, 3, LinearOptions{.bias = false}));
  check_against_torch("embedding", *std::make_shared<Embedding>(10, 4, 2));
  check_against_torch("layer_norm", *std::make_shared<LayerNorm>(Shape{6}));
  check_against_torch("layer_norm_nobias", *std::make_shared<LayerNorm>(Shape{6}, LayerNormOptions{.bias = false}));
  check_against_torch("rms_norm", *std::make_shared<RMSNorm>(Shape{6}));
  check_against_torch("gelu", *std::make_shared<GELU>());
  check_against_torch("gelu_tanh", *std::make_shared<GELU>(GeluApproximation::kTanh));
  check_against_torch("relu", *std::make_shared<ReLU>());
  check_against_torch("silu", *std::make_shared<SiLU>());
  Sequential ffn({std::make_shared<Linear>(4, 16), std::make_shared<ReLU>(), std::make_shared<Linear>(16, 4)});
  check_against_torch("ffn", ffn);
}

TEST_CASE("losses match PyTorch: cross_entropy (reductions, ignore_index, label smoothing) and mse_loss",
          "[nn][golden][loss]") {
  const std::vector<std::pair<std::string, LossReduction>> reductions = {
      {"mean", LossReduction::kMean}, {"sum", LossReduction::kSum}, {"none", LossReduction::kNone}};
  for (const auto& [suffix, reduction] : reductions) {
    for (const std::string kind : {"cross_entropy_", "cross_entropy_smooth_", "mse_"}) {
      const std::string name = kind + suffix;
      INFO(name);
      const TensorMap data = load_file("tests/nn/testdata/layers/" + name + ".safetensors");
      DTensor x = on_one_rank(data.at("input"));
      x.requires_grad_();
      const DTensor target = on_one_rank(data.at("target"));
      const DTensor y =
          kind == "mse_"
              ? mse_loss(x, target, reduction)
              : cross_entropy(x, target,
                              {.reduction = reduction, .label_smoothing = kind == "cross_entropy_smooth_" ? 0.1 : 0.0});
      CHECK(y.shape() == data.at("output").shape());
      CHECK(relative_max_error(y.to_local(), data.at("output")) <= 1e-5);
      y.backward(on_one_rank(data.at("grad_output")));
      CHECK(relative_max_error(x.grad().to_local(), data.at("grad.input")) <= 1e-5);
    }
  }
}

}  // namespace
}  // namespace dtr::nn
