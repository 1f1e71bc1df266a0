// Op coverage: which devices and dtypes each Tensor-level op of kernels/ has kernels for.
//
// One table lists every op with the dtypes it runs on per device (the dtype of the operand
// its kernel dispatches on: the input's, or the destination's for fill_ and the random
// ops). The ops dispatch through their own device switch and dtype dispatch; the table is
// what a reader, a tool or a test asks, and tests/kernels/op_support_test runs every op on
// every dtype to prove that the CPU column says exactly what the kernels do, and that
// docs/op_support.md holds op_support_markdown().
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace dtr {

// A set of dtypes, one bit per DType.
class DTypeSet {
 public:
  constexpr DTypeSet() = default;
  constexpr DTypeSet(std::initializer_list<DType> dtypes) {
    for (DType d : dtypes) bits_ |= bit(d);
  }
  constexpr bool contains(DType d) const { return (bits_ & bit(d)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  // The members in DType order.
  std::vector<DType> dtypes() const;
  // "float32, float64, bfloat16, float16", or "none".
  std::string str() const;

 private:
  static constexpr uint32_t bit(DType d) { return uint32_t{1} << static_cast<uint32_t>(d); }
  uint32_t bits_ = 0;
};

// One op: its name (as its error messages say it) and the dtypes of its kernels per device.
struct OpSupport {
  std::string_view op;
  DTypeSet cpu;
  DTypeSet cuda;

  const DTypeSet& on(DeviceType device) const { return device == kCPU ? cpu : cuda; }
};

// Every op, in the order of kernels/'s headers.
std::span<const OpSupport> supported_ops();

// Whether `op` has a kernel for `dtype` on `device`. Throws ValueError for an op the table
// does not list.
bool supports(std::string_view op, DeviceType device, DType dtype);

// The table as markdown: one row per op, a column per device.
std::string op_support_markdown();

}  // namespace dtr
