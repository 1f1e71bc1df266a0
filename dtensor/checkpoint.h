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
// protocol, what load verifies and async save's design.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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

// Saves `state` into `dir`, replacing a checkpoint already there atomically (a directory
// that is neither empty nor a checkpoint is refused). Collective over the default process
// group (a world of one without one): every rank calls it with the same names, shapes,
// dtypes, placements and `extra` (ValueError otherwise). A Partial tensor is a ValueError:
// reduce it first. When any rank fails, every rank throws and `dir` is unchanged (but for
// a failed fsync of the parent directory after the new checkpoint moved into place, which
// the error says).
void save(const State& state, const std::string& dir, const ProgressCallback& on_progress = {});

// Loads every tensor of `state.tensors` from `dir` under its current mesh and placements,
// and `state.extra`. Each entry is replaced by a new DTensor of the same spec (locals are
// values: nothing is written into the old one's storage; a leaf that required grad still
// does). A name missing from the checkpoint, a shape or dtype that differs, a directory
// without metadata (an incomplete save) are ValueErrors; a missing file an OSError; a
// truncated file or a checksum mismatch a ValueError naming the file and the tensor.
// Collective like save; when any rank fails every rank throws and `state` is unchanged.
void load(State& state, const std::string& dir, const ProgressCallback& on_progress = {});

namespace internal {
struct PendingSave;
}

// The handle of an async_save (PyTorch's dcp.async_save future). wait() is collective:
// every rank calls it (or the next async_save, which calls it for them).
class AsyncSave {
 public:
  AsyncSave() = default;  // nothing to wait for
  explicit AsyncSave(std::shared_ptr<internal::PendingSave> pending) : pending_(std::move(pending)) {}

  // Waits for this rank's background write, then commits on every rank as save does; throws
  // the error save would have (every rank throws when one failed). Once done, a further
  // wait() returns, or rethrows the same error, without communicating.
  void wait();
  // Whether the save is done (committed or failed); false while wait() is still due.
  bool done() const;
  // Whether this rank's background write has ended (written or failed), so that wait()
  // would not block on it; asks no other rank. A caller commits without stalling by
  // agreeing with the others that every rank's write has ended, then calling wait().
  bool written() const;

 private:
  std::shared_ptr<internal::PendingSave> pending_;
};

// Whether `dir` holds a committed checkpoint (its metadata, written last, is there).
bool is_committed_checkpoint(const std::string& dir);

// Saves `state` into `dir` as save does, but returns once every local shard is copied to
// host memory: the tensors may change right away. The rank files are written and fsync'ed
// on a background thread; the commit (metadata, rename) happens at wait(). Every
// collective runs on the calling thread (here and in wait()), never on the background one,
// so training's collectives on the same groups cannot interleave with the checkpoint's.
// First waits for the previous async_save of this process still pending; if that one
// failed, its error is thrown here and no new save starts. Errors in this rank's checks
// (Partial, a directory that is not a checkpoint) are thrown here, at once; ranks whose
// states disagree are found when the chunk lists are exchanged, at wait().
// Collective over the default process group, like save. `on_progress` is copied and called
// on the background writer thread, never after wait() returns.
AsyncSave async_save(const State& state, const std::string& dir, const ProgressCallback& on_progress = {});

}  // namespace dtr::checkpoint
