// cross_entropy and its backward against float64 loops written here: every floating dtype,
// class counts 1/7/1023/4097, ignored rows, both reductions, strided and transposed logits,
// label smoothing (the reference is log_softmax's smoothed nll, and the gradient is also
// checked by central finite differences of the kernel's own float64 forward); exact cases;
// NaN mean over no targets; thread-count independence; typed errors.
#include "kernels/cross_entropy.h"

#include <cmath>
#include <limits>
#include <random>

#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::to_f64;

struct Reference {
  double loss;
  std::vector<double> grad;
};

// With logp = log_softmax(x) per row and label smoothing e:
//   loss = reduce_n ((1 - e) * -logp[n, t_n] + e * mean_c -logp[n, c]) over rows with
//   t_n != ignore, and d loss / d x = softmax - (1 - e) onehot - e / C times grad_loss, in
// float64 (torch's formula, written from log_softmax, not from the kernel's).
Reference reference(const std::vector<double>& x, int64_t rows, int64_t classes, const std::vector<int64_t>& target,
                    int64_t ignore, LossReduction reduction, double grad_loss, double e = 0.0) {
  double total = 0.0;
  int64_t count = 0;
  std::vector<double> lse(rows, 0.0);
  for (int64_t n = 0; n < rows; ++n) {
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < classes; ++c) max = std::max(max, x[n * classes + c]);
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(x[n * classes + c] - max);
    lse[n] = max + std::log(sum);
    if (target[n] == ignore) continue;
    double smooth = 0.0;
    for (int64_t c = 0; c < classes; ++c) smooth -= x[n * classes + c] - lse[n];
    total += (1 - e) * -(x[n * classes + target[n]] - lse[n]) + e * smooth / static_cast<double>(classes);
    ++count;
  }
  const bool mean = reduction == LossReduction::kMean;
  Reference r{mean ? (count == 0 ? std::nan("") : total / count) : total,
              std::vector<double>(static_cast<size_t>(rows * classes), 0.0)};
  const double scale = mean ? grad_loss / std::max<int64_t>(count, 1) : grad_loss;
  for (int64_t n = 0; n < rows; ++n) {
    if (target[n] == ignore) continue;
    for (int64_t c = 0; c < classes; ++c) {
      const double p = std::exp(x[n * classes + c] - lse[n]);
      r.grad[n * classes + c] = (p - (c == target[n] ? 1.0 - e : 0.0) - e / static_cast<double>(classes)) * scale;
    }
  }
  return r;
}

// Targets in [0, classes), about one in five set to ignore.
std::vector<int64_t> random_targets(int64_t rows, int64_t classes, int64_t ignore, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> cls(0, classes - 1);
  std::vector<int64_t> t;
  for (int64_t n = 0; n < rows; ++n) t.push_back(gen() % 5 == 0 ? ignore : cls(gen));
  return t;
}

TEST_CASE("cross_entropy and its backward match float64 references", "[cross_entropy]") {
  uint64_t seed = 1;
  for (DType dtype : testing::kFloatDTypes) {
    for (int64_t classes : {1, 7, 1023, 4097}) {
      for (int64_t rows : {1, 7, 33}) {
        for (LossReduction reduction : {LossReduction::kMean, LossReduction::kSum}) {
          Tensor logits = testing::random_tensor({rows, classes}, dtype, seed++, -6.0, 6.0);
          const std::vector<int64_t> tv = random_targets(rows, classes, -100, seed++);
          // One row always counts, so that the mean is defined.
          std::vector<int64_t> targets = tv;
          targets[0] = classes - 1;
          Tensor target = Tensor::from_vector(targets, {rows});
          const Reference ref = reference(to_f64(logits), rows, classes, targets, -100, reduction, 2.5);
          const std::string what =
              fmt::format("cross_entropy {}, {}", describe(logits), reduction == LossReduction::kMean ? "mean" : "sum");
          Tensor transposed = logits.t().contiguous().t();  // strides [1, rows]
          for (const Tensor& input : {logits, testing::strided_copy(logits), transposed}) {
            CrossEntropyOutput out = cross_entropy(input, target, -100, reduction);
            CHECK(out.loss.dim() == 0);
            CHECK(out.loss.dtype() == dtype);
            CHECK(out.logsumexp.shape() == Shape{rows});
            testing::Tolerance tol = testing::tolerance_for(dtype);
            tol.atol *= rows;  // a sum of up to 33 row losses
            testing::check_close(out.loss, Shape{}, {ref.loss}, tol, what + " loss");
            Tensor grad = cross_entropy_backward(full({}, 2.5), input, target, out.logsumexp, -100, reduction);
            CHECK(grad.shape() == logits.shape());
            testing::check_close(grad, logits.shape(), ref.grad, what + " grad");
          }
        }
      }
    }
  }
}

