// Module: PyTorch's names and order, repr, registration errors, state dicts (strict and
// not, with every mismatch listed), modes, dtype moves, tied parameters, hooks, and the
// initialisation rules (bounds, and values independent of placements).
#include "nn/module.h"

#include <catch2/catch.hpp>

#include <memory>

#include "checkpoint/full_state_dict.h"
#include "core/error.h"
#include "dtensor/autograd.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/reduce.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/embedding.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using checkpoint::full_state_dict;
using checkpoint::load_full_state_dict;

using testing::on_one_rank;

using testing::MessageContains;

std::shared_ptr<Sequential> ffn() {
  return std::make_shared<Sequential>(
      std::vector<std::shared_ptr<Module>>{std::make_shared<Linear>(4, 8), std::make_shared<ReLU>(),
                                           std::make_shared<Linear>(8, 4, LinearOptions{.bias = false})});
}

// A block with a child container and its own parameter, as a model nests them.
class Block : public UnaryModule {
 public:
  Block() : UnaryModule("Block"), norm(register_module("norm", std::make_shared<LayerNorm>(Shape{4}))) {
    register_module("ffn", ffn());
    scale_ = &register_parameter("scale", empty_parameter({4}, {}));
    ones_(*scale_);
  }
  std::shared_ptr<LayerNorm> norm;

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override { return dynamic_cast<Sequential&>(child("ffn"))((*norm)(x)); }

 private:
  DTensor* scale_;
};

std::vector<std::string> names(const std::vector<std::pair<std::string, DTensor*>>& items) {
  std::vector<std::string> out;
  for (const auto& item : items) out.push_back(item.first);
  return out;
}

TEST_CASE("names, order and repr follow PyTorch", "[nn][module]") {
  Block block;
  CHECK(names(block.named_parameters()) ==
        std::vector<std::string>{"scale", "norm.weight", "norm.bias", "ffn.0.weight", "ffn.0.bias", "ffn.2.weight"});
  std::vector<std::string> modules;
  for (const auto& [name, m] : block.named_modules()) modules.push_back(name + ":" + m->type_name());
  CHECK(modules == std::vector<std::string>{":Block", "norm:LayerNorm", "ffn:Sequential", "ffn.0:Linear", "ffn.1:ReLU",
                                            "ffn.2:Linear"});
  CHECK(block.num_parameters() == 4 + 4 + 4 + 32 + 8 + 32);
  CHECK(block.state_dict().size() == 6);
  CHECK(block.repr() ==
        "Block(\n"
        "  (norm): LayerNorm((4,), eps=1e-05, elementwise_affine=True)\n"
        "  (ffn): Sequential(\n"
        "    (0): Linear(in_features=4, out_features=8, bias=True)\n"
        "    (1): ReLU()\n"
        "    (2): Linear(in_features=8, out_features=4, bias=False)\n"
        "  )\n"
        ")\n"
        "84 parameters in 6 tensors: scale [4], norm.weight [4], norm.bias [4], ffn.0.weight [8, 4], ffn.0.bias [8], "
        "ffn.2.weight [4, 8]\n");
  CHECK(ReLU(/*inplace=*/true).repr() == "ReLU(inplace=True)\n0 parameters in 0 tensors: \n");
}

TEST_CASE("registration errors name the module and the name", "[nn][module][errors]") {
  Linear linear(2, 3);
  CHECK_THROWS_MATCHES(linear.register_parameter("weight", empty_parameter({1}, {})), ValueError,
                       MessageContains("Linear: 'weight' is already registered"));
  CHECK_THROWS_MATCHES(linear.register_module("a.b", std::make_shared<ReLU>()), ValueError,
                       MessageContains("the name 'a.b' is not legal"));
  CHECK_THROWS_MATCHES(linear.register_parameter("steps", empty_parameter({1}, {.dtype = kInt64})), TypeError,
                       MessageContains("parameter 'steps' is int64"));
  CHECK_THROWS_MATCHES(linear.parameter("scale"), ValueError, MessageContains("no parameter 'scale'; it has"));
  CHECK_THROWS_AS(Linear(0, 3), ValueError);
  CHECK_THROWS_MATCHES(ModuleList()(Values{}), ValueError, MessageContains("has no forward"));
}

