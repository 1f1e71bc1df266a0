// The split of a traced training step's time by op family, for train_step_bench.
//
// A kernel span counts for the family of its region ("attention", "norm": forward and
// backward, through autograd's regions) or else of its name (bmm and matmul; embedding and
// cross_entropy; every other kernel is elementwise, copies and fills included); a span
// nested in a counted one is part of it. An optimizer span counts whole. What the step's
// wall time holds beyond these is autograd, dispatch and allocation overhead.
#pragma once

#include <array>
#include <span>
#include <string_view>

#include "core/trace.h"

namespace dtr::bench {

enum class OpFamily : uint8_t { kMatmul, kAttention, kNorms, kElementwise, kEmbeddingAndLoss, kOptimizer, kOverhead };
inline constexpr size_t kNumOpFamilies = 7;

std::string_view op_family_name(OpFamily f);

// Milliseconds per family, indexed by OpFamily.
using FamilyTimes = std::array<double, kNumOpFamilies>;

// The split of one step that took `step_ms` of wall time and recorded `threads`' events;
// kOverhead is what the families leave of step_ms.
FamilyTimes split_by_family(std::span<const trace::ThreadEvents> threads, double step_ms);

}  // namespace dtr::bench
