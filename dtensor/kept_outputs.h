// KeptOutputs: selective activation checkpointing's store of op outputs (nn/checkpoint.h),
// the engine's part, so that no op needs to know about checkpointing beyond one call.
//
// The ops selective checkpointing may keep (kKeepableOps: the matrix products, attention and
// every redistribute, the ops that are expensive or communicate) compute their local
// results through kept_or_computed(op, compute). While a checkpointed forward runs under a
// KeptOutputs::Scope in kRecord mode whose policy names the op, they are computed and kept,
// in call order; while that forward's recompute runs in kReplay mode they are taken back, in
// the same order, instead of computed (the op then records its autograd node as it would
// have, from the same inputs: the recompute is bitwise the forward, so its calls and values
// are the same). Elsewhere kept_or_computed computes. Of the matrix products (matmul, bmm,
// linear) a store may keep only every k-th call in order, the first, the (k+1)-th, ...
// (torchtitan's policy recomputes every second mm); the replay counts the same calls, so it
// computes exactly the ones not kept. So between forward and backward a selectively
// checkpointed module holds its inputs and the kept results, and its recompute multiplies
// only the products not kept and never communicates.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
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
  // Keeps the outputs of `ops` (each one of kKeepableOps: ValueError naming the others), of
  // the products among them every `products_every`-th call (>= 1: ValueError otherwise).
  explicit KeptOutputs(std::vector<std::string> ops, int64_t products_every = 1);

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
  // Drops what is still kept (after the recompute: whatever it did not take back).
  void clear() { kept_.clear(); }

 private:
  friend std::vector<Tensor> kept_or_computed(std::string_view op, const std::function<std::vector<Tensor>()>& compute);
  // Whether this call of `op` is kept (record) or taken back (replay); counts the products.
  bool keeps(std::string_view op, Mode mode);

  std::vector<std::string> ops_;
  int64_t products_every_;
  std::array<int64_t, 2> products_seen_{};  // per mode: the recompute counts from the first again
  std::deque<std::pair<std::string, std::vector<Tensor>>> kept_;
};

// `compute()`'s results, kept or taken back as the store in scope says (above), for an op
// of kKeepableOps. InternalError when a replay finds another op's results next (the
// recompute took another path than the forward).
std::vector<Tensor> kept_or_computed(std::string_view op, const std::function<std::vector<Tensor>()>& compute);

}  // namespace dtr
