// Tensor parallelism (PyTorch's torch.distributed.tensor.parallel): parallelize_module gives
// chosen submodules a parallel style, which places their parameters on the tensor-parallel
// mesh and redistributes their inputs and outputs around forward (Megatron's column- and
// row-wise splits). Nothing else is special: the DTensor ops' sharding rules compute on the
// shards, and autograd moves each gradient back through the same redistributes.
//
// A Linear under ColwiseParallel holds rows of its weight (Shard(0): its output features)
// and of its bias; its input is made Replicate and its output comes out Shard(-1). Under
// RowwiseParallel it holds columns of its weight (Shard(1): its input features) and the whole
// bias; its input is made Shard(-1), the product is Partial, and the output is made
// Replicate (one all-reduce). Col then row, as in an MLP, moves data once in forward (the
// row layer's all-reduce) and once in backward (the col layer's input gradient).
//
// Inputs and outputs are DTensors here as everywhere in dtr, so PyTorch's use_local_output
// has no counterpart: a style's output is a DTensor on the tp mesh that the next op reads
// with its placements.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/dtensor.h"
#include "nn/module.h"

namespace dtr::nn {

// How one module is parallelised: where its parameters go and how its input and output are
// laid out around forward.
class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // "ColwiseParallel": messages name the style.
  virtual std::string name() const = 0;
  // The placement on the tp mesh of each of `module`'s own parameters (by name) the style
  // shards; the others stay Replicate. NotImplementedError naming `fqn` and the module's
  // type for a module the style does not know.
  virtual std::vector<std::pair<std::string, Placement>> parameter_placements(Module& module,
                                                                              const std::string& fqn) const = 0;
  // Registers the hooks that lay out `module`'s input and output on `mesh` (1-D).
  virtual void register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const = 0;
};

// Where a style expects the input and leaves the output, on the tp mesh dim. Shard(-1)
// counts from the activation's last dim.
struct Layouts {
  Placement input;
  Placement output;
};

// Linear: weight Shard(0), bias Shard(0); Embedding: weight Shard(1) (columns of every row).
// Defaults: input Replicate, output Shard(-1).
class ColwiseParallel : public ParallelStyle {
 public:
  explicit ColwiseParallel(Layouts layouts = {Replicate(), Shard(-1)}) : layouts_(layouts) {}
  std::string name() const override { return "ColwiseParallel"; }
  std::vector<std::pair<std::string, Placement>> parameter_placements(Module& module,
                                                                      const std::string& fqn) const override;
  void register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const override;

 private:
  Layouts layouts_;
};

// Linear: weight Shard(1), bias Replicate; Embedding: weight Shard(0) (rows of the vocabulary,
// looked up masked: a rank gives zeros for the indices it lacks, so the output is Partial)
// with the indices kept whole (give it Layouts{Replicate(), ...}, as torchtitan does).
// Defaults: input Shard(-1), output Replicate.
class RowwiseParallel : public ParallelStyle {
 public:
  explicit RowwiseParallel(Layouts layouts = {Shard(-1), Replicate()}) : layouts_(layouts) {}
  std::string name() const override { return "RowwiseParallel"; }
  std::vector<std::pair<std::string, Placement>> parameter_placements(Module& module,
                                                                      const std::string& fqn) const override;
  void register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const override;

 private:
  Layouts layouts_;
};

// Sequence parallelism (Megatron's): LayerNorm, RMSNorm and Dropout run on activations
// sharded along the sequence, their parameters Replicate; the input must arrive
// Shard(sequence_dim) (a rowwise layer before it leaves Layouts{Shard(-1), Shard(1)}: a
// reduce-scatter instead of an all-reduce) and the output stays so (a colwise layer after it
// takes Layouts{Shard(1), ...}: an all-gather). The parameters' gradients are Partial (each
// rank sums its own positions): they stay unreduced while backward runs and the
// sequence-parallel parameters of one parallelize_module call are all-reduced together at its
// end, one coalesced collective (so the optimizer step issues none).
class SequenceParallel : public ParallelStyle {
 public:
  explicit SequenceParallel(int64_t sequence_dim = 1) : sequence_dim_(sequence_dim) {}
  std::string name() const override { return "SequenceParallel"; }
  std::vector<std::pair<std::string, Placement>> parameter_placements(Module& module,
                                                                      const std::string& fqn) const override;
  void register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const override;

 private:
  int64_t sequence_dim_;
};

// Lays out a module's inputs (PrepareModuleInput) or outputs (PrepareModuleOutput) on the tp
// mesh without touching its parameters, for any module: where a block expects its input,
// and what it hands on. One entry per input (output) in order: the placement it must
// arrive as and the one it is made; nullopt leaves that one alone (PyTorch's None).
struct PrepareLayouts {
  std::vector<std::optional<Placement>> arrive;
  std::vector<std::optional<Placement>> desired;
};

class PrepareModuleInput : public ParallelStyle {
 public:
  explicit PrepareModuleInput(PrepareLayouts layouts) : layouts_(std::move(layouts)) {}
  std::string name() const override { return "PrepareModuleInput"; }
  std::vector<std::pair<std::string, Placement>> parameter_placements(Module&, const std::string&) const override {
    return {};
  }
  void register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const override;

 private:
  PrepareLayouts layouts_;
};

class PrepareModuleOutput : public ParallelStyle {
 public:
  explicit PrepareModuleOutput(PrepareLayouts layouts) : layouts_(std::move(layouts)) {}
  std::string name() const override { return "PrepareModuleOutput"; }
  std::vector<std::pair<std::string, Placement>> parameter_placements(Module&, const std::string&) const override {
    return {};
  }
  void register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const override;

 private:
  PrepareLayouts layouts_;
};

// A plan: module names (dotted, as named_modules gives them; `*` stands for one name part,
// "layers.*.ffn.0") to styles.
using ParallelPlan = std::map<std::string, std::shared_ptr<const ParallelStyle>>;

// Parallelises `root` over the 1-D `mesh` (a 1-D mesh, or mesh["tp"] of a larger one) by
// `plan`. Every parameter of `root` must be Replicate (on any mesh: the model as built);
// each becomes, on every rank without communication, its chunk on `mesh` under its style's
// placement, or Replicate there (a tied parameter stays one tensor: its slots get the same
// DTensor, and two styles that place it differently are a ValueError). Replicate buffers
// move to `mesh` too. ValueError for a pattern that names no module, a module two patterns
// name, a parameter already sharded, or a mesh that is not 1-D.
void parallelize_module(Module& root, const DeviceMesh& mesh, const ParallelPlan& plan);
// The root itself under one style.
void parallelize_module(Module& root, const DeviceMesh& mesh, std::shared_ptr<const ParallelStyle> style);

}  // namespace dtr::nn
