#include "kernels/shard_layout.h"

namespace dtr {

ShardLayout resolve_shard_layout(const Tensor& t, const std::optional<ShardLayout>& layout, std::string_view op) {
  if (!layout) return ShardLayout{t.shape(), Shape(t.shape().size(), 0)};
  const auto& g = layout->global_shape;
  const auto& o = layout->offset;
  DTR_CHECK(g.size() == t.shape().size() && o.size() == t.shape().size(), ValueError,
            "{}: layout (global shape {}, offset {}) does not describe a {}-d tensor {}", op, g, o, t.dim(),
            describe(t));
  for (int64_t d = 0; d < t.dim(); ++d) {
    DTR_CHECK(o[d] >= 0 && o[d] + t.size(d) <= g[d], ValueError,
              "{}: {} at offset {} does not fit in the global shape {} (dim {}: offset {} + size {} > {}, "
              "or a negative offset)",
              op, describe(t), o, g, d, o[d], t.size(d), g[d]);
  }
  return *layout;
}

}  // namespace dtr
