#include "nn/tensor_parallel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "core/tensor.h"
#include "core/trace.h"
#include "dtensor/autograd.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "nn/parameter.h"

namespace dtr::nn {
namespace {

// `p` with a negative shard dim counted from the end of an `ndim`-dim activation.
Placement resolve(const Placement& p, int64_t ndim) {
  return p.is_shard() ? Shard(wrap_dim(p.shard_dim(), ndim, "parallel style layout")) : p;
}

// Whether a dotted module name matches a plan pattern, part by part (`*` matches one part).
bool matches(std::string_view pattern, std::string_view fqn) {
  while (true) {
    const size_t p = pattern.find('.'), f = fqn.find('.');
    const std::string_view head = pattern.substr(0, p), name = fqn.substr(0, f);
    if (head != "*" && head != name) return false;
    if (p == std::string_view::npos || f == std::string_view::npos) {
      return p == std::string_view::npos && f == std::string_view::npos;
    }
    pattern.remove_prefix(p + 1);
    fqn.remove_prefix(f + 1);
  }
}

// What the styles parallelise (attention: ColwiseParallel only, its packed input projection).
enum class Kind : uint8_t { kLinear, kEmbedding, kAttention };

Kind kind_of(Module& module, const std::string& fqn, std::string_view style) {
  if (dynamic_cast<Linear*>(&module) != nullptr) return Kind::kLinear;
  if (dynamic_cast<Embedding*>(&module) != nullptr) return Kind::kEmbedding;
  if (dynamic_cast<MultiheadAttention*>(&module) != nullptr && style == "ColwiseParallel") return Kind::kAttention;
  throw NotImplementedError(
      fmt::format("{}: module '{}' is a {}; the styles parallelise Linear and Embedding, and ColwiseParallel a "
                  "MultiheadAttention's input projection (its out_proj takes RowwiseParallel)",
                  style, fqn, module.type_name()));
}

// "RowwiseParallel 'layers.0.ffn.2'": how errors name a style where it applies.
std::string style_at(const ParallelStyle& style, const std::string& fqn) {
  return fmt::format("{} '{}'", style.name(), fqn);
}

// x itself, whose gradient is made x's placements on the way back, as the backward of a
// redistribute would (PyTorch's styles redistribute their inputs even when they already
// have the placements): a Partial input gradient is reduced once here, at the layer's
// input, instead of flowing up through the norms as Partial and being reduced parameter by
// parameter.
DTensor gradient_boundary(const DTensor& x) {
  if (!needs_grad(std::span(&x, 1))) return x;
  DTensor y(x.to_local(), x.spec());
  record("gradient_boundary", std::span(&x, 1), std::span(&y, 1),
         [placements = x.placements()](const std::vector<DTensor>& g) {
           return std::vector<DTensor>{g[0].redistribute(placements)};
         });
  return y;
}

// Where the tp mesh's dim is in `on`, the mesh of a value a style lays out: 0 on the tp mesh
// itself; on a mesh of the same root that has the tp mesh's dim (FSDP x TP's (dp, tp) mesh,
// the batch split over dp), that dim's index; -1 otherwise.
int64_t tp_dim_in(const DeviceMesh& on, const DeviceMesh& tp) {
  if (on == tp) return 0;
  const std::vector<std::string>& names = on.dim_names();
  if (tp.ndim() != 1 || tp.dim_names().empty() || on.root_mesh() != tp.root_mesh()) return -1;
  const auto it = std::find(names.begin(), names.end(), tp.dim_names()[0]);
  if (it == names.end() || on[*it] != tp) return -1;
  return it - names.begin();
}

// `values` laid out by `layouts` on `mesh`'s dim: each checked against its `arrive`
// placement and made its `desired` one (nullopt: left alone), the other mesh dims of a value
// on a larger mesh (tp_dim_in) unchanged. `what` ("RowwiseParallel 'fc'") and `kind`
// ("input") name them in errors.
Values lay_out(const Values& values, const PrepareLayouts& layouts, const DeviceMesh& mesh, const std::string& what,
               std::string_view kind) {
  DTR_CHECK(layouts.arrive.size() == values.size() && layouts.desired.size() == values.size(), ValueError,
            "{}: it has {} {}s but the layouts give {} to arrive as and {} desired; give one (or nullopt) for each",
            what, values.size(), kind, layouts.arrive.size(), layouts.desired.size());
  Values out = values;
  for (size_t i = 0; i < values.size(); ++i) {
    const DTensor& v = values[i];
    if (!layouts.arrive[i] && !layouts.desired[i]) continue;
    // One tensor given as several inputs (self-attention's query, key and value) moves once.
    const size_t j = first_same(values, i);
    if (j < i && layouts.arrive[j] == layouts.arrive[i] && layouts.desired[j] == layouts.desired[i]) {
      out[i] = out[j];
      continue;
    }
    const std::string name = values.size() == 1 ? fmt::format("its {}", kind) : fmt::format("{} {}", kind, i);
    const int64_t at = tp_dim_in(v.mesh(), mesh);
    DTR_CHECK(at >= 0, ValueError,
              "{}: {} {} is not on the tp mesh {} (or a mesh of its root with its dim, FSDP x TP's); "
              "parallelize_module moves the model's parameters there, the inputs are the caller's "
              "(distribute_tensor)",
              what, name, v.to_string(), mesh.to_string());
    const Placement& now = v.placements()[at];
    if (layouts.arrive[i]) {
      DTR_CHECK(now == resolve(*layouts.arrive[i], v.dim()), ValueError,
                "{}: {} arrives as {} but the plan says {} layout {} ({}); give the style the layout the previous "
                "module leaves",
                what, name, now.repr(), kind, layouts.arrive[i]->repr(), v.to_string());
    }
    if (layouts.desired[i]) {
      Placements target = v.placements();
      target[at] = resolve(*layouts.desired[i], v.dim());
      out[i] = v.placements() != target ? v.redistribute(target) : gradient_boundary(v);
    }
  }
  return out;
}

// Lays out `module`'s inputs by `inputs` before forward and its outputs by `outputs` after.
void register_layouts(Module& module, const std::string& what, const DeviceMesh& mesh,
                      std::optional<PrepareLayouts> inputs, std::optional<PrepareLayouts> outputs) {
  if (inputs) {
    module.register_forward_pre_hook([=](Module&, const Values& values) {
      return std::optional<Values>(lay_out(values, *inputs, mesh, what, "input"));
    });
  }
  if (outputs) {
    module.register_forward_hook([=](Module&, const Values&, const Values& values) {
      return std::optional<Values>(lay_out(values, *outputs, mesh, what, "output"));
    });
  }
}

// A style's hooks: one input, checked against `layouts.input` and made `want`; one output,
// made `layouts.output`.
void register_style_layouts(Module& module, const std::string& what, const DeviceMesh& mesh, const Layouts& layouts,
                            Placement want) {
  register_layouts(module, what, mesh, PrepareLayouts{{layouts.input}, {want}},
                   PrepareLayouts{{std::nullopt}, {layouts.output}});
}

// The sequence-parallel modules' parameters: their gradients (Partial, each rank's positions)
// are kept unreduced as they accumulate and reduced at the end of each backward in one
// coalesced all-reduce, instead of one per parameter.
class SequenceParallelGrads : public std::enable_shared_from_this<SequenceParallelGrads> {
 public:
  explicit SequenceParallelGrads(std::vector<DTensor> params) : params_(std::move(params)) {}

