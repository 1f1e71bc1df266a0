// check_writable: the check every op that writes through a caller's tensor makes first.
//
// An expanded view (a dim of size > 1 with stride 0, from expand()) addresses one element
// many times: writing through it would store several results in one place, and the
// outcome would depend on the loop order. copy_, the in-place elementwise ops, index_add_
// and the random fills all refuse such a destination with this one ValueError.
#pragma once

#include <string_view>

#include "core/tensor.h"

namespace dtr::internal {

// Throws ValueError naming op, t and the first stride-0 dim when t is an expanded view.
void check_writable(std::string_view op, const Tensor& t);

}  // namespace dtr::internal
