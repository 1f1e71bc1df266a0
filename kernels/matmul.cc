#include "kernels/matmul.h"

#include <algorithm>
#include <atomic>

#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/matmul.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"

namespace dtr {
namespace {

// Checks what matmul and bmm share: floating operands of one dtype on one device.
void check_operands(const Tensor& a, const Tensor& b, std::string_view op) {
  DTR_CHECK(a.dtype() == b.dtype(), TypeError, "{}: operands {} and {} differ in dtype; convert one with .to()", op,
            describe(a), describe(b));
  DTR_CHECK(is_floating(a.dtype()), TypeError,
            "{}: operands {} and {} are not floating; {} takes float32, float64, bfloat16 or float16", op, describe(a),
            describe(b), op);
  DTR_CHECK(a.device() == b.device(), ValueError, "{}: operands {} and {} are on different devices", op, describe(a),
            describe(b));
}

void check_matmul(const Tensor& a, const Tensor& b) {
  DTR_CHECK(a.dim() == 2 && b.dim() == 2, ValueError,
            "matmul: operands {} and {} must both be 2-D ([M, K] x [K, N]); use bmm for batches", describe(a),
            describe(b));
  DTR_CHECK(a.size(1) == b.size(0), ValueError, "matmul: shapes {} and {} cannot be multiplied ({} columns vs {} rows)",
            a.shape(), b.shape(), a.size(1), b.size(0));
  check_operands(a, b, "matmul");
}

void check_bmm(const Tensor& a, const Tensor& b) {
  DTR_CHECK(a.dim() == 3 && b.dim() == 3, ValueError,
            "bmm: operands {} and {} must both be 3-D ([B, M, K] x [B, K, N]); use matmul for 2-D", describe(a),
            describe(b));
  DTR_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), ValueError,
            "bmm: shapes {} and {} cannot be multiplied (need equal batch sizes and {} columns == {} rows)", a.shape(),
            b.shape(), a.size(2), b.size(1));
  check_operands(a, b, "bmm");
}

// out must be able to take the product of a and b (already checked) in place.
void check_out(const Tensor& out, const Tensor& a, const Tensor& b, const Shape& shape, std::string_view op) {
  DTR_CHECK(out.shape() == shape && out.is_contiguous(), ValueError,
            "{}: out {} must be a contiguous {} tensor for {} x {}", op, describe(out), shape, describe(a),
            describe(b));
  DTR_CHECK(out.dtype() == a.dtype() && out.device() == a.device(), TypeError,
            "{}: out {} must have the operands' dtype and device ({})", op, describe(out), describe(a));
  DTR_CHECK(!out.storage().is_same(a.storage()) && !out.storage().is_same(b.storage()), ValueError,
            "{}: out {} shares storage with an operand; write the product to a separate tensor", op, describe(out));
}

std::atomic<bool> g_allow_tf32{false};

// x [B, R, C] as cuBLASLt reads it: a row-major view (column stride 1) or a transposed one
// (row stride 1) as it is; any other layout copied contiguous into `keep` first.
cuda::MatrixOperand cuda_operand(const Tensor& x, Tensor& keep) {
  const int64_t rows = x.size(1), cols = x.size(2);
  cuda::MatrixOperand o{.data = x.data(), .row_stride = 0, .col_stride = 0, .batch_stride = x.stride(0)};
  // A dim of size 1 has no meaningful stride: take the one that makes the view dense.
  const int64_t row_stride = rows <= 1 ? std::max<int64_t>(cols, 1) : x.stride(1);
  const int64_t col_stride = cols <= 1 ? std::max<int64_t>(rows, 1) : x.stride(2);
  if ((x.stride(2) == 1 || cols <= 1) && row_stride >= cols) {
    o.row_stride = row_stride;
    o.col_stride = 1;
  } else if ((x.stride(1) == 1 || rows <= 1) && col_stride >= rows) {
    o.row_stride = 1;
    o.col_stride = col_stride;
  } else {
    keep = x.contiguous();
    o = {.data = keep.data(), .row_stride = std::max<int64_t>(cols, 1), .col_stride = 1, .batch_stride = rows * cols};
  }
  return o;
}

