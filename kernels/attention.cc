#include "kernels/attention.h"

#include <cmath>

#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/fill.h"

namespace dtr {
namespace {

// The checked sizes of one call: q [lead..., tq, e], k [lead..., tk, e], v [lead..., tk, ev].
struct Dims {
  Shape lead;
  int64_t batch = 1, tq = 0, tk = 0, e = 0, ev = 0;

  Shape with(std::initializer_list<int64_t> tail) const {
    Shape s = lead;
    s.insert(s.end(), tail);
    return s;
  }
};

Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

Dims check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, double scale, int64_t query_offset,
                  std::string_view op) {
  DTR_CHECK(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(), TypeError,
            "{}: q {}, k {}, v {} must share one floating dtype (float32, float64, bfloat16 or float16)", op,
            describe(q), describe(k), describe(v));
  DTR_CHECK(k.device() == q.device() && v.device() == q.device(), ValueError,
            "{}: q {} on {}, k {} on {} and v {} on {} must be on one device", op, describe(q), q.device(), describe(k),
            k.device(), describe(v), v.device());
  const bool fits = q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim() && leading(k) == leading(q) &&
                    leading(v) == leading(q) && k.size(-1) == q.size(-1) && v.size(-2) == k.size(-2);
  DTR_CHECK(fits, ValueError,
            "{}: q {}, k {}, v {} do not fit; legal: q [*, Tq, E], k [*, Tk, E], v [*, Tk, Ev] with the same "
            "leading dims *",
            op, describe(q), describe(k), describe(v));
  Dims d{.lead = leading(q), .tq = q.size(-2), .tk = k.size(-2), .e = q.size(-1), .ev = v.size(-1)};
  for (int64_t s : d.lead) d.batch *= s;
  DTR_CHECK(d.tk >= 1, ValueError, "{}: k {} and v {} hold no keys (Tk = 0): every query row must see a key", op,
            describe(k), describe(v));
  DTR_CHECK(d.e >= 1 && d.ev >= 1, ValueError, "{}: head dims E = {} (q {}) and Ev = {} (v {}) must be >= 1", op, d.e,
            describe(q), d.ev, describe(v));
  DTR_CHECK(std::isfinite(scale), ValueError, "{}: scale {} must be finite", op, scale);
  DTR_CHECK(query_offset >= 0, ValueError,
            "{}: query_offset {} must be >= 0 (the global index of q's first row among the keys)", op, query_offset);
  if (q.device().type == kCUDA) {
    DTR_CHECK(d.e <= cuda::kAttentionMaxHeadDim && d.ev <= cuda::kAttentionMaxHeadDim, NotImplementedError,
              "{}: head dims E = {} (q {}) and Ev = {} (v {}) exceed the CUDA kernels' {}; split the heads or run "
              "on the CPU",
              op, d.e, describe(q), d.ev, describe(v), cuda::kAttentionMaxHeadDim);
  }
  return d;
}

cuda::AttentionProblem cuda_problem(const Dims& d, Causal causal, double scale, int64_t query_offset) {
  return {.batch = d.batch,
          .tq = d.tq,
          .tk = d.tk,
          .e = d.e,
          .ev = d.ev,
          .query_offset = query_offset,
          .causal = causal,
          .scale = scale};
}

// Scratch of n statistics values (float; double for float64) on device: undefined for none.
Tensor scratch_of(int64_t n, DType dtype, Device device) {
  return n == 0 ? Tensor() : Tensor::empty({n}, acc_dtype(dtype), device);
}

void* data_or_null(const Tensor& t) { return t.defined() ? t.data() : nullptr; }

}  // namespace