TEST_CASE("cross_entropy with label smoothing matches a float64 reference", "[cross_entropy][label_smoothing]") {
  uint64_t seed = 500;
  for (DType dtype : testing::kFloatDTypes) {
    for (int64_t classes : {1, 7, 1023, 4097}) {
      for (double e : {0.1, 0.5, 1.0}) {
        for (LossReduction reduction : {LossReduction::kMean, LossReduction::kSum}) {
          const int64_t rows = 9;
          Tensor logits = testing::random_tensor({rows, classes}, dtype, seed++, -6.0, 6.0);
          std::vector<int64_t> targets = random_targets(rows, classes, -100, seed++);
          targets[0] = classes - 1;
          Tensor target = Tensor::from_vector(targets, {rows});
          const Reference ref = reference(to_f64(logits), rows, classes, targets, -100, reduction, 2.5, e);
          const std::string what = fmt::format("cross_entropy {}, {}, label_smoothing {}", describe(logits),
                                               reduction == LossReduction::kMean ? "mean" : "sum", e);
          for (const Tensor& input : {logits, testing::strided_copy(logits)}) {
            CrossEntropyOutput out = cross_entropy(input, target, -100, reduction, e);
            testing::Tolerance tol = testing::tolerance_for(dtype);
            tol.atol *= rows;
            testing::check_close(out.loss, Shape{}, {ref.loss}, tol, what + " loss");
            Tensor grad = cross_entropy_backward(full({}, 2.5), input, target, out.logsumexp, -100, reduction, e);
            testing::check_close(grad, logits.shape(), ref.grad, what + " grad");
          }
        }
      }
    }
  }
}

TEST_CASE("label smoothing 0 is the plain loss bit for bit", "[cross_entropy][label_smoothing]") {
  Tensor logits = testing::random_tensor({33, 1023}, kFloat32, 41, -6.0, 6.0);
  Tensor target = Tensor::from_vector(random_targets(33, 1023, -100, 42));
  CrossEntropyOutput plain = cross_entropy(logits, target);
  CrossEntropyOutput zero = cross_entropy(logits, target, -100, LossReduction::kMean, 0.0);
  testing::check_equal(zero.loss, plain.loss, "loss");
  testing::check_equal(
      cross_entropy_backward(full({}, 1.0), logits, target, zero.logsumexp, -100, LossReduction::kMean, 0.0),
      cross_entropy_backward(full({}, 1.0), logits, target, plain.logsumexp), "grad");
}

TEST_CASE("label smoothing: the gradient is the finite difference of the float64 loss",
          "[cross_entropy][label_smoothing][backward]") {
  const int64_t rows = 4, classes = 5;
  const Tensor logits = testing::random_tensor({rows, classes}, kFloat64, 7, -3.0, 3.0);
  const Tensor target = Tensor::from_vector(std::vector<int64_t>{4, -100, 0, 2});
  for (LossReduction reduction : {LossReduction::kMean, LossReduction::kSum}) {
    for (double e : {0.0, 0.3, 1.0}) {
      CrossEntropyOutput out = cross_entropy(logits, target, -100, reduction, e);
      const Tensor grad = cross_entropy_backward(full({}, 1.0), logits, target, out.logsumexp, -100, reduction, e);
      const double h = 1e-6;
      std::vector<double> numeric;
      for (int64_t i = 0; i < rows * classes; ++i) {
        auto loss_at = [&](double delta) {
          Tensor x = logits.clone();
          x.data_ptr<double>()[i] += delta;
          return cross_entropy(x, target, -100, reduction, e).loss.item();
        };
        numeric.push_back((loss_at(h) - loss_at(-h)) / (2 * h));
      }
      testing::check_close(grad, Shape{rows, classes}, numeric, testing::Tolerance{1e-8, 1e-6},
                           fmt::format("label_smoothing {} {} grad vs finite difference", e,
                                       reduction == LossReduction::kMean ? "mean" : "sum"));
    }
  }
}

