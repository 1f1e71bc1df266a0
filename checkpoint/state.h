// Distributed checkpoints (PyTorch's torch.distributed.checkpoint, "DCP"): a flat state of
// DTensors saved by every rank writing only its own shards, and loaded by every rank reading
// only the byte ranges its shards overlap, so a checkpoint saved on one mesh loads on any
// other (any world size, mesh shape and placements: resharding is free).
//
// A checkpoint is a directory: `__<rank>_0.safetensors` per rank (its chunks; a Replicate
// tensor's only from the ranks at coordinate 0 of its replicated mesh dims, so it is
// written once) and `.metadata.json` (every tensor's global shape, dtype, mesh, placements
// and chunks with byte ranges and CRC32C checksums, and `extra`). save writes everything
// into `<dir>.tmp-<token>`, fsyncs it, and once every rank is done renames it to `dir`: a
// save that dies midway leaves the previous checkpoint intact. async_save stages the shards
// to host memory and writes them on a background thread, committing at wait(); every
// collective stays on the calling thread. docs/checkpoint.md has the format, the commit
// protocol, what load verifies and async save's design. This header holds what save and
// load exchange: the state and the progress they report.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "dtensor/dtensor.h"

namespace dtr::checkpoint {

// A flat state: stable names ("model.layers.0.attn.in_proj_weight", "optim.state.3.exp_avg")
// to DTensors, and small JSON entries (step, RNG seed, data position) in `extra`.
struct State {
  std::map<std::string, DTensor> tensors;
  nlohmann::json extra;
};

// How far this rank's part of a save or load is. save and async_save count the data bytes
// of this rank's file (its chunks, headers excluded: `total_bytes` is the sum of the nbytes
// of the chunks it writes, 0 on a rank that writes none); load counts the bytes of this
// rank's local chunks of the requested tensors (`total_bytes` is the sum of their nbytes),
// whatever the file layout it reads them from.
struct Progress {
  int64_t done_bytes = 0;
  int64_t total_bytes = 0;
};

// Called on the thread doing the I/O (save's and load's caller; async_save's background
// writer thread, so it must synchronise anything it shares and must not communicate), at
// most about once a second while bytes move and once at the end with done_bytes ==
// total_bytes (not when the I/O fails). An exception it throws fails the save or load.
using ProgressCallback = std::function<void(const Progress&)>;

}  // namespace dtr::checkpoint
