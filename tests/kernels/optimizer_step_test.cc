// Fused SGD, Adam and AdamW steps: several steps against float64 references written from
// torch.optim's documented algorithms, every parameter dtype, exact cases, typed errors.
#include <cmath>
#include <type_traits>

#include "kernels/fill.h"
#include "kernels/optimizer_step.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::check_equal;
using testing::random_tensor;
using testing::to_f64;
using testing::Tolerance;

constexpr DType kParamDTypes[] = {kFloat32, kFloat64, kBFloat16};
constexpr int kSteps = 5;

// The parameter as the kernel stores it after a step: rounded once to its dtype.
std::vector<double> round_to(DType dtype, const std::vector<double>& v) {
  return to_f64(Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(dtype));
}

// Parameters are compared to a reference rounded like them, so bfloat16 may differ by one
// unit in the last place where float32 and float64 arithmetic round to different sides.
Tolerance param_tolerance(DType d) { return d == kBFloat16 ? Tolerance{1e-6, 1.0 / 128} : testing::tolerance_for(d); }
// States are sums of terms up to ~4 (momentum) that may cancel, so atol is a few ulps of 4
// in the state dtype; the float32 state of a bfloat16 parameter also inherits the parameter's one-ulp
// differences through weight decay.
Tolerance state_tolerance(DType d) {
  switch (d) {
    case kFloat64: return {1e-14, 1e-10};
    case kFloat32: return {1e-6, 1e-5};
    default: return {1e-6, 1e-3};
  }
}

// torch.optim.SGD's algorithm, one step t (from 1), in float64.
void sgd_reference(std::vector<double>& p, const std::vector<double>& grad, std::vector<double>& b, int64_t t,
                   const SgdOptions& o) {
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i];
    if (o.weight_decay != 0) g = g + o.weight_decay * p[i];
    if (o.momentum != 0) {
      b[i] = t > 1 ? o.momentum * b[i] + (1 - o.dampening) * g : g;
      g = o.nesterov ? g + o.momentum * b[i] : b[i];
    }
    p[i] = p[i] - o.lr * g;
  }
}

// torch.optim.Adam (decoupled = false) and AdamW (decoupled = true), one step t, in float64.
void adam_reference(std::vector<double>& p, const std::vector<double>& grad, std::vector<double>& m,
                    std::vector<double>& v, int64_t t, const AdamOptions& o, bool decoupled) {
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i];
    if (decoupled) {
      p[i] = p[i] - o.lr * o.weight_decay * p[i];
    } else if (o.weight_decay != 0) {
      g = g + o.weight_decay * p[i];
    }
    m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
    v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
    const double m_hat = m[i] / (1 - std::pow(o.beta1, static_cast<double>(t)));
    const double v_hat = v[i] / (1 - std::pow(o.beta2, static_cast<double>(t)));
    p[i] = p[i] - o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
  }
}

void run_sgd_case(DType dtype, Shape shape, const SgdOptions& o, uint64_t seed) {
  Tensor param = random_tensor(shape, dtype, seed);
  // NaN before step 1: the first step must set the buffer, never read it.
  Tensor buffer = o.momentum != 0 ? full(shape, NAN, optimizer_state_dtype(dtype)) : Tensor();
  std::vector<double> p = to_f64(param), b(p.size(), 0.0);
  for (int64_t t = 1; t <= kSteps; ++t) {
    Tensor grad = random_tensor(shape, dtype, seed + 100 * t);
    sgd_step_(param, grad, buffer, t, o);
    sgd_reference(p, to_f64(grad), b, t, o);
    p = round_to(dtype, p);
  }
  const std::string what = fmt::format("sgd momentum {} nesterov {} {}", o.momentum, o.nesterov, shape);
  check_close(param, shape, p, param_tolerance(dtype), what);
  if (o.momentum != 0) check_close(buffer, shape, b, state_tolerance(dtype), what + " momentum_buffer");
}

