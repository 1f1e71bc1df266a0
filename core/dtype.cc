#include "core/dtype.h"

#include "core/error.h"

namespace dtr {

void throw_dtype_not_implemented(std::string_view op, DType d) {
  throw NotImplementedError(fmt::format("{}: not implemented for dtype {}", op, dtype_name(d)));
}

}  // namespace dtr
