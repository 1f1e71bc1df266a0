// Saving a distributed checkpoint (PyTorch's dcp.save and dcp.async_save): every rank writes
// only its own shards into a temporary directory that becomes the checkpoint in one atomic
// step once every rank's file is on disk (checkpoint/internal/commit.h), so a save that dies
// midway leaves the previous checkpoint intact. async_save stages the shards to host memory
// and writes them on a background thread, committing at wait(); every collective stays on
// the calling thread. checkpoint/state.h says what a checkpoint holds; docs/checkpoint.md
// has the format and the protocol.
#pragma once

#include <memory>
#include <string>

#include "checkpoint/state.h"

namespace dtr::checkpoint {

// Saves `state` into `dir`, replacing a checkpoint already there atomically (a directory
// that is neither empty nor a checkpoint is refused). Collective over the default process
// group (a world of one without one): every rank calls it with the same names, shapes,
// dtypes, placements and `extra` (ValueError otherwise). A Partial tensor is a ValueError:
// reduce it first. When any rank fails, every rank throws and `dir` is unchanged (but for
// a failed fsync of the parent directory after the new checkpoint moved into place, which
// the error says).
void save(const State& state, const std::string& dir, const ProgressCallback& on_progress = {});

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