// Options is AdamOptions (adam_step_) or AdamWOptions (adamw_step_).
template <class Options>
void run_adam_case(DType dtype, Shape shape, const Options& o, uint64_t seed) {
  constexpr bool decoupled = std::is_same_v<Options, AdamWOptions>;
  Tensor param = random_tensor(shape, dtype, seed);
  Tensor exp_avg = zeros(shape, optimizer_state_dtype(dtype)), exp_avg_sq = zeros(shape, optimizer_state_dtype(dtype));
  std::vector<double> p = to_f64(param), m(p.size(), 0.0), v(p.size(), 0.0);
  const AdamOptions ref{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay};
  for (int64_t t = 1; t <= kSteps; ++t) {
    Tensor grad = random_tensor(shape, dtype, seed + 100 * t);
    if constexpr (decoupled) {
      adamw_step_(param, grad, exp_avg, exp_avg_sq, t, o);
    } else {
      adam_step_(param, grad, exp_avg, exp_avg_sq, t, o);
    }
    adam_reference(p, to_f64(grad), m, v, t, ref, decoupled);
    p = round_to(dtype, p);
  }
  const std::string what = fmt::format("{} {}", decoupled ? "adamw" : "adam", shape);
  check_close(param, shape, p, param_tolerance(dtype), what);
  check_close(exp_avg, shape, m, state_tolerance(dtype), what + " exp_avg");
  check_close(exp_avg_sq, shape, v, state_tolerance(dtype), what + " exp_avg_sq");
}