TEST_CASE("state dicts: round trip, strict errors list everything, non-strict reports", "[nn][module][state_dict]") {
  manual_seed(1);
  Block a;
  manual_seed(2);
  Block b;
  const TensorMap full = full_state_dict(a);
  CHECK(full.size() == 6);
  load_full_state_dict(b, full);
  for (const auto& [name, t] : full_state_dict(b)) {
    INFO(name);
    CHECK(testing::to_f64(t) == testing::to_f64(full.at(name)));
  }
  // Parameters stay leaves that require grad after loading.
  for (DTensor* p : b.parameters()) CHECK((p->is_leaf() && p->requires_grad()));

  TensorMap bad = full;
  bad.erase("norm.bias");
  bad.emplace("extra.weight", Tensor::empty({2}, kFloat32));
  bad["ffn.0.weight"] = Tensor::empty({4, 4}, kFloat32);
  bad["scale"] = Tensor::empty({4}, kFloat64);
  CHECK_THROWS_MATCHES(
      load_full_state_dict(b, bad), ValueError,
      MessageContains("missing keys: 1 (norm.bias)") && MessageContains("unexpected keys: 1 (extra.weight)") &&
          MessageContains("'ffn.0.weight': the state dict holds float32[4, 4] but the module has "
                          "float32[8, 4]") &&
          MessageContains("'scale': the state dict holds float64[4]") && MessageContains("nothing was loaded"));
  // Two different models: counts and the first names, one readable line however many.
  TensorMap other;
  for (int i = 0; i < 40; ++i) other.emplace(fmt::format("other.{}.weight", i), Tensor::empty({2}, kFloat32));
  try {
    load_full_state_dict(b, other);
    FAIL("loading another model's state dict did not throw");
  } catch (const ValueError& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Catch::Contains("missing keys: 6 (") && Catch::Contains(" and 1 more)") &&
                            Catch::Contains("unexpected keys: 40 (other.0.weight, other.1.weight, ") &&
                            Catch::Contains(" and 35 more)"));
    CHECK(message.size() < 400);
  }
  TensorMap partial = full;
  partial.erase("norm.bias");
  partial.emplace("extra.weight", Tensor::empty({2}, kFloat32));
  const LoadResult r = load_full_state_dict(b, partial, Strict::kNo);
  CHECK(r.missing_keys == std::vector<std::string>{"norm.bias"});
  CHECK(r.unexpected_keys == std::vector<std::string>{"extra.weight"});
}

TEST_CASE("train/eval, apply, to(dtype), zero_grad and tied parameters", "[nn][module]") {
  Block block;
  block.eval();
  for (const auto& [name, m] : block.named_modules()) CHECK_FALSE(m->training());
  block.train();
  int visited = 0;
  block.apply([&](Module&) { ++visited; });
  CHECK(visited == 6);
  block.to(kBFloat16);
  for (DTensor* p : block.parameters()) CHECK((p->dtype() == kBFloat16 && p->is_leaf() && p->requires_grad()));
  block.to(kFloat32);
  // A parameter shared by two modules is listed once (PyTorch's tied embeddings).
  Sequential tied({std::make_shared<Linear>(3, 3, LinearOptions{.bias = false}),
                   std::make_shared<Linear>(3, 3, LinearOptions{.bias = false})});
  tied.child("1").parameter("weight") = tied.child("0").parameter("weight");
  CHECK(names(tied.named_parameters()) == std::vector<std::string>{"0.weight"});
  CHECK(tied.state_dict().size() == 2);  // the state dict keeps both names, as PyTorch's does
  DTensor y = sum(tied(on_one_rank(testing::random_tensor({2, 3}, kFloat32, 5))));
  y.backward();
  CHECK(tied.parameters()[0]->grad().defined());
  tied.zero_grad();
  CHECK_FALSE(tied.parameters()[0]->grad().defined());
}

