// CPU kernels of kernels/cpu/elementwise.h: comparisons, logical_not, where and masked_fill.
#include <functional>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/internal/elementwise_loop.h"

namespace dtr::cpu {

std::string_view compare_op_name(CompareOp op) {
  switch (op) {
    case CompareOp::kEq: return "eq";
    case CompareOp::kNe: return "ne";
    case CompareOp::kLt: return "lt";
    case CompareOp::kLe: return "le";
    case CompareOp::kGt: return "gt";
    case CompareOp::kGe: return "ge";
  }
  DTR_INTERNAL_ASSERT(false, "unknown CompareOp {}", static_cast<int>(op));
}

namespace {

// Calls f with the std:: function object of a comparison.
template <class F>
void with_comparison(CompareOp op, const F& f) {
  switch (op) {
    case CompareOp::kEq: return f(std::equal_to<>());
    case CompareOp::kNe: return f(std::not_equal_to<>());
    case CompareOp::kLt: return f(std::less<>());
    case CompareOp::kLe: return f(std::less_equal<>());
    case CompareOp::kGt: return f(std::greater<>());
    case CompareOp::kGe: return f(std::greater_equal<>());
  }
  DTR_INTERNAL_ASSERT(false, "unknown CompareOp {}", static_cast<int>(op));
}

}  // namespace

void compare(const Tensor& out, const Tensor& a, const Tensor& b, CompareOp op) {
  dispatch_all(a.dtype(), compare_op_name(op),
               [&]<class T>(TypeTag<T>) { with_comparison(op, [&](auto cmp) { map<bool, T, T>(out, cmp, a, b); }); });
}

void compare_scalar(const Tensor& out, const Tensor& a, double s, CompareOp op) {
  dispatch_all(a.dtype(), compare_op_name(op), [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(convert<T>(s));
    with_comparison(op, [&](auto cmp) {
      map<bool, T>(
          out, [k, cmp](auto x) { return cmp(x, k); }, a);
    });
  });
}

void logical_not(const Tensor& out, const Tensor& x) {
  dispatch_all(x.dtype(), "logical_not", [&]<class T>(TypeTag<T>) {
    map<bool, T>(
        out, [](auto v) { return v == decltype(v)(0); }, x);
  });
}

void where(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  dispatch_all(a.dtype(), "where", [&]<class T>(TypeTag<T>) {
    map<T, bool, T, T>(
        out, [](bool c, auto x, auto y) { return c ? x : y; }, condition, a, b);
  });
}

void masked_fill(const Tensor& out, const Tensor& x, const Tensor& mask, double value) {
  dispatch_all(x.dtype(), "masked_fill", [&]<class T>(TypeTag<T>) {
    const auto v = static_cast<opmath_t<T>>(value);
    map<T, T, bool>(
        out, [v](auto e, bool m) { return m ? v : e; }, x, mask);
  });
}

}  // namespace dtr::cpu