  // Hooks each parameter of `root`'s. `root` owns the state through a forward pre-hook, which
  // also forgets a reduction queued by a backward that threw (its callback was dropped); the
  // parameters' hooks hold it weakly, so no cycle keeps either alive.
  static void attach(Module& root, std::vector<DTensor> params) {
    auto state = std::make_shared<SequenceParallelGrads>(std::move(params));
    const std::weak_ptr<SequenceParallelGrads> weak = state;
    for (const DTensor& p : state->params_) {
      p.set_grad_placements({Partial()});
      p.register_post_accumulate_grad_hook([weak](const DTensor&) {
        if (const std::shared_ptr<SequenceParallelGrads> alive = weak.lock()) alive->on_gradient();
      });
    }
    root.register_forward_pre_hook([state](Module&, const Values&) -> std::optional<Values> {
      state->queued_ = false;
      return std::nullopt;
    });
  }

 private:
  void on_gradient() {
    if (queued_) return;
    queued_ = true;
    queue_callback([self = shared_from_this()] { self->reduce(); });
  }

  // A parameter this backward did not reach takes part with zeros (partial_grad).
  void reduce() {
    queued_ = false;
    std::vector<DTensor> grads;
    for (const DTensor& p : params_) grads.push_back(partial_grad(p, {Partial()}));
    const trace::CommPhase phase("all_reduce", "sequence-parallel parameters");
    const std::vector<DTensor> reduced = redistribute_coalesced(grads, {Replicate()});
    for (size_t i = 0; i < params_.size(); ++i) params_[i].set_grad(reduced[i]);
  }

