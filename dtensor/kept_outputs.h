// KeptOutputs: selective activation checkpointing's store of op outputs (nn/checkpoint.h),
// the engine's part, so that no op needs to know about checkpointing beyond one call.
//
// The ops selective checkpointing may keep (kKeepableOps: the matrix products, attention and
// every redistribute, the ops that are expensive or communicate) compute their local
// results through kept_or_computed(op, compute). While a checkpointed forward runs under a
// KeptOutputs::Scope in kRecord mode whose policy names the op, they are computed and kept,
// in call order; when that forward returns, select() keeps of the matrix products (matmul,
// bmm, linear) only those that buy the most recompute per kept byte, up to a share of the
// products' FLOPs, and releases the others. While the forward's recompute runs in kReplay
// mode, the kept results are taken back, in the same order, instead of computed, and the
// released products computed (the op then records its autograd node as it would have, from
// the same inputs: the recompute is bitwise the forward, so its calls and values are the
// same). Elsewhere kept_or_computed computes. So between forward and backward a
// selectively checkpointed module holds its inputs and the kept results, and its recompute
// multiplies only the products not kept and never communicates.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace dtr {

// The op names a policy may give: matmul, bmm and linear (dtensor/ops/matmul.h),
// scaled_dot_product_attention (its output and row log-sum-exp) and redistribute (every
// collective of a redistribute, implicit ones included).
inline constexpr std::array<std::string_view, 5> kKeepableOps = {"matmul", "bmm", "linear",
                                                                 "scaled_dot_product_attention", "redistribute"};

class KeptOutputs {
 public:
  // Keeps the outputs of `ops` (each one of kKeepableOps: ValueError naming the others); of
  // the products among them, after select(), those holding `product_flops` (in [0, 1]:
  // ValueError otherwise) of the products' recompute FLOPs.
  explicit KeptOutputs(std::vector<std::string> ops, double product_flops = 1.0);

  enum class Mode : uint8_t { kRecord, kReplay };
  // Makes `store` this thread's for its scope (the previous one comes back after); a null
  // store keeps and replays nothing in its scope (FSDP's gathers of a module sharded inside a
  // checkpointed one: they are its own, released and gathered again as it says).
  class Scope {
   public:
    Scope(KeptOutputs* store, Mode mode);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::pair<KeptOutputs*, Mode> previous_;
  };

  // Whether a store is in scope on this thread (a checkpointed forward or recompute runs).
  static bool in_scope();
  // After the recorded forward: of the recorded products, keeps those with the most recompute
  // FLOPs per kept byte first (ties: the smaller result, then call order) while the ones kept
  // hold less than product_flops of all the products' FLOPs, and releases the rest. Greedy,
  // so the FLOPs the replay saves cost the fewest bytes (a down-projection, whose result is
  // a quarter of its FLOPs' width, before the up-projection that feeds it).
  void select();
  // Drops what is still kept (after the recompute: whatever it did not take back).
  void clear() { entries_.clear(); }

 private:
  friend std::vector<Tensor> kept_or_computed(std::string_view op, const std::function<std::vector<Tensor>()>& compute,
                                              int64_t contraction);
  struct Entry {
    std::string op;
    std::vector<Tensor> outputs;  // empty once released by select() or taken back
    int64_t flops = 0;            // a product's recompute cost: 2 x contraction x result elements
    int64_t bytes = 0;
    bool kept = true;
  };

  std::vector<std::string> ops_;
  double product_flops_;
  std::vector<Entry> entries_;  // in call order
  size_t replayed_ = 0;         // the replay's next entry
};

// `compute()`'s results, kept or taken back as the store in scope says (above), for an op
// of kKeepableOps; a product passes its contraction length (each result element costs
// 2 x contraction FLOPs to compute again). InternalError when a replay finds another op's
// results next (the recompute took another path than the forward).
std::vector<Tensor> kept_or_computed(std::string_view op, const std::function<std::vector<Tensor>()>& compute,
                                     int64_t contraction = 0);

}  // namespace dtr
