#include "core/check_writable.h"

namespace dtr::internal {

void check_writable(std::string_view op, const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    DTR_CHECK(t.stride(d) != 0 || t.size(d) <= 1, ValueError,
              "{}: {} is an expanded view (dim {} has stride 0) and cannot be written; write into a tensor that "
              "owns its elements (clone() it first)",
              op, describe(t), d);
  }
}

}  // namespace dtr::internal