AttentionOutput attention(const Tensor& q, const Tensor& k, const Tensor& v, Causal causal, double scale,
                          int64_t query_offset, AttentionImpl impl) {
  const Dims d = check_inputs(q, k, v, scale, query_offset, "attention");
  AttentionOutput r{.out = Tensor::empty(d.with({d.tq, d.ev}), q.dtype(), q.device()),
                    .lse = Tensor::empty(d.with({d.tq}), acc_dtype(q.dtype()), q.device())};
  if (d.batch * d.tq == 0) return r;
  const trace::Span span("attention", trace::Category::kKernel);
  switch (q.device().type) {
    case kCPU:
      cpu::attention(r.out.view({d.batch, d.tq, d.ev}), r.lse.view({d.batch, d.tq}), q, k, v, causal, scale,
                     query_offset);
      return r;
    case kCUDA: {
      const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
      const cuda::AttentionProblem p = cuda_problem(d, causal, scale, query_offset);
      const Tensor scratch = scratch_of(cuda::attention_scratch_numel(p, impl), q.dtype(), q.device());
      const int device = q.device().index;
      cuda::attention(r.out.data(), r.lse.data(), qc.data(), kc.data(), vc.data(), data_or_null(scratch), p, impl,
                      q.dtype(), device, cuda::current_stream(device).handle());
      return r;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, Causal causal, double scale,
                                  int64_t query_offset, AttentionImpl impl) {
  constexpr std::string_view op = "attention_backward";
  const Dims d = check_inputs(q, k, v, scale, query_offset, op);
  const Shape out_shape = d.with({d.tq, d.ev}), lse_shape = d.with({d.tq});
  auto check_like_out = [&](const Tensor& t, std::string_view name) {
    DTR_CHECK(t.shape() == out_shape && t.dtype() == q.dtype() && t.device() == q.device(), ValueError,
              "{}: {} {} on {} must be {}{} on {}, the forward's output for q {}, v {}", op, name, describe(t),
              t.device(), q.dtype(), out_shape, q.device(), describe(q), describe(v));
  };
  check_like_out(grad_out, "grad_out");
  check_like_out(out, "out");
  const DType lse_dtype = acc_dtype(q.dtype());
  DTR_CHECK(lse.shape() == lse_shape && lse.dtype() == lse_dtype && lse.device() == q.device(), ValueError,
            "{}: lse {} on {} must be the forward's saved {}{} on {} for q {}", op, describe(lse), lse.device(),
            lse_dtype, lse_shape, q.device(), describe(q));
  AttentionGrads g{.grad_q = Tensor::empty(q.shape(), q.dtype(), q.device()),
                   .grad_k = Tensor::empty(k.shape(), q.dtype(), q.device()),
                   .grad_v = Tensor::empty(v.shape(), q.dtype(), q.device())};
  if (d.batch == 0) return g;
  if (d.tq == 0) {  // no query sees any key
    fill_(g.grad_k, 0.0);
    fill_(g.grad_v, 0.0);
    return g;
  }
  const trace::Span span(op, trace::Category::kKernel);
  switch (q.device().type) {
    case kCPU:
      cpu::attention_backward(g.grad_q.view({d.batch, d.tq, d.e}), g.grad_k.view({d.batch, d.tk, d.e}),
                              g.grad_v.view({d.batch, d.tk, d.ev}), grad_out, q, k, v, out,
                              lse.reshape({d.batch, d.tq}), causal, scale, query_offset);
      return g;
    case kCUDA: {
      const Tensor gc = grad_out.contiguous(), qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(),
                   oc = out.contiguous(), lc = lse.contiguous();
      const cuda::AttentionProblem p = cuda_problem(d, causal, scale, query_offset);
      const Tensor scratch = scratch_of(cuda::attention_backward_scratch_numel(p, impl), q.dtype(), q.device());
      const int device = q.device().index;
      cuda::attention_backward(g.grad_q.data(), g.grad_k.data(), g.grad_v.data(), gc.data(), qc.data(), kc.data(),
                               vc.data(), oc.data(), lc.data(), data_or_null(scratch), p, impl, q.dtype(), device,
                               cuda::current_stream(device).handle());
      return g;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
