// The CUDA optimizer kernels (kernels/cuda/optimizer_step.h) against the CPU kernels: five
// steps of SGD (plain, weight decay, momentum with dampening, Nesterov), Adam (with L2 and
// AMSGrad) and AdamW on the same parameters and gradients, in every parameter dtype, at
// sizes 1, 7, 1023 and 4097; parameters and state compared after each step; and one
// multi-tensor step of many parameters across the launcher's tensor and chunk limits. Tagged gpu
// (Bazel) and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/optimizer_step.h"
#include "kernels/fill.h"
#include "kernels/optimizer_step.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::random_tensor;
using testing::to_f64;

const Device kGpu(kCUDA, 0);

// One run's tensors on one device.
struct State {
  Tensor param, m, v, v_max;
};

State make_state(const Tensor& p0, Device device) {
  const DType s = optimizer_state_dtype(p0.dtype());
  return {p0.to(device).clone(), zeros(p0.shape(), s, device), zeros(p0.shape(), s, device),
          zeros(p0.shape(), s, device)};
}

using Step = std::function<void(State&, const Tensor& grad, int64_t step)>;

void check_steps(const Step& step, DType d, int64_t n, const std::string& what) {
  const Tensor p0 = random_tensor({n}, d, 1, -1, 1);
  State cpu = make_state(p0, kCPU), gpu = make_state(p0, kGpu);
  for (int64_t t = 1; t <= 5; ++t) {
    const Tensor grad = random_tensor({n}, d, 10 + t, -1, 1);
    step(cpu, grad, t);
    step(gpu, grad.to(kGpu), t);
    const std::string at = fmt::format("{} {} n={} step {}", what, dtype_name(d), n, t);
    check_close(gpu.param, cpu.param, at + " param");
    check_close(gpu.m, cpu.m, at + " state 1");
    check_close(gpu.v, cpu.v, at + " state 2");
  }
}

TEST_CASE("CUDA SGD, Adam and AdamW steps match the CPU", "[gpu]") {
  const std::vector<std::pair<std::string, Step>> steps = {
      {"sgd", [](State& s, const Tensor& g, int64_t t) { sgd_step_(s.param, g, s.m, t, {.lr = 0.1}); }},
      {"sgd weight decay",
       [](State& s, const Tensor& g, int64_t t) { sgd_step_(s.param, g, s.m, t, {.lr = 0.1, .weight_decay = 0.01}); }},
      {"sgd momentum",
       [](State& s, const Tensor& g, int64_t t) {
         sgd_step_(s.param, g, s.m, t, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1});
       }},
      {"sgd nesterov",
       [](State& s, const Tensor& g, int64_t t) {
         sgd_step_(s.param, g, s.m, t, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
       }},
      {"adam", [](State& s, const Tensor& g,
                  int64_t t) { adam_step_(s.param, g, s.m, s.v, t, {.lr = 1e-2, .weight_decay = 0.1}); }},
      {"adam amsgrad",
       [](State& s, const Tensor& g, int64_t t) { adam_step_(s.param, g, s.m, s.v, t, {.lr = 1e-2}, &s.v_max); }},
      {"adamw", [](State& s, const Tensor& g,
                   int64_t t) { adamw_step_(s.param, g, s.m, s.v, t, {.lr = 1e-2, .weight_decay = 0.1}); }},
  };
  for (const auto& [name, step] : steps) {
    for (DType d : {kFloat32, kFloat64, kBFloat16}) {
      for (int64_t n : {1, 7, 1023, 4097}) check_steps(step, d, n, name);
    }
  }
}

// One multi-tensor step of `count` parameters of `n` elements each on the GPU against the
// same step of each parameter on the CPU; count > kMaxListTensors and n > kMaxListBlocks
// chunks split the list over launches, a parameter's chunks over two of them.
void check_multi_tensor(int count, int64_t n, DType d) {
  std::vector<StepTensors> cpu, gpu;
  for (int k = 0; k < count; ++k) {
    const Tensor p = random_tensor({n + k}, d, 100 + k, -1, 1), g = random_tensor({n + k}, d, 200 + k, -1, 1);
    const DType s = optimizer_state_dtype(d);
    cpu.push_back({.param = p.clone(), .grad = g, .state = {zeros({n + k}, s), zeros({n + k}, s), zeros({n + k}, s)}});
    gpu.push_back({.param = p.to(kGpu),
                   .grad = g.to(kGpu),
                   .state = {zeros({n + k}, s, kGpu), zeros({n + k}, s, kGpu), zeros({n + k}, s, kGpu)}});
  }
  const AdamWOptions o{.lr = 1e-2, .weight_decay = 0.1};
  for (int64_t t = 1; t <= 2; ++t) {
    adamw_step_(gpu, t, o);
    adamw_step_(cpu, t, o);
  }
  for (int k = 0; k < count; ++k) {
    const std::string at = fmt::format("adamw list of {} x {} {}, parameter {}", count, n, dtype_name(d), k);
    check_close(gpu[k].param, cpu[k].param, at + " param");
    check_close(gpu[k].state[0], cpu[k].state[0], at + " exp_avg");
    check_close(gpu[k].state[2], cpu[k].state[2], at + " max_exp_avg_sq");
  }
}

TEST_CASE("CUDA multi-tensor steps match the CPU across launch boundaries", "[gpu]") {
  check_multi_tensor(3, 5, kFloat32);
  check_multi_tensor(60, 1000, kBFloat16);                                        // three launches by tensor count
  check_multi_tensor(2, cuda::kMaxListBlocks * cuda::kListChunk + 17, kFloat32);  // a parameter over two launches
}

}  // namespace
}  // namespace dtr