void cuda_bmm(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (a.size(2) == 0) {  // an empty sum: zeros
    Tensor o = out;
    fill_(o, 0.0);
    return;
  }
  Tensor keep_a, keep_b;
  const cuda::MatrixOperand ma = cuda_operand(a, keep_a), mb = cuda_operand(b, keep_b);
  const int device = out.device().index;
  // Scratch from the caching allocator: freed at once, reused only by later work on this stream.
  const Tensor workspace = Tensor::empty({static_cast<int64_t>(cuda::kMatmulWorkspaceBytes / 8)}, kInt64, out.device());
  cuda::bmm(out.data(), ma, mb, a.size(0), a.size(1), b.size(2), a.size(2), a.dtype(),
            {.allow_tf32 = g_allow_tf32.load(std::memory_order_relaxed)}, workspace.data(), cuda::kMatmulWorkspaceBytes,
            device, cuda::current_stream(device).handle());
}

// out [B, M, N] = a [B, M, K] b [B, K, N], on the operands' device.
void dispatch_bmm(const Tensor& out, const Tensor& a, const Tensor& b, std::string_view op) {
  const trace::Span span(op, trace::Category::kKernel);
  switch (a.device().type) {
    case kCPU: cpu::bmm(out, a, b); return;
    case kCUDA: cuda_bmm(out, a, b); return;
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

// a [*, M, K], b [K, N] and bias [N] as matmul_bias takes them.
void check_matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, std::string_view op) {
  DTR_CHECK(a.dim() >= 2 && b.dim() == 2 && bias.dim() == 1 && a.size(-1) == b.size(0) && bias.size(0) == b.size(1),
            ValueError, "{}: operands {} and {} with bias {} do not fit; legal: a [*, M, K], b [K, N], bias [N]", op,
            describe(a), describe(b), describe(bias));
  check_operands(a, b, op);
  DTR_CHECK(bias.dtype() == a.dtype(), TypeError,
            "{}: bias {} differs in dtype from the operands {} and {}; convert one with .to()", op, describe(bias),
            describe(a), describe(b));
  DTR_CHECK(bias.device() == a.device(), ValueError, "{}: bias {} is not on the operands' device {}", op,
            describe(bias), a.device());
}

// out [M, N] = epilogue(a [M, K] b [K, N] + bias) on CUDA: one cuBLASLt call where it has an
// algorithm for the epilogue; otherwise (and for K = 0) the product, then the bias and GELU
// passes, as on the CPU. pre (undefined unless wanted) has rows pre_ld apart.
void cuda_matmul_bias(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b, const Tensor& bias,
                      MatmulEpilogue epilogue, int64_t pre_ld) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (out.numel() == 0) return;
  if (k > 0) {
    Tensor keep_a, keep_b;
    const cuda::MatrixOperand ma = cuda_operand(a.unsqueeze(0), keep_a), mb = cuda_operand(b.unsqueeze(0), keep_b);
    const Tensor bias_c = bias.contiguous();
    const int device = out.device().index;
    const Tensor workspace =
        Tensor::empty({static_cast<int64_t>(cuda::kMatmulWorkspaceBytes / 8)}, kInt64, out.device());
    if (cuda::matmul_bias(out.data(), pre.defined() ? pre.data() : nullptr, ma, mb, bias_c.data(), m, n, k, pre_ld,
                          a.dtype(), epilogue, {.allow_tf32 = g_allow_tf32.load(std::memory_order_relaxed)},
                          workspace.data(), cuda::kMatmulWorkspaceBytes, device,
                          cuda::current_stream(device).handle())) {
      return;
    }
  }
  cuda_bmm(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0));
  Tensor o = out;
  add_(o, bias);
  if (epilogue == MatmulEpilogue::kBias) return;
  if (pre.defined()) Tensor(pre).copy_(out);
  o.copy_(gelu(out, GeluApproximation::kTanh));
}

// Whether run_matmul_bias also returns pre, the GELU's input.
enum class KeepPre : uint8_t { kNo, kYes };

