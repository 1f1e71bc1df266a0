// The CUDA attention kernels (kernels/cuda/attention.h), fused and reference, against the CPU
// kernel on the same inputs: forward (out, lse) and backward (given the CPU forward's out and
// lse, so that each is checked alone), bfloat16/float16/float32 at E in {32, 64, 128} and
// sequence lengths 1, 7, 127, 128, 129, 1023, causal or not, leading dims [2, 4]; shards of
// query rows (query_offset), E != Ev and head dims off the 16-wide tiles up to 256, float64,
// non-contiguous inputs, large logits; an exact case bit for bit; bitwise run-to-run
// determinism; the errors on CUDA. Tagged gpu (Bazel) and [gpu] (Catch2).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/attention.h"
#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::check_equal;
using testing::random_normal;
using testing::to_f64;
using testing::Tolerance;

const Device kGpu(kCUDA, 0);

Shape concat(Shape lead, std::initializer_list<int64_t> tail) {
  lead.insert(lead.end(), tail);
  return lead;
}

Tolerance scaled(Tolerance t, double factor) { return {t.atol * factor, t.rtol * factor}; }

// The fused 16-bit forward rounds P to the input type before P v (on tensor cores): twice the
// dtype's tolerance. Gradients and float32 stay within twice it too (sums in another order).
Tolerance out_tolerance(DType d) { return scaled(testing::tolerance_for(d), 2); }
Tolerance lse_tolerance(DType d) { return scaled(testing::tolerance_for(acc_dtype(d)), 2); }
Tolerance grad_tolerance(DType d) { return scaled(testing::tolerance_for(d), 2); }

const char* impl_name(AttentionImpl impl) { return impl == AttentionImpl::kFused ? "fused" : "reference"; }

struct Case {
  Shape lead;
  int64_t tq, tk, e, ev;
  Causal causal;
  int64_t offset = 0;
  double scale = 0;  // 0: 1 / sqrt(e)
};

// Both CUDA paths against the CPU kernel, forward and backward, for inputs q, k, v, g.
void compare(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g) {
  const DType d = q.dtype();
  const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.e));
  const std::string what = fmt::format("{} lead {} Tq {} Tk {} E {} Ev {} causal {} offset {} scale {}", dtype_name(d),
                                       c.lead, c.tq, c.tk, c.e, c.ev, c.causal == Causal::kYes, c.offset, scale);
  const AttentionOutput cpu = attention(q.contiguous(), k.contiguous(), v.contiguous(), c.causal, scale, c.offset);
  const AttentionGrads cpu_grads = attention_backward(g.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(),
                                                      cpu.out, cpu.lse, c.causal, scale, c.offset);
  const Tensor gq = q.to(kGpu), gk = k.to(kGpu), gv = v.to(kGpu), gg = g.to(kGpu);
  for (AttentionImpl impl : {AttentionImpl::kFused, AttentionImpl::kReference}) {
    const std::string tag = std::string(impl_name(impl)) + " " + what;
    const AttentionOutput r = attention(gq, gk, gv, c.causal, scale, c.offset, impl);
    CHECK(r.out.device() == kGpu);
    CHECK(r.lse.dtype() == acc_dtype(d));
    check_close(r.out, cpu.out, out_tolerance(d), "out " + tag);
    check_close(r.lse, cpu.lse, lse_tolerance(d), "lse " + tag);
    const AttentionGrads gr =
        attention_backward(gg, gq, gk, gv, cpu.out.to(kGpu), cpu.lse.to(kGpu), c.causal, scale, c.offset, impl);
    check_close(gr.grad_q, cpu_grads.grad_q, grad_tolerance(d), "grad_q " + tag);
    check_close(gr.grad_k, cpu_grads.grad_k, grad_tolerance(d), "grad_k " + tag);
    check_close(gr.grad_v, cpu_grads.grad_v, grad_tolerance(d), "grad_v " + tag);
  }
}

void compare(const Case& c, DType d, uint64_t seed) {
  compare(c, random_normal(concat(c.lead, {c.tq, c.e}), d, seed),
          random_normal(concat(c.lead, {c.tk, c.e}), d, seed + 1),
          random_normal(concat(c.lead, {c.tk, c.ev}), d, seed + 2),
          random_normal(concat(c.lead, {c.tq, c.ev}), d, seed + 3));
}

