#include "tools/train/train_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "checkpoint/full_state_dict_file.h"
#include "collectives/init.h"
#include "core/error.h"
#include "nn/checkpoint.h"
#include "nn/init.h"
#include "nn/parameter.h"
#include "nn/transformer_plan.h"

namespace dtr::train {
namespace {

// --init-from: a full state dict (a safetensors file, or Hugging Face's sharded layout in a
// directory) loaded strictly. Names that do not match are counted in one line, with the
// first few, and listed whole in OUT/init_from_mismatch.txt (rank 0 writes it).
void init_from(nn::Module& net, const TrainConfig& c) {
  const bool hf = std::filesystem::is_directory(c.init_from);
  const nn::LoadResult r = hf ? checkpoint::load_hf_checkpoint(net, c.init_from, nn::Strict::kNo)
                              : checkpoint::load_full_state_dict_file(net, c.init_from, nn::Strict::kNo);
  if (r.missing_keys.empty() && r.unexpected_keys.empty()) return;
  const std::filesystem::path list = std::filesystem::path(c.out) / "init_from_mismatch.txt";
  if (default_group()->rank() == 0) {
    std::ofstream out(list);
    out << "missing keys (the model's, not in " << c.init_from << "):\n";
    for (const std::string& name : r.missing_keys) out << "  " << name << "\n";
    out << "unexpected keys (in " << c.init_from << ", not the model's):\n";
    for (const std::string& name : r.unexpected_keys) out << "  " << name << "\n";
  }
  throw ValueError(fmt::format(
      "--init-from {}: does not match the model (--arch {}, --layers {}): missing keys: {}; unexpected keys: {}; "
      "every name in {}",
      c.init_from, flag_value(c.arch), c.layers, list_summary(r.missing_keys), list_summary(r.unexpected_keys),
      list.string()));
}

// --parallel none without tensor parallelism: one process, training on its one-rank mesh.
bool one_process(const TrainConfig& c) { return c.parallel == Parallel::kNone && c.tp == 1; }

}  // namespace

DeviceMesh training_mesh(const TrainConfig& c, DeviceType device_type, int64_t world_size) {
  if (one_process(c)) return DeviceMesh::row_major(device_type, {1}, {}, 0, 1);
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  for (const auto& [name, size] : mesh_dims(c, world_size)) {
    names.push_back(name);
    shape.push_back(size);
  }
  return init_device_mesh(device_type, shape, names);
}

Model build_model(const TrainConfig& c, int64_t vocab, const DeviceMesh& mesh) {
  const ArchSwitches a = arch_switches(c);
  nn::manual_seed(c.seed);
  Model m;
  const Parallel parallel = c.parallel;
  // --parallel none trains on its one-rank mesh directly; the others build on the CPU's and
  // fully_shard / replicate / parallelize_module move the parameters to the mesh.
  const nn::ParameterOptions where{.mesh = one_process(c) ? std::optional<DeviceMesh>(mesh) : std::nullopt};
  const nn::TransformerConfig config{.vocab_size = vocab,
                                     .dim = c.dim,
                                     .n_layers = c.layers,
                                     .n_heads = c.heads,
                                     .causal = a.causal,
                                     .max_seq_len = a.pos_embed ? c.seq_len : 0,
                                     .final_norm = a.final_norm,
                                     .tie_embeddings = a.tie_embeddings,
                                     .dropout = c.dropout};
  m.net = std::make_unique<nn::Transformer>(config, where);
  if (c.arch == Arch::kGpt) {
    // GPT-2's embedding init: with the output tied to it, PyTorch's N(0, 1) would start
    // from logits of standard deviation sqrt(dim).
    for (auto& [name, p] : m.net->named_parameters()) {
      if (name == "embed.weight" || name == "pos_embed.weight") nn::normal_(*p, 0.0, 0.02);
    }
  }
  if (c.activation_checkpoint != ActivationCheckpoint::kNone) {  // before fully_shard and replicate
    const nn::CheckpointOptions policy =
        c.activation_checkpoint == ActivationCheckpoint::kSelective ? nn::selective_policy() : nn::CheckpointOptions{};
    for (size_t i = 0; i < m.net->layers().size(); i += static_cast<size_t>(c.ac_every)) {
      nn::checkpoint(m.net->layers().at<nn::TransformerBlock>(i), policy);
    }
  }
  // The mesh fully_shard or replicate works over: the data-parallel dims, beside "tp" under
  // tensor parallelism.
  DeviceMesh data_mesh = mesh;
  if (c.tp > 1) {
    nn::parallelize_module(*m.net, mesh[kTensorParallelDim],
                           nn::transformer_tp_plan(config, {.sequence_parallel = c.sequence_parallel,
                                                            .loss_parallel = c.loss_parallel,
                                                            .split_vocab = !c.deterministic}));
    if (parallel != Parallel::kNone) {
      const std::vector<std::string>& names = mesh.dim_names();
      data_mesh = mesh.submesh(std::vector<std::string>(names.begin(), names.end() - 1));
    }
  }
  if (parallel == Parallel::kDdp) {
    m.ddp = &nn::replicate(*m.net, data_mesh);
  } else if (parallel == Parallel::kFsdp || parallel == Parallel::kHsdp) {
    nn::FullyShardOptions options;
    if (c.mixed_precision) {
      options.mp_policy.param_dtype = kBFloat16;
      // Under --deterministic the reduction adds in bfloat16, as each rank's part of the tree
      // does (the ops' bfloat16 gradients): every addition of the tree then rounds alike on
      // every layout (PyTorch's reduce_dtype unset does the same). float32 otherwise.
      options.mp_policy.reduce_dtype = c.deterministic ? kBFloat16 : kFloat32;
    }
    if (c.cpu_offload) options.offload_policy = nn::CPUOffloadPolicy{};
    options.reshard_after_forward = c.reshard_after_forward;
    if (parallel == Parallel::kHsdp) options.shard_mesh_dim = data_mesh.dim_names().back();
    for (size_t i = 0; i < m.net->layers().size(); ++i) {
      m.blocks.push_back(&nn::fully_shard(m.net->layers().at<nn::TransformerBlock>(i), data_mesh, options));
    }
    options.reshard_after_forward.reset();  // the root keeps its parameters for backward
    // float32 logits for the loss; under --deterministic the loss stays bfloat16 until it is
    // reduced, in bfloat16, as each rank's part of its tree is (converted after).
    if (!c.deterministic) options.mp_policy.output_dtype = kFloat32;
    m.root = &nn::fully_shard(*m.net, data_mesh, options);
    if (c.prefetch > 0) nn::set_prefetch_depth(*m.root, m.blocks, c.prefetch);
  }
  if (!c.init_from.empty()) init_from(*m.net, c);
  return m;
}

std::string placements_summary(nn::Transformer& net, const DeviceMesh& mesh) {
  std::map<std::string, int64_t> counts;
  for (auto& [name, p] : net.named_parameters()) {
    const std::vector<std::string>& dims = p->mesh().dim_names();
    const bool other_dims = !dims.empty() && dims != mesh.dim_names();
    ++counts[placements_str(p->placements()) +
             (other_dims ? fmt::format(" on ({})", fmt::join(dims, ", ")) : std::string())];
  }
  std::string out;
  for (const auto& [placements, n] : counts) out += fmt::format("{}{} x {}", out.empty() ? "" : ", ", n, placements);
  return out;
}

int64_t parameter_count(nn::Transformer& net) {
  int64_t n = 0;
  for (auto& [name, p] : net.named_parameters()) n += p->numel();
  return n;
}

}  // namespace dtr::train
