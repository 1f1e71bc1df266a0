#include "nn/init.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "kernels/fill.h"
#include "kernels/random.h"

namespace dtr::nn {
namespace {

uint64_t g_seed = 0;
uint64_t g_draws = 0;

// splitmix64: well-spread seeds from consecutive counters.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The local tensor of p, with the layout that puts it in the global tensor.
Tensor local_of(const DTensor& p, ShardLayout* layout) {
  *layout = ShardLayout{p.shape(), p.spec().local_chunk().offset};
  return p.to_local();  // a handle: writing it writes the parameter's storage
}

// erf^-1 on (-1, 1): Giles' single-precision approximation refined by two Newton steps.
double erfinv(double y) {
  if (y <= -1) return -INFINITY;
  if (y >= 1) return INFINITY;
  double w = -std::log((1.0 - y) * (1.0 + y)), x;
  if (w < 5.0) {
    w -= 2.5;
    x = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164,
                     0.246640727, 1.50140941}) {
      x = c + x * w;
    }
  } else {
    w = std::sqrt(w) - 3.0;
    x = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
                     1.00167406, 2.83297682}) {
      x = c + x * w;
    }
  }
  x *= y;
  for (int i = 0; i < 2; ++i) x -= (std::erf(x) - y) / (2.0 / std::sqrt(std::numbers::pi) * std::exp(-x * x));
  return x;
}

}  // namespace

void manual_seed(uint64_t seed) {
  g_seed = seed;
  g_draws = 0;
}

uint64_t next_seed() { return mix(g_seed * 0x100000001B3ull + g_draws++); }

SeedState seed_state() { return {.seed = g_seed, .draws = g_draws}; }

void set_seed_state(const SeedState& state) {
  g_seed = state.seed;
  g_draws = state.draws;
}

void uniform_(DTensor& p, double lo, double hi) {
  ShardLayout layout;
  Tensor t = local_of(p, &layout);
  dtr::uniform_(t, lo, hi, next_seed(), layout);
}

void normal_(DTensor& p, double mean, double std) {
  ShardLayout layout;
  Tensor t = local_of(p, &layout);
  dtr::normal_(t, mean, std, next_seed(), layout);
}

void constant_(DTensor& p, double value) {
  Tensor t = p.to_local();
  fill_(t, value);
}

void zeros_(DTensor& p) { constant_(p, 0.0); }
void ones_(DTensor& p) { constant_(p, 1.0); }

void trunc_normal_(DTensor& p, double mean, double std, double a, double b) {
  DTR_CHECK(std > 0 && a < b, ValueError, "trunc_normal_: std {} must be > 0 and a {} < b {}", std, a, b);
  const auto cdf = [](double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; };
  const double l = cdf((a - mean) / std), u = cdf((b - mean) / std);
  ShardLayout layout;
  Tensor t = local_of(p, &layout);
  Tensor draw = Tensor::empty(t.shape(), kFloat64, kCPU);
  dtr::uniform_(draw, 2 * l - 1, 2 * u - 1, next_seed(), layout);
  double* v = draw.data_ptr<double>();
  for (int64_t i = 0; i < draw.numel(); ++i) {
    v[i] = std::clamp(mean + std * std::sqrt(2.0) * erfinv(v[i]), a, b);
  }
  t.copy_(draw.to(t.dtype()).to(t.device()));
}

int64_t fan(const DTensor& p, FanMode mode, std::string_view op) {
  DTR_CHECK(p.dim() >= 2, ValueError, "{}: fan in and fan out need a tensor of 2+ dims, got shape {}", op, p.shape());
  int64_t receptive = 1;
  for (int64_t d = 2; d < p.dim(); ++d) receptive *= p.size(d);
  return (mode == FanMode::kFanIn ? p.size(1) : p.size(0)) * receptive;
}

void xavier_uniform_(DTensor& p, double gain) {
  const double fans = static_cast<double>(fan(p, FanMode::kFanIn, "xavier_uniform_") + fan(p, FanMode::kFanOut, ""));
  const double bound = gain * std::sqrt(6.0 / fans);
  uniform_(p, -bound, bound);
}

void kaiming_uniform_(DTensor& p, double a, FanMode mode) {
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double bound = std::sqrt(3.0) * gain / std::sqrt(static_cast<double>(fan(p, mode, "kaiming_uniform_")));
  uniform_(p, -bound, bound);
}

}  // namespace dtr::nn