TEST_CASE("label smoothing with well-separated logits is exact", "[cross_entropy][label_smoothing][exact]") {
  // exp(-768) underflows to 0, so lse = 0 and softmax = onehot(0) in rows 0 and 1. With
  // e = 1/2 and C = 4 (the row mean is -576):
  //   row 0, target 0: 0 - 0.5 * 0 - 0.5 * -576 = 288;  row 1, target 1: 0 + 384 + 288 = 672.
  // grad (mean over 2 rows) = (onehot(0) - 0.5 onehot(t) - 1/8) / 2; the ignored row 0.
  const double lo = -768.0;
  const std::vector<double> xv{0, lo, lo, lo, 0, lo, lo, lo, lo, 0, lo, lo};
  Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 1, -100});
  for (DType dtype : testing::kFloatDTypes) {
    Tensor logits = Tensor::from_vector(xv, {3, 4}).to(dtype);
    CrossEntropyOutput mean = cross_entropy(logits, target, -100, LossReduction::kMean, 0.5);
    testing::check_equal(mean.loss, Shape{}, {480.0}, "mean of 288 and 672");
    testing::check_equal(cross_entropy(logits, target, -100, LossReduction::kSum, 0.5).loss, Shape{}, {960.0}, "sum");
    testing::check_equal(
        cross_entropy_backward(full({}, 1.0), logits, target, mean.logsumexp, -100, LossReduction::kMean, 0.5),
        Shape{3, 4}, {0.1875, -0.0625, -0.0625, -0.0625, 0.4375, -0.3125, -0.0625, -0.0625, 0, 0, 0, 0}, "grad");
  }
}

TEST_CASE("cross_entropy with well-separated logits is exact", "[cross_entropy][exact]") {
  // exp(-768) underflows to 0 in float and double, so each lse is its row's max exactly and
  // softmax is exactly one-hot. Row losses 0, 768, 0, 768; the last row is ignored.
  const double lo = -768.0;
  const std::vector<double> xv{0,  lo, lo, lo,   // target 0: right
                               0,  lo, lo, lo,   // target 1: loss 768
                               lo, lo, lo, 4,    // target 3: right
                               lo, lo, 0,  lo,   // target 0: loss 768
                               lo, 1,  lo, lo};  // ignored
  Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 1, 3, 0, -100});
  for (DType dtype : testing::kFloatDTypes) {
    Tensor logits = Tensor::from_vector(xv, {5, 4}).to(dtype);
    CrossEntropyOutput mean = cross_entropy(logits, target);
    testing::check_equal(mean.loss, Shape{}, {384.0}, "mean of 0, 768, 0, 768");
    testing::check_equal(mean.logsumexp, Shape{5}, {0, 0, 4, 0, 1}, "lse is the row max");
    testing::check_equal(cross_entropy(logits, target, -100, LossReduction::kSum).loss, Shape{}, {1536.0}, "sum");
    testing::check_equal(cross_entropy_backward(full({}, 1.0), logits, target, mean.logsumexp), Shape{5, 4},
                         {0, 0, 0, 0, 0.25, -0.25, 0, 0, 0, 0, 0, 0, -0.25, 0, 0.25, 0, 0, 0, 0, 0},
                         "(one-hot softmax - one-hot target) / 4");
  }
}

TEST_CASE("ignored rows: zero gradient, not counted; mean over none is NaN", "[cross_entropy]") {
  for (DType dtype : testing::kFloatDTypes) {
    Tensor logits = testing::random_tensor({4, 5}, dtype, 3);
    Tensor all_ignored = Tensor::from_vector(std::vector<int64_t>{7, 7, 7, 7});
    CrossEntropyOutput mean = cross_entropy(logits, all_ignored, 7);
    CHECK(std::isnan(mean.loss.item()));
    testing::check_equal(cross_entropy(logits, all_ignored, 7, LossReduction::kSum).loss, Shape{}, {0.0},
                         "sum over none");
    testing::check_equal(cross_entropy_backward(full({}, 1.0), logits, all_ignored, mean.logsumexp, 7), Shape{4, 5},
                         std::vector<double>(20, 0.0), "grad over none");
    // ignore_index may be a real class: rows with target 2 are skipped.
    Tensor target = Tensor::from_vector(std::vector<int64_t>{2, 0, 2, 4});
    const Reference ref = reference(to_f64(logits), 4, 5, {2, 0, 2, 4}, 2, LossReduction::kMean, 1.0);
    CrossEntropyOutput out = cross_entropy(logits, target, 2);
    testing::check_close(out.loss, Shape{}, {ref.loss}, "ignore_index 2");
    testing::check_close(cross_entropy_backward(full({}, 1.0), logits, target, out.logsumexp, 2), Shape{4, 5}, ref.grad,
                         "ignore_index 2 grad");
  }
}