// The CPU reference is the slow part: use every core.
struct AllCores {
  testing::ThreadCountGuard guard;
  AllCores() { set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))); }
};

constexpr DType kGpuDTypes[] = {kBFloat16, kFloat16, kFloat32};

TEST_CASE("CUDA attention, fused and reference, matches the CPU over lengths and head dims", "[gpu]") {
  const AllCores cores;
  uint64_t seed = 1;
  for (DType d : kGpuDTypes) {
    for (int64_t e : {32, 64, 128}) {
      for (int64_t t : {1, 7, 127, 128, 129, 1023}) {
        for (Causal causal : {Causal::kNo, Causal::kYes}) {
          const Shape lead = t <= 129 ? Shape{2, 4} : Shape{};
          compare({lead, t, t, e, e, causal}, d, seed += 4);
        }
      }
    }
  }
}

TEST_CASE("CUDA attention on query shards, uneven head dims, float64 and large logits", "[gpu]") {
  const AllCores cores;
  const std::vector<Case> shards = {
      {{2, 4}, 64, 200, 64, 64, Causal::kYes, 136},  // the last 64 query rows of 200
      {{}, 129, 1023, 64, 64, Causal::kYes, 500},    // a middle shard
      {{2}, 30, 40, 32, 32, Causal::kYes, 25},       // rows past the keys see them all
      {{2, 4}, 100, 37, 32, 32, Causal::kNo, 0},     // Tq > Tk
      {{2}, 65, 130, 64, 128, Causal::kNo, 0},       // E != Ev
      {{2}, 65, 130, 128, 64, Causal::kYes, 0},
      {{}, 129, 129, 256, 256, Causal::kYes, 0},  // the largest head dims
      {{2}, 50, 70, 80, 40, Causal::kNo, 0},      // head dims off the 16-wide tiles
      {{2}, 50, 70, 7, 200, Causal::kYes, 20},
      {{}, 33, 300, 200, 24, Causal::kNo, 0},
      {{2}, 40, 90, 64, 64, Causal::kYes, 50, 40.0},  // scores of several hundred
  };
  uint64_t seed = 1000;
  for (DType d : kGpuDTypes) {
    for (const Case& c : shards) compare(c, d, seed += 4);
  }
  for (const Case& c : std::vector<Case>{{{2}, 129, 129, 64, 64, Causal::kYes},
                                         {{}, 70, 200, 256, 100, Causal::kYes, 130},
                                         {{2}, 17, 33, 24, 8, Causal::kNo}}) {
    compare(c, kFloat64, seed += 4);
  }
}

TEST_CASE("CUDA attention takes non-contiguous inputs", "[gpu]") {
  const AllCores cores;
  for (DType d : kGpuDTypes) {
    const Shape lead{2, 4};
    const Case c{lead, 77, 150, 64, 32, Causal::kYes, 73};
    const Tensor q = random_normal(concat(lead, {64, 77}), d, 21).transpose(-1, -2);
    const Tensor k = testing::strided_copy(random_normal(concat(lead, {150, 64}), d, 22));
    const Tensor v = testing::strided_copy(random_normal(concat(lead, {150, 32}), d, 23));
    const Tensor g = random_normal(concat(lead, {77, 32}), d, 24);
    compare(c, q, k, v, g);
    // The same views, already on the GPU.
    const Tensor gq = random_normal(concat(lead, {64, 77}), d, 21).to(kGpu).transpose(-1, -2);
    const Tensor gk = testing::strided_copy(k.to(kGpu));
    REQUIRE_FALSE(gq.is_contiguous());
    REQUIRE_FALSE(gk.is_contiguous());
    const AttentionOutput r = attention(gq, gk, v.to(kGpu), Causal::kYes, 0.125, 73);
    const AttentionOutput rc = attention(gq.contiguous(), gk.contiguous(), v.to(kGpu), Causal::kYes, 0.125, 73);
    check_equal(r.out, rc.out, fmt::format("{} non-contiguous views on the GPU", dtype_name(d)));
  }
}