TEST_CASE("sgd_step_ follows torch.optim.SGD over several steps", "[optimizer][sgd]") {
  const SgdOptions variants[] = {
      {.lr = 0.1},
      {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
      {.lr = 0.05, .momentum = 0.8, .weight_decay = 0.1, .nesterov = true},
  };
  uint64_t seed = 1;
  for (DType dtype : kParamDTypes) {
    for (int64_t n : testing::kAwkwardSizes) {
      for (const SgdOptions& o : variants) run_sgd_case(dtype, {n}, o, seed++);
    }
    run_sgd_case(dtype, {7, 3}, variants[1], seed++);
  }
}

TEST_CASE("adam_step_ and adamw_step_ follow torch.optim over several steps", "[optimizer][adam]") {
  const AdamOptions adam{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  const AdamWOptions adamw{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.999, .eps = 1e-6, .weight_decay = 0.1};
  uint64_t seed = 1000;
  for (DType dtype : kParamDTypes) {
    for (int64_t n : testing::kAwkwardSizes) {
      run_adam_case(dtype, {n}, adam, seed++);
      run_adam_case(dtype, {n}, AdamOptions{.lr = 0.001}, seed++);  // torch's defaults
      run_adam_case(dtype, {n}, adamw, seed++);
    }
    run_adam_case(dtype, {3, 7}, adamw, seed++);
  }
}

TEST_CASE("steps over many elements (the multi-threaded loop) match the reference", "[optimizer]") {
  const int64_t n = (int64_t{1} << 16) + 3;
  run_sgd_case(kFloat32, {n}, {.lr = 0.1, .momentum = 0.9}, 7);
  run_adam_case(kFloat32, {n}, AdamWOptions{}, 8);
  run_adam_case(kBFloat16, {n}, AdamOptions{.weight_decay = 0.01}, 9);
}

TEST_CASE("optimizer steps are exact when every quantity is a power of two", "[optimizer]") {
  for (DType dtype : kParamDTypes) {
    INFO("param dtype " << dtype_name(dtype));
    const DType state = optimizer_state_dtype(dtype);
    // SGD, two steps: b = g = 0.5, p = 1 - 0.5 * 0.5 = 0.75; then b = 0.5 * 0.5 + 0.5 = 0.75,
    // and p loses lr * b = 0.5 * 0.75, leaving 0.375.
    Tensor p = ones({3}, dtype), buffer = zeros({3}, state), g = full({3}, 0.5, dtype);
    const SgdOptions sgd{.lr = 0.5, .momentum = 0.5};
    sgd_step_(p, g, buffer, 1, sgd);
    check_equal(p, Shape{3}, {0.75, 0.75, 0.75}, "sgd step 1");
    sgd_step_(p, g, buffer, 2, sgd);
    check_equal(p, Shape{3}, {0.375, 0.375, 0.375}, "sgd step 2");
    check_equal(buffer, Shape{3}, {0.75, 0.75, 0.75}, "sgd buffer");
    // Adam, step 1 with eps 0: m_hat = g and v_hat = g^2, so p -= lr * sign(g).
    const AdamOptions adam{.lr = 0.25, .beta1 = 0.5, .beta2 = 0.75, .eps = 0.0};
    Tensor q = Tensor::from_vector<double>({1, -2, 0.5, 4}).to(dtype);
    Tensor m = zeros({4}, state), v = zeros({4}, state);
    adam_step_(q, Tensor::from_vector<double>({0.5, -2, 0.125, -0.25}).to(dtype), m, v, 1, adam);
    check_equal(q, Shape{4}, {0.75, -1.75, 0.25, 4.25}, "adam step 1");
    check_equal(m, Shape{4}, {0.25, -1, 0.0625, -0.125}, "adam exp_avg");
    check_equal(v, Shape{4}, {0.0625, 1, 0.00390625, 0.015625}, "adam exp_avg_sq");
    // AdamW: p *= 1 - 0.25 * 0.5 = 0.875 first, then the same -lr * sign(g).
    Tensor r = Tensor::from_vector<double>({1, -2, 0.5, 4}).to(dtype);
    m = zeros({4}, state);
    v = zeros({4}, state);
    adamw_step_(r, Tensor::from_vector<double>({0.5, -2, 0.125, -0.25}).to(dtype), m, v, 1,
                {.lr = 0.25, .beta1 = 0.5, .beta2 = 0.75, .eps = 0.0, .weight_decay = 0.5});
    check_equal(r, Shape{4}, {0.625, -1.5, 0.1875, 3.75}, "adamw step 1");
  }
}

// Parameters of mixed dtypes and sizes with their state, and bitwise copies of them.
struct StepList {
  std::vector<StepTensors> tensors;

  StepList(int states, uint64_t seed) {
    const DType dtypes[] = {kFloat32, kBFloat16, kFloat64};
    const int64_t sizes[] = {1, 7, 40000, 3};
    for (int k = 0; k < 4; ++k) {
      const DType d = dtypes[k % 3];
      const DType s = optimizer_state_dtype(d);
      StepTensors t{.param = random_tensor({sizes[k]}, d, seed + k),
                    .grad = random_tensor({sizes[k]}, d, seed + 10 + k)};
      for (int j = 0; j < states; ++j) t.state[j] = random_tensor({sizes[k]}, s, seed + 20 + 3 * k + j, 0, 1);
      tensors.push_back(t);
    }
  }
  StepList(const StepList& other) {
    for (const StepTensors& t : other.tensors) {
      StepTensors c{.param = t.param.clone(), .grad = t.grad};
      for (int j = 0; j < 3; ++j) c.state[j] = t.state[j].defined() ? t.state[j].clone() : Tensor();
      tensors.push_back(c);
    }
  }
};

// The list form ends each parameter exactly where its single-tensor step does.
void check_list_matches_single(const StepList& list, const StepList& single, const std::string& what) {
  for (size_t k = 0; k < list.tensors.size(); ++k) {
    const std::string at = fmt::format("{} parameter {}", what, k);
    check_equal(list.tensors[k].param, single.tensors[k].param, at);
    for (int j = 0; j < 3; ++j) {
      if (list.tensors[k].state[j].defined()) {
        check_equal(list.tensors[k].state[j], single.tensors[k].state[j], at + fmt::format(" state {}", j));
      }
    }
  }
}

TEST_CASE("the multi-tensor steps equal the single-tensor steps of each parameter", "[optimizer]") {
  for (int64_t t = 1; t <= 2; ++t) {
    {
      StepList list(1, 1), single(list);
      const SgdOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
      sgd_step_(list.tensors, t, o);
      for (StepTensors& s : single.tensors) sgd_step_(s.param, s.grad, s.state[0], t, o);
      check_list_matches_single(list, single, fmt::format("sgd step {}", t));
    }
    {
      StepList list(3, 2), single(list);
      const AdamOptions o{.lr = 1e-2, .weight_decay = 0.1};
      adam_step_(list.tensors, t, o);
      for (StepTensors& s : single.tensors) adam_step_(s.param, s.grad, s.state[0], s.state[1], t, o, &s.state[2]);
      check_list_matches_single(list, single, fmt::format("adam amsgrad step {}", t));
    }
    {
      StepList list(2, 3), single(list);
      const AdamWOptions o{.lr = 1e-2, .weight_decay = 0.1};
      adamw_step_(list.tensors, t, o);
      for (StepTensors& s : single.tensors) adamw_step_(s.param, s.grad, s.state[0], s.state[1], t, o);
      check_list_matches_single(list, single, fmt::format("adamw step {}", t));
    }
  }
  // A bad parameter anywhere in the list is named, and no parameter is updated.
  StepList list(2, 4);
  const Tensor before = list.tensors[0].param.clone();
  list.tensors[2].grad = zeros({5}, list.tensors[2].param.dtype());
  CHECK_THROWS_WITH(adamw_step_(list.tensors, 1, {}),
                    Catch::Contains("adamw_step_: grad is float64[5] but param is float64[40000]"));
  check_equal(list.tensors[0].param, before, "a rejected list leaves every parameter untouched");
}

TEST_CASE("optimizer steps reject bad tensors and options with typed errors", "[optimizer][errors]") {
  Tensor p = zeros({3}), m = zeros({3}), v = zeros({3});
  Tensor none;
  CHECK_THROWS_AS(adamw_step_(p, zeros({4}), m, v, 1, {}), ValueError);
  CHECK_THROWS_WITH(adamw_step_(p, zeros({4}), m, v, 1, {}),
                    Catch::Contains("adamw_step_: grad is float32[4] but param is float32[3]"));
  CHECK_THROWS_AS(adam_step_(p, zeros({3}, kFloat64), m, v, 1, {}), TypeError);
  CHECK_THROWS_WITH(adam_step_(p, zeros({3}, kFloat64), m, v, 1, {}), Catch::Contains("grad needs param's dtype"));
  Tensor half = zeros({3}, kFloat16);
  CHECK_THROWS_AS(sgd_step_(half, zeros({3}, kFloat16), none, 1, {}), TypeError);
  CHECK_THROWS_WITH(sgd_step_(half, zeros({3}, kFloat16), none, 1, {}),
                    Catch::Contains("float16 parameters are not supported") && Catch::Contains("bfloat16"));
  Tensor bf = zeros({3}, kBFloat16), bf_state = zeros({3}, kBFloat16);
  CHECK_THROWS_AS(adam_step_(bf, zeros({3}, kBFloat16), bf_state, bf_state, 1, {}), TypeError);
  CHECK_THROWS_WITH(adam_step_(bf, zeros({3}, kBFloat16), bf_state, bf_state, 1, {}),
                    Catch::Contains("exp_avg is bfloat16[3]; the state of a bfloat16 parameter is float32"));
  Tensor strided = zeros({6}).slice(0, 0, 6, 2);
  CHECK_THROWS_WITH(adam_step_(strided, zeros({3}), m, v, 1, {}),
                    Catch::Contains("param (float32[3], strides [2]) is not contiguous"));
  CHECK_THROWS_WITH(adam_step_(p, zeros({3}), m, v, 0, {}), Catch::Contains("step 0 is invalid"));
  CHECK_THROWS_WITH(adam_step_(p, zeros({3}), m, v, 1, {.beta1 = 1.0}), Catch::Contains("invalid beta1 1"));
  CHECK_THROWS_WITH(adamw_step_(p, zeros({3}), m, v, 1, {.lr = -1}), Catch::Contains("invalid lr -1"));
  CHECK_THROWS_WITH(sgd_step_(p, zeros({3}), m, 1, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                    Catch::Contains("nesterov needs momentum > 0 and dampening 0"));
  CHECK_THROWS_WITH(sgd_step_(p, zeros({3}), none, 1, {.lr = 0.1, .momentum = 0.9}),
                    Catch::Contains("momentum_buffer must be defined"));
  CHECK_THROWS_AS(optimizer_state_dtype(kInt64), TypeError);
  check_equal(p, Shape{3}, {0, 0, 0}, "rejected steps leave param untouched");
}

}  // namespace
}  // namespace dtr