TEST_CASE("hooks: replace inputs and outputs; backward pre and post hooks run in order", "[nn][module][hooks]") {
  Linear linear(3, 2);
  std::vector<std::string> log;
  linear.register_forward_pre_hook([&](Module&, const Values& in) -> std::optional<Values> {
    log.push_back("pre");
    return Values{mul(in[0], 2.0)};
  });
  linear.register_forward_hook([&](Module&, const Values&, const Values& out) -> std::optional<Values> {
    log.push_back("post");
    return Values{add(out[0], 1.0)};
  });
  linear.register_backward_pre_hook([&](Module&) {
    CHECK_FALSE(linear.weight().grad().defined());  // before any gradient accumulates
    log.push_back("backward_pre");
  });
  linear.register_post_backward_hook([&](Module&) {
    CHECK(linear.weight().grad().defined());
    CHECK(linear.bias().grad().defined());
    log.push_back("post_backward");
  });
  const Tensor x = testing::random_tensor({4, 3}, kFloat32, 7);
  DTensor y = linear(on_one_rank(x));
  {
    NoGradGuard no_grad;
    const DTensor expected = add(dtr::linear(mul(on_one_rank(x), 2.0), linear.weight(), linear.bias()), 1.0);
    CHECK(testing::to_f64(y.to_local()) == testing::to_f64(expected.to_local()));
  }
  CHECK(log == std::vector<std::string>{"pre", "post"});
  sum(y).backward();
  CHECK(log == std::vector<std::string>{"pre", "post", "backward_pre", "post_backward"});
}

TEST_CASE("initialisation: PyTorch's bounds, and values independent of placements", "[nn][init]") {
  manual_seed(3);
  Linear linear(16, 8);
  const double bound = 1.0 / 4.0;  // kaiming_uniform_(a = sqrt(5)) and the bias both give 1/sqrt(in)
  for (DTensor* p : linear.parameters()) {
    for (double v : testing::to_f64(p->to_local())) CHECK(std::abs(v) <= bound);
  }
  Embedding embedding(50, 8, 3);
  for (double v : testing::to_f64(embedding.weight().to_local().narrow(0, 3, 1))) CHECK(v == 0.0);
  // The same draw, sharded: each rank's chunk of a Shard(0) parameter is its slice of the whole.
  DTensor whole = empty_parameter({10, 3}, {});
  manual_seed(9);
  normal_(whole);
  for (int64_t rank = 0; rank < 4; ++rank) {
    const DeviceMesh mesh = DeviceMesh::row_major(kCPU, {4}, {}, rank, 4);
    const DTensorSpec spec(mesh, {Shard(0)}, {10, 3}, kFloat32);
    DTensor shard(Tensor::empty(spec.local_shape(), kFloat32), spec);
    manual_seed(9);
    normal_(shard);
    const LocalChunk chunk = spec.local_chunk();
    CHECK(testing::to_f64(shard.to_local()) ==
          testing::to_f64(whole.to_local().narrow(0, chunk.offset[0], chunk.shape[0])));
  }
  DTensor t = empty_parameter({4000}, {});
  trunc_normal_(t, 0.0, 1.0, -1.0, 2.0);
  double mean = 0;
  for (double v : testing::to_f64(t.to_local())) {
    CHECK((v >= -1.0 && v <= 2.0));
    mean += v / 4000;
  }
  CHECK(std::abs(mean - 0.2296) < 0.05);  // the mean of N(0, 1) truncated to [-1, 2]
  CHECK_THROWS_MATCHES(kaiming_uniform_(t), ValueError, MessageContains("kaiming_uniform_: fan in and fan out"));
}

}  // namespace
}  // namespace dtr::nn