// matmul_bias and matmul_bias_gelu: out [*, M, N], and pre (the GELU's input) if keep_pre.
MatmulBiasGelu run_matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, MatmulEpilogue epilogue,
                               KeepPre keep_pre, std::string_view op) {
  check_matmul_bias(a, b, bias, op);
  const int64_t k = a.size(-1), n = b.size(1);
  const int64_t rows = shape_numel(std::span(a.shape()).first(a.shape().size() - 1));
  const Tensor a2 = a.dim() == 2 ? a : a.reshape({rows, k});
  Shape shape = a.shape();
  shape.back() = n;
  Tensor out = Tensor::empty({rows, n}, a.dtype(), a.device());
  // cuBLASLt writes the GELU's input with rows a multiple of 8 elements apart.
  const int64_t pre_ld = a.device().type == kCUDA ? (n + 7) / 8 * 8 : n;
  Tensor pre_rows;  // [rows, pre_ld]
  if (keep_pre == KeepPre::kYes) pre_rows = Tensor::empty({rows, pre_ld}, a.dtype(), a.device());
  const Tensor pre = keep_pre == KeepPre::kYes ? pre_rows.narrow(1, 0, n) : Tensor();
  {
    const trace::Span span(op, trace::Category::kKernel);
    switch (a.device().type) {
      case kCPU: cpu::matmul_bias(out, pre, a2, b, bias, epilogue); break;
      case kCUDA: cuda_matmul_bias(out, pre, a2, b, bias, epilogue, pre_ld); break;
    }
  }
  MatmulBiasGelu r{.out = out.view(shape), .pre = {}};
  if (keep_pre == KeepPre::kYes) {
    Shape padded = shape;
    padded.back() = pre_ld;
    r.pre = pre_rows.view(padded).narrow(-1, 0, n);
  }
  return r;
}

}  // namespace

Tensor matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, MatmulEpilogue epilogue) {
  return run_matmul_bias(a, b, bias, epilogue, KeepPre::kNo, "matmul_bias").out;
}

MatmulBiasGelu matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias) {
  return run_matmul_bias(a, b, bias, MatmulEpilogue::kBiasGeluTanh, KeepPre::kYes, "matmul_bias_gelu");
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_matmul(a, b);
  Tensor out = Tensor::empty({a.size(0), b.size(1)}, a.dtype(), a.device());
  dispatch_bmm(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), "matmul");
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_bmm(a, b);
  Tensor out = Tensor::empty({a.size(0), a.size(1), b.size(2)}, a.dtype(), a.device());
  dispatch_bmm(out, a, b, "bmm");
  return out;
}

const Tensor& matmul_out(const Tensor& out, const Tensor& a, const Tensor& b) {
  check_matmul(a, b);
  check_out(out, a, b, {a.size(0), b.size(1)}, "matmul_out");
  dispatch_bmm(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), "matmul_out");
  return out;
}

void matmul_accumulate(const Tensor& acc, const Tensor& a, const Tensor& b) {
  check_matmul(a, b);
  const DType want = acc_dtype(a.dtype());  // the product's accumulator
  DTR_CHECK(acc.shape() == Shape({a.size(0), b.size(1)}) && acc.is_contiguous(), ValueError,
            "matmul_accumulate: acc {} must be a contiguous {} tensor for {} x {}", describe(acc),
            Shape({a.size(0), b.size(1)}), describe(a), describe(b));
  DTR_CHECK(acc.dtype() == want && acc.device() == a.device(), TypeError,
            "matmul_accumulate: acc {} must be {} on {}, the accumulator of {} operands", describe(acc), want,
            a.device(), a.dtype());
  DTR_CHECK(!acc.storage().is_same(a.storage()) && !acc.storage().is_same(b.storage()), ValueError,
            "matmul_accumulate: acc {} shares storage with an operand", describe(acc));
  const trace::Span span("matmul_accumulate", trace::Category::kKernel);
  switch (a.device().type) {
    case kCPU: cpu::matmul_accumulate(acc, a, b); return;
    case kCUDA: {
      Tensor c = acc;
      add_(c, matmul(a, b).to(want));
      return;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

int64_t matmul_k_block(DType dtype) { return dtype == kBFloat16 ? cpu::kGemmKcBf16 : cpu::kGemmKc; }

void set_matmul_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool matmul_allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

const Tensor& bmm_out(const Tensor& out, const Tensor& a, const Tensor& b) {
  check_bmm(a, b);
  check_out(out, a, b, {a.size(0), a.size(1), b.size(2)}, "bmm_out");
  dispatch_bmm(out, a, b, "bmm_out");
  return out;
}

}  // namespace dtr
