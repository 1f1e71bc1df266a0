// Full state dicts as files, memory-bounded: one .safetensors file, or Hugging Face's sharded
// layout (model-00001-of-0000N.safetensors ... and model.safetensors.index.json), with
// PyTorch's names, readable by safetensors.torch.load_file and DCP's HuggingFaceStorageReader.
//
// Save gathers one entry at a time (full_tensor, every rank taking part, as PyTorch's
// get_model_state_dict(full_state_dict=True) does); rank 0 of the default process group
// writes it and drops it, the other ranks drop it at once: each rank's extra memory is about
// one full tensor. The header is written first (every shape and dtype is known up front), so
// nothing else is held. Each file appears atomically (<file>.tmp, fsync, rename); the index
// is written last. Load reads no more than each rank's own chunk of every tensor: one pread
// per contiguous run of the chunk (one per tensor for Shard(0) and Replicate; one per row
// for Shard(1) of a matrix), so no rank materialises the whole model; the only communication is
// the outcome's (checkpoint/internal/rank_failure.h), so that when any rank fails every rank
// throws: the failed one its own error, the others the same type ("<op> '<path>': rank k
// failed: <its message>"), and nobody hangs in a later collective.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nn/module.h"

namespace dtr::checkpoint {

// Writes every state_dict() entry's full tensor to `path` (one .safetensors file). Collective
// over the default process group: every rank calls it; when rank 0 fails to write, every
// rank throws (rank 0 its own error, the others the same type naming rank 0 and the path).
void save_full_state_dict(nn::Module& module, const std::string& path);

// Loads `path` into `module`: each rank reads only its chunk of each entry, under the
// entry's current mesh and placements. A shape or dtype that differs is a ValueError or
// TypeError naming the file and the tensor; with nn::Strict::kYes, so is any missing or
// unexpected name (all of them listed, before anything changes). A truncated or corrupt file
// is a ValueError naming the file (and the tensor), a missing one an OSError. Collective over
// the default process group for the outcome only (every rank calls it): when any rank fails,
// every rank throws its error type, and no rank's module changes.
nn::LoadResult load_full_state_dict_file(nn::Module& module, const std::string& path,
                                         nn::Strict strict = nn::Strict::kYes);

// Hugging Face's default shard size (save_pretrained's max_shard_size="5GB").
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

// Hugging Face's sharded layout for entries of `bytes` each, in order: they fill
// model-00001-of-0000N.safetensors while they fit in `max_shard_bytes` (a larger one gets a
// file of its own); the index maps each entry's name to its file.
struct HfLayout {
  std::vector<std::vector<size_t>> files;  // the entries (indices) each file holds
  std::vector<std::string> file_names;
  int64_t total_bytes = 0;
  // model.safetensors.index.json's text: {"metadata": {"total_size"}, "weight_map"}.
  std::string index_json(const std::vector<std::string>& entry_names) const;
};
HfLayout plan_hf_layout(const std::vector<int64_t>& bytes, int64_t max_shard_bytes);
inline constexpr std::string_view kHfIndexName = "model.safetensors.index.json";

// Writes Hugging Face's sharded layout into `dir` (created if absent): entries in
// state_dict() order fill model-00001-of-0000N.safetensors while they fit in
// `max_shard_bytes` (a larger tensor gets a file of its own), then
// model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {name: file}}).
// Collective and memory-bounded like save_full_state_dict.
void save_hf_checkpoint(nn::Module& module, const std::string& dir, int64_t max_shard_bytes = kDefaultMaxShardBytes);

// Loads a Hugging Face checkpoint directory through its index (or its one model.safetensors
// when it has no index), each rank reading only its slices; errors as load_full_state_dict_file,
// plus a ValueError for an index naming a file or tensor that is not there.
nn::LoadResult load_hf_checkpoint(nn::Module& module, const std::string& dir, nn::Strict strict = nn::Strict::kYes);

}  // namespace dtr::checkpoint
