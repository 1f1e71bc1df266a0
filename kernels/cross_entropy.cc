#include "kernels/cross_entropy.h"

#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/fill.h"

namespace dtr {
namespace {

// logits [N, C] floating, target [N] int64, on one device.
void check_logits_target(const Tensor& logits, const Tensor& target, std::string_view op) {
  DTR_CHECK(logits.dim() == 2, ValueError, "{}: logits {} must be 2-D [N, C]", op, describe(logits));
  DTR_CHECK(is_floating(logits.dtype()), TypeError,
            "{}: logits {} are not floating; {} takes float32, float64, bfloat16 or float16", op, describe(logits), op);
  DTR_CHECK(target.dtype() == kInt64, TypeError, "{}: target {} must be int64 class indices", op, describe(target));
  DTR_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), ValueError,
            "{}: target {} must be 1-D with one class index per row of logits {}", op, describe(target),
            describe(logits));
  DTR_CHECK(target.device() == logits.device(), ValueError, "{}: logits {} and target {} are on different devices", op,
            describe(logits), describe(target));
}

// torch's range for label_smoothing (a NaN fails it too).
void check_label_smoothing(double label_smoothing, std::string_view op) {
  DTR_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError,
            "{}: label_smoothing {} is not in [0, 1] (0 is plain cross-entropy, 1 a uniform target)", op,
            label_smoothing);
}

// The fused kernels make one loss: kNone (a loss per row) is composed above them (nn::cross_entropy).
void check_reduction(LossReduction reduction, std::string_view op) {
  DTR_CHECK(reduction != LossReduction::kNone, ValueError,
            "{}: reduction none is not fused; legal: LossReduction::kMean or kSum (nn::cross_entropy composes none "
            "from log_softmax)",
            op);
}

}  // namespace

CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                 LossReduction reduction, double label_smoothing) {
  check_logits_target(logits, target, "cross_entropy");
  check_label_smoothing(label_smoothing, "cross_entropy");
  check_reduction(reduction, "cross_entropy");
  CrossEntropyOutput out{.loss = Tensor::empty({}, logits.dtype(), logits.device()),
                         .logsumexp = Tensor::empty({logits.size(0)}, acc_dtype(logits.dtype()), logits.device())};
  const trace::Span span("cross_entropy", trace::Category::kKernel);
  switch (logits.device().type) {
    case kCPU:
      cpu::cross_entropy(out.loss, out.logsumexp, logits, target, ignore_index, reduction, label_smoothing);
      return out;
    case kCUDA: {
      const Tensor l = logits.contiguous(), t = target.contiguous();
      const int64_t n = logits.size(0), c = logits.size(1);
      Tensor bad = zeros({1}, kInt32, logits.device());
      const Tensor scratch = Tensor::empty({n + 1}, kFloat64, logits.device());
      const int device = logits.device().index;
      cuda::cross_entropy(out.loss.data(), out.logsumexp.data(), static_cast<int32_t*>(bad.data()), l.data(),
                          static_cast<const int64_t*>(t.data()), n, c, ignore_index, reduction == LossReduction::kMean,
                          label_smoothing, static_cast<double*>(scratch.data()), logits.dtype(), device,
                          cuda::current_stream(device).handle());
      // Read back on the host: one synchronisation of the stream per call.
      DTR_CHECK(bad.item() == 0, IndexError,
                "cross_entropy: target {} holds a class outside [0, {}) that is not ignore_index {} (logits {})",
                describe(target), c, ignore_index, describe(logits));
      return out;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                              const Tensor& logsumexp, int64_t ignore_index, LossReduction reduction,
                              double label_smoothing) {
  constexpr std::string_view op = "cross_entropy_backward";
  check_logits_target(logits, target, op);
  check_label_smoothing(label_smoothing, op);
  check_reduction(reduction, op);
  DTR_CHECK(grad_loss.numel() == 1 && is_floating(grad_loss.dtype()), ValueError,
            "{}: grad_loss {} must be a one-element floating tensor (the gradient of the loss)", op,
            describe(grad_loss));
  const DType lse_dtype = acc_dtype(logits.dtype());
  DTR_CHECK(logsumexp.shape() == Shape{logits.size(0)} && logsumexp.dtype() == lse_dtype &&
                logsumexp.device() == logits.device(),
            ValueError, "{}: logsumexp {} must be the forward's saved {}[{}] for logits {}", op, describe(logsumexp),
            dtype_name(lse_dtype), logits.size(0), describe(logits));
  Tensor grad = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  const trace::Span span("cross_entropy_backward", trace::Category::kKernel);
  switch (logits.device().type) {
    case kCPU:
      cpu::cross_entropy_backward(grad, logits, target, logsumexp, grad_loss.item(), ignore_index, reduction,
                                  label_smoothing);
      return grad;
    case kCUDA: {
      const Tensor l = logits.contiguous(), t = target.contiguous(), lse = logsumexp.contiguous();
      const Tensor g = grad_loss.to(logits.device()).to(kFloat64);  // stays on the device
      const Tensor scratch = Tensor::empty({1}, kFloat64, logits.device());
      const int device = logits.device().index;
      cuda::cross_entropy_backward(grad.data(), l.data(), static_cast<const int64_t*>(t.data()), lse.data(),
                                   static_cast<const double*>(g.data()), logits.size(0), logits.size(1), ignore_index,
                                   reduction == LossReduction::kMean, label_smoothing,
                                   static_cast<double*>(scratch.data()), logits.dtype(), device,
                                   cuda::current_stream(device).handle());
      return grad;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