TEST_CASE("cross_entropy is bitwise the same on 1 and 2 threads", "[cross_entropy][parallel]") {
  testing::ThreadCountGuard guard;
  Tensor logits = testing::random_tensor({4097, 33}, kFloat32, 9);
  Tensor target = Tensor::from_vector(random_targets(4097, 33, -100, 10));
  set_num_threads(1);
  CrossEntropyOutput one = cross_entropy(logits, target);
  Tensor grad_one = cross_entropy_backward(full({}, 1.0), logits, target, one.logsumexp);
  set_num_threads(2);
  CrossEntropyOutput two = cross_entropy(logits, target);
  testing::check_equal(two.loss, Shape{}, {one.loss.item()}, "loss");
  testing::check_equal(cross_entropy_backward(full({}, 1.0), logits, target, two.logsumexp), grad_one, "grad");
  set_num_threads(1);
  CrossEntropyOutput smooth_one = cross_entropy(logits, target, -100, LossReduction::kMean, 0.1);
  set_num_threads(2);
  testing::check_equal(cross_entropy(logits, target, -100, LossReduction::kMean, 0.1).loss, Shape{},
                       {smooth_one.loss.item()}, "smoothed loss");
}

TEST_CASE("cross_entropy rejects bad targets and shapes with typed errors", "[cross_entropy][errors]") {
  Tensor logits = Tensor::empty({3, 5});
  fill_(logits, 0.0);
  Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 5, 1});
  CHECK_THROWS_AS(cross_entropy(logits, bad), IndexError);
  CHECK_THROWS_WITH(cross_entropy(logits, bad), Catch::Contains("cross_entropy") && Catch::Contains("target 5") &&
                                                    Catch::Contains("row 1") && Catch::Contains("[0, 5)"));
  CHECK_THROWS_AS(cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, -1, 1})), IndexError);
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_vector(std::vector<int32_t>{0, 1, 1})),
                    Catch::Contains("int64") && Catch::Contains("int32[3]"));
  CHECK_THROWS_AS(cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, 1})), ValueError);
  CHECK_THROWS_AS(cross_entropy(Tensor::empty({3, 5, 2}), bad), ValueError);
  Tensor good = Tensor::from_vector(std::vector<int64_t>{0, 1, 2});
  CrossEntropyOutput out = cross_entropy(logits, good);
  CHECK_THROWS_WITH(cross_entropy_backward(full({}, 1.0), logits, bad, out.logsumexp),
                    Catch::Contains("cross_entropy_backward") && Catch::Contains("target 5"));
  CHECK_THROWS_WITH(cross_entropy_backward(full({2}, 1.0), logits, good, out.logsumexp), Catch::Contains("grad_loss"));
  CHECK_THROWS_WITH(cross_entropy_backward(full({}, 1.0), logits, good, out.logsumexp.to(kFloat64)),
                    Catch::Contains("logsumexp") && Catch::Contains("float64[3]"));
  for (double e : {-0.1, 1.5, std::nan("")}) {
    CHECK_THROWS_AS(cross_entropy(logits, good, -100, LossReduction::kMean, e), ValueError);
    CHECK_THROWS_WITH(cross_entropy(logits, good, -100, LossReduction::kMean, e),
                      Catch::Contains("cross_entropy") && Catch::Contains(fmt::format("label_smoothing {}", e)) &&
                          Catch::Contains("[0, 1]"));
    CHECK_THROWS_AS(cross_entropy_backward(full({}, 1.0), logits, good, out.logsumexp, -100, LossReduction::kMean, e),
                    ValueError);
  }
  CHECK_THROWS_WITH(cross_entropy(logits, good, -100, LossReduction::kNone),
                    Catch::Contains("cross_entropy: reduction none is not fused"));
  CHECK_THROWS_AS(cross_entropy_backward(full({}, 1.0), logits, good, out.logsumexp, -100, LossReduction::kNone),
                  ValueError);
}

}  // namespace
}  // namespace dtr
