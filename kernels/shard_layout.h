// ShardLayout: where a local tensor sits inside a global one, for ops whose values are a
// function of the global element index (random draws, dropout masks).
//
// global_shape is the whole tensor's shape and offset[d] the global index of the local
// tensor's first element along dim d, so local element (i0, i1, ...) is global element
// (offset0 + i0, offset1 + i1, ...), numbered row-major in global_shape. Example: a global
// [8, 6] tensor sharded on dim 1 over 2 ranks (torch.chunk) gives rank 1 the layout
// {global_shape [8, 6], offset [0, 3]} for its [8, 3] shard. DTensor's spec provides it.
#pragma once

#include <optional>
#include <string_view>

#include "core/tensor.h"

namespace dtr {

struct ShardLayout {
  Shape global_shape;
  Shape offset;
};

// layout if given (after checking that it holds t: same rank, offset >= 0 and
// offset + size <= global size per dim), else the layout of t as the whole tensor.
// Throws ValueError naming op, t and the layout.
ShardLayout resolve_shard_layout(const Tensor& t, const std::optional<ShardLayout>& layout, std::string_view op);

}  // namespace dtr