TEST_CASE("CUDA attention with equal scores averages the visible values exactly", "[gpu]") {
  // q = 0: P is exactly 1 for every visible key (also rounded to 16 bits), so out_i is the
  // mean of v_0 .. v_{n-1}, n = min(Tk, offset + i + 1), here (n - 1) / 2 and n - 1.
  const int64_t tq = 70, tk = 90, offset = 3;
  std::vector<double> values;
  for (int64_t j = 0; j < tk; ++j) values.insert(values.end(), {static_cast<double>(j) / 8, j / 4.0});
  for (DType d : testing::kFloatDTypes) {
    const Tensor q = zeros({tq, 16}, d, kGpu), k = random_normal({tk, 16}, d, 3).to(kGpu);
    const Tensor v = Tensor::from_vector(values, {tk, 2}).to(d).to(kGpu);
    std::vector<double> out;
    for (int64_t i = 0; i < tq; ++i) {
      const double n = static_cast<double>(std::min(tk, offset + i + 1));
      out.insert(out.end(), {(n - 1) / 16, (n - 1) / 8});
    }
    for (AttentionImpl impl : {AttentionImpl::kFused, AttentionImpl::kReference}) {
      check_equal(attention(q, k, v, Causal::kYes, 0.5, offset, impl).out, Shape{tq, 2}, out,
                  fmt::format("{} {} equal scores", impl_name(impl), dtype_name(d)));
    }
  }
}

TEST_CASE("CUDA attention and its backward are bitwise the same run to run", "[gpu]") {
  for (DType d : kGpuDTypes) {
    const Tensor q = random_normal({2, 4, 600, 64}, d, 31).to(kGpu), k = random_normal({2, 4, 700, 64}, d, 32).to(kGpu),
                 v = random_normal({2, 4, 700, 64}, d, 33).to(kGpu), g = random_normal({2, 4, 600, 64}, d, 34).to(kGpu);
    for (Causal causal : {Causal::kNo, Causal::kYes}) {
      auto run = [&] {
        const AttentionOutput r = attention(q, k, v, causal, 0.125, 100);
        const AttentionGrads gr = attention_backward(g, q, k, v, r.out, r.lse, causal, 0.125, 100);
        return std::vector<std::vector<double>>{to_f64(r.out), to_f64(r.lse), to_f64(gr.grad_q), to_f64(gr.grad_k),
                                                to_f64(gr.grad_v)};
      };
      const auto first = run(), second = run();
      const char* names[] = {"out", "lse", "grad_q", "grad_k", "grad_v"};
      for (size_t i = 0; i < first.size(); ++i) {
        INFO(dtype_name(d) << " causal " << (causal == Causal::kYes) << " " << names[i]);
        CHECK(first[i] == second[i]);
      }
    }
  }
}

TEST_CASE("CUDA attention rejects mixed devices and head dims past 256", "[gpu]") {
  using Catch::Contains;
  const Tensor q = random_normal({2, 4, 8}, kFloat32, 1).to(kGpu), k = random_normal({2, 5, 8}, kFloat32, 2).to(kGpu),
               v = random_normal({2, 5, 3}, kFloat32, 3).to(kGpu);
  CHECK_THROWS_AS(attention(q, k.to(kCPU), v, Causal::kNo, 1.0), ValueError);
  CHECK_THROWS_WITH(attention(q, k.to(kCPU), v, Causal::kNo, 1.0),
                    Contains("attention") && Contains("cuda:0") && Contains("must be on one device"));
  CHECK_THROWS_AS(attention(Tensor::empty({1, 4, 300}, kFloat32, kGpu), Tensor::empty({1, 4, 300}, kFloat32, kGpu),
                            Tensor::empty({1, 4, 8}, kFloat32, kGpu), Causal::kNo, 1.0),
                  NotImplementedError);
  CHECK_THROWS_WITH(attention(q, k, Tensor::empty({2, 5, 257}, kFloat32, kGpu), Causal::kNo, 1.0),
                    Contains("Ev = 257") && Contains("256"));
  const AttentionOutput r = attention(q, k, v, Causal::kNo, 1.0);
  CHECK_THROWS_AS(attention_backward(r.out, q, k, v, r.out, r.lse.to(kCPU), Causal::kNo, 1.0), ValueError);
  CHECK_THROWS_WITH(attention_backward(r.out.to(kCPU), q, k, v, r.out, r.lse, Causal::kNo, 1.0),
                    Contains("attention_backward: grad_out") && Contains("cpu"));
}

}  // namespace
}  // namespace dtr
