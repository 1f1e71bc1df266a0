// Loading a distributed checkpoint (PyTorch's dcp.load): every rank reads only the byte
// ranges its shards overlap, so a checkpoint saved on one mesh loads on any other (any
// world size, mesh shape and placements). Every chunk read is checked against its CRC32C.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/state.h"

namespace dtr::checkpoint {

// Loads every tensor of `state.tensors` from `dir` under its current mesh and placements,
// and `state.extra`. Each entry is replaced by a new DTensor of the same spec (locals are
// values: nothing is written into the old one's storage; a leaf that required grad still
// does). A name missing from the checkpoint, a shape or dtype that differs, a directory
// without metadata (an incomplete save) are ValueErrors; a missing file an OSError; a
// truncated file or a checksum mismatch a ValueError naming the file and the tensor.
// Collective like save; when any rank fails every rank throws and `state` is unchanged.
void load(State& state, const std::string& dir, const ProgressCallback& on_progress = {});

// The names of the tensors the checkpoint in `dir` holds, sorted: its metadata alone, read
// and checked as load reads it (on this rank: not collective).
std::vector<std::string> saved_tensor_names(const std::string& dir);

// Whether `dir` holds a committed checkpoint (its metadata, written last, is there).
bool is_committed_checkpoint(const std::string& dir);

}  // namespace dtr::checkpoint