  std::vector<DTensor> params_;
  bool queued_ = false;
};

}  // namespace

std::vector<std::pair<std::string, Placement>> ColwiseParallel::parameter_placements(Module& module,
                                                                                     const std::string& fqn) const {
  switch (kind_of(module, fqn, name())) {
    case Kind::kEmbedding: return {{"weight", Shard(1)}};
    case Kind::kAttention: {
      // q, k and v packed in one [3e, e]: each rank holds its heads' rows of all three.
      std::vector<std::pair<std::string, Placement>> out{{"in_proj_weight", StridedShard(0, 3)}};
      if (module.parameter("in_proj_bias").defined()) out.emplace_back("in_proj_bias", StridedShard(0, 3));
      return out;
    }
    case Kind::kLinear: break;
  }
  std::vector<std::pair<std::string, Placement>> out{{"weight", Shard(0)}};
  if (static_cast<Linear&>(module).bias().defined()) out.emplace_back("bias", Shard(0));
  return out;
}

void ColwiseParallel::register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  const std::string what = style_at(*this, fqn);
  if (kind_of(module, fqn, name()) != Kind::kAttention) {
    register_style_layouts(module, what, mesh, layouts_, Replicate());
    return;
  }
  const int64_t heads = static_cast<MultiheadAttention&>(module).num_heads();
  DTR_CHECK(heads % mesh.size() == 0, ValueError,
            "{}: {} heads do not split over the {} ranks of the tp mesh {}; the head count must be a multiple of "
            "the tp size",
            what, heads, mesh.size(), mesh.to_string());
  DTR_CHECK(layouts_.output == Shard(-1), ValueError,
            "{}: a MultiheadAttention's output is its out_proj's; leave ColwiseParallel's output layout at "
            "Shard(-1) (the heads stay split) and give out_proj RowwiseParallel with the layout wanted, got {}",
            what, layouts_.output.repr());
  // query, key and value made Replicate; the masks left alone.
  const std::optional<Placement> in = layouts_.input, none;
  register_layouts(module, what, mesh,
                   PrepareLayouts{{in, in, in, none, none}, {Replicate(), Replicate(), Replicate(), none, none}},
                   std::nullopt);
}

std::vector<std::pair<std::string, Placement>> RowwiseParallel::parameter_placements(Module& module,
                                                                                     const std::string& fqn) const {
  return {{"weight", kind_of(module, fqn, name()) == Kind::kEmbedding ? Shard(0) : Shard(1)}};
}

void RowwiseParallel::register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  // An Embedding's indices stay whole: each rank looks up the rows it holds (masked).
  const bool embedding = kind_of(module, fqn, name()) == Kind::kEmbedding;
  register_style_layouts(module, style_at(*this, fqn), mesh, layouts_, embedding ? Replicate() : Shard(-1));
}

std::vector<std::pair<std::string, Placement>> SequenceParallel::parameter_placements(Module& module,
                                                                                      const std::string& fqn) const {
  const bool known = dynamic_cast<LayerNorm*>(&module) != nullptr || dynamic_cast<RMSNorm*>(&module) != nullptr ||
                     dynamic_cast<Dropout*>(&module) != nullptr;
  DTR_CHECK(known, NotImplementedError,
            "{}: module '{}' is a {}; sequence parallelism runs LayerNorm, RMSNorm and Dropout", name(), fqn,
            module.type_name());
  return {};
}

void SequenceParallel::register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  register_style_layouts(module, style_at(*this, fqn), mesh, {Shard(sequence_dim_), Shard(sequence_dim_)},
                         Shard(sequence_dim_));
}

void PrepareModuleInput::register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  register_layouts(module, style_at(*this, fqn), mesh, layouts_, std::nullopt);
}

void PrepareModuleOutput::register_hooks(Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  register_layouts(module, style_at(*this, fqn), mesh, std::nullopt, layouts_);
}

