#include "kernels/cpu/cross_entropy.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/internal/exp_sum.h"
#include "kernels/cpu/internal/lane_fold.h"

namespace dtr::cpu {
namespace {

// The targets as int64, each in [0, classes) or ignore_index; and how many are not ignored.
struct Targets {
  std::vector<int64_t> values;
  int64_t count = 0;
};

Targets read_targets(const Tensor& target, const Tensor& logits, int64_t ignore_index, std::string_view op) {
  const Tensor tc = target.contiguous();
  const int64_t* p = tc.data_ptr<int64_t>();
  const int64_t classes = logits.size(1);
  Targets t{std::vector<int64_t>(p, p + tc.numel()), 0};
  for (size_t n = 0; n < t.values.size(); ++n) {
    const int64_t v = t.values[n];
    if (v == ignore_index) continue;
    DTR_CHECK(v >= 0 && v < classes, IndexError,
              "{}: target {} at row {} is out of range for logits {} (targets must lie in [0, {}) or equal "
              "ignore_index {})",
              op, v, n, describe(logits), classes, ignore_index);
    ++t.count;
  }
  return t;
}

int64_t row_grain(int64_t classes) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(classes, 1)); }

}  // namespace

void cross_entropy(const Tensor& loss, const Tensor& logsumexp, const Tensor& logits, const Tensor& target,
                   int64_t ignore_index, LossReduction reduction, double label_smoothing) {
  const Targets targets = read_targets(target, logits, ignore_index, "cross_entropy");
  const Tensor lc = logits.contiguous();
  const int64_t rows = logits.size(0), classes = logits.size(1);
  std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
  dispatch_floating(logits.dtype(), "cross_entropy", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* pl = lc.data_ptr<T>();
    Acc* plse = logsumexp.data_ptr<Acc>();
    const Acc e = static_cast<Acc>(label_smoothing);
    parallel_for(rows, row_grain(classes), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const T* row = pl + n * classes;
        const T* next = n + 1 < rows ? row + classes : nullptr;
        const auto [max, sum] = exp_sum<Acc>(row, classes, std::integral_constant<int64_t, 1>{}, nullptr, next);
        plse[n] = max + std::log(sum);
        const int64_t t = targets.values[n];
        if (t == ignore_index) continue;
        const Acc target_logit = static_cast<Acc>(row[t]);
        if (label_smoothing == 0.0) {
          row_loss[n] = static_cast<double>(plse[n] - target_logit);
        } else {
          // lse - (1 - e) x[t] - e mean(x): the row is still in L1 from exp_sum.
          const Acc mean =
              lane_sum<Acc>(classes, [row](int64_t c) { return static_cast<Acc>(row[c]); }) / static_cast<Acc>(classes);
          row_loss[n] = static_cast<double>(plse[n] - (Acc(1) - e) * target_logit - e * mean);
        }
      }
    });
  });
  double total = 0.0;
  for (double l : row_loss) total += l;
  if (reduction == LossReduction::kMean) {
    total = targets.count == 0 ? std::numeric_limits<double>::quiet_NaN() : total / targets.count;
  }
  dispatch_floating(logits.dtype(), "cross_entropy",
                    [&]<class T>(TypeTag<T>) { *loss.data_ptr<T>() = convert<T>(total); });
}

void cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& logsumexp,
                            double grad_loss, int64_t ignore_index, LossReduction reduction, double label_smoothing) {
  const Targets targets = read_targets(target, logits, ignore_index, "cross_entropy_backward");
  const Tensor lc = logits.contiguous();
  const Tensor lsec = logsumexp.contiguous();
  const int64_t rows = logits.size(0), classes = logits.size(1);
  // With no row counted, kMean has no row to scale: every row is ignored and gets zeros.
  const double scale = reduction == LossReduction::kMean && targets.count > 0 ? grad_loss / targets.count : grad_loss;
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* pl = lc.data_ptr<T>();
    const Acc* plse = lsec.data_ptr<Acc>();
    T* pg = grad.data_ptr<T>();
    const Acc s = static_cast<Acc>(scale);
    // The smoothed target: (1 - e) on the target class plus e / C on every class.
    const Acc on_target = static_cast<Acc>(1.0 - label_smoothing);
    const Acc uniform = static_cast<Acc>(label_smoothing / static_cast<double>(classes));
    parallel_for(rows, row_grain(classes), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const T* row = pl + n * classes;
        T* grow = pg + n * classes;
        const int64_t t = targets.values[n];
        if (t == ignore_index) {
          std::fill(grow, grow + classes, convert<T>(0.0));
          continue;
        }
        // grad [C] = (softmax(row) - (1 - e) onehot(t) - e / C) * scale: the softmax and
        // uniform terms for every class, then the target's entry again (a test of c == t in
        // the loop costs it half its speed).
        auto softmax_at = [&](int64_t c) { return exp_nonpositive_of(static_cast<Acc>(row[c]) - plse[n]); };
        for (int64_t c = 0; c < classes; ++c) grow[c] = convert<T>((softmax_at(c) - uniform) * s);
        grow[t] = convert<T>((softmax_at(t) - uniform - on_target) * s);
      }
    });
  });
}

}  // namespace dtr::cpu
