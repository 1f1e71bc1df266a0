// acc_row: a row kernel's view of its rows in the accumulation type (layer_norm, rms_norm).
//
// as_acc gives a row of T as Acc values: the row itself when T is Acc, else a copy
// converted into a caller's buffer (one vectorised pass, where converting at every use
// would cost each pass over the row). acc_out gives where a row of results in Acc goes
// before store_row (row_store.h) writes it as T: the output row itself when T is Acc and
// rows are not streamed, else the buffer.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/cpu/convert_block.h"

namespace dtr::cpu {

template <class Acc, class T>
const Acc* as_acc(const T* row, int64_t n, std::vector<Acc>& buffer) {
  if constexpr (std::is_same_v<T, Acc>) {
    return row;
  } else {
    buffer.resize(static_cast<size_t>(n));
    convert_block(row, buffer.data(), n);
    return buffer.data();
  }
}

template <class Acc, class T>
Acc* acc_out(T* out, std::vector<Acc>& buffer, int64_t n, bool streaming) {
  if constexpr (std::is_same_v<T, Acc>) {
    if (!streaming) return out;
  }
  buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

}  // namespace dtr::cpu