void parallelize_module(Module& root, const DeviceMesh& mesh, const ParallelPlan& plan) {
  DTR_CHECK(mesh.ndim() == 1, ValueError,
            "parallelize_module: the tp mesh {} has {} dims; give a 1-D mesh, or mesh[\"tp\"] of a larger one",
            mesh.to_string(), mesh.ndim());
  // Which style each module takes.
  const std::vector<std::pair<std::string, Module*>> modules = root.named_modules();
  struct Planned {
    std::string fqn;
    Module* module;
    const ParallelStyle* style;
    std::string pattern;
  };
  std::vector<Planned> planned;
  for (const auto& [pattern, style] : plan) {
    DTR_CHECK(style != nullptr, ValueError, "parallelize_module: plan entry '{}' has no style", pattern);
    bool found = false;
    for (const auto& [fqn, module] : modules) {
      if (!matches(pattern, fqn)) continue;
      found = true;
      const auto twice = std::find_if(planned.begin(), planned.end(), [&](const Planned& p) { return p.fqn == fqn; });
      DTR_CHECK(twice == planned.end(), ValueError,
                "parallelize_module: module '{}' is named by plan entries '{}' and '{}'; give each module one style",
                fqn, twice == planned.end() ? "" : twice->pattern, pattern);
      planned.push_back({fqn, module, style.get(), pattern});
    }
    std::vector<std::string> all;
    for (const auto& [fqn, _] : modules) all.push_back(fqn.empty() ? "\"\"" : "'" + fqn + "'");
    DTR_CHECK(found, ValueError, "parallelize_module: plan entry '{}' names no module of {}; its modules: {}", pattern,
              root.type_name(), fmt::join(all, ", "));
  }
  // Each planned parameter's placement, by the tensor (ties: one tensor, one placement).
  std::vector<std::pair<DTensor, Placement>> placed;
  for (const Planned& p : planned) {
    for (const auto& [param, placement] : p.style->parameter_placements(*p.module, p.fqn)) {
      const DTensor& value = p.module->parameter(param);
      const auto tied =
          std::find_if(placed.begin(), placed.end(), [&](const auto& e) { return e.first.is_same(value); });
      if (tied == placed.end()) {
        placed.emplace_back(value, placement);
        continue;
      }
      DTR_CHECK(tied->second == placement, ValueError,
                "parallelize_module: '{}.{}' is tied to a parameter another style places as {}; {} wants {} (a tied "
                "weight needs one placement)",
                p.fqn, param, tied->second.repr(), p.style->name(), placement.repr());
    }
  }
  // Every slot of a tensor gets the same new DTensor.
  std::vector<std::pair<DTensor, DTensor>> moved;
  for (auto& [name, slot] : root.named_parameters(RemoveDuplicate::kNo)) {
    const auto done = std::find_if(moved.begin(), moved.end(), [&](const auto& e) { return e.first.is_same(*slot); });
    if (done != moved.end()) {
      *slot = done->second;
      continue;
    }
    DTR_CHECK(slot->spec().is_replicated(), ValueError,
              "parallelize_module: parameter '{}' is {}, already sharded; parallelize_module takes the model as "
              "built (Replicate parameters), before fully_shard",
              name, slot->to_string());
    const auto it = std::find_if(placed.begin(), placed.end(), [&](const auto& e) { return e.first.is_same(*slot); });
    const Placement placement = it == placed.end() ? Replicate() : it->second;
    const DTensor before = *slot;
    *slot = distribute_parameter(before, mesh, {placement}, mesh.device());
    moved.emplace_back(before, *slot);
  }
  for (auto& [name, buffer] : root.named_buffers()) {
    if (buffer->defined() && buffer->mesh() != mesh && buffer->spec().is_replicated()) {
      *buffer = DTensor(buffer->to_local().to(mesh.device()),
                        DTensorSpec(mesh, {Replicate()}, buffer->shape(), buffer->dtype()));
    }
  }
  std::vector<DTensor> sequence_parallel;
  for (const Planned& p : planned) {
    p.style->register_hooks(*p.module, p.fqn, mesh);
    if (dynamic_cast<const SequenceParallel*>(p.style) == nullptr) continue;
    for (const auto& [_, param] : p.module->named_parameters()) {
      if (param->requires_grad()) sequence_parallel.push_back(*param);
    }
  }
  if (!sequence_parallel.empty()) SequenceParallelGrads::attach(root, std::move(sequence_parallel));
}

void parallelize_module(Module& root, const DeviceMesh& mesh, std::shared_ptr<const ParallelStyle> style) {
  parallelize_module(root, mesh, ParallelPlan{{"", std::move(style)}});
}

}  // namespace dtr::nn
