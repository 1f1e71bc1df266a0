// Work: the handle every collective returns at once, while the collective runs on its
// group's communication thread (CPU) or stream (GPU).
//
// A Work finishes exactly once, successfully or with the collective's error (a
// DistributedError naming group, collective, sizes and peer). A host wait rethrows that
// error; it never blocks forever: after its timeout it throws DistributedError(kTimeout)
// even if the collective is still running. A host wait that grants the collective its whole
// timeout may run it on the calling thread, when it is next in line and the group's thread
// is idle: issue-then-wait then costs no thread handoff.
//
// A collective on a device stream (NCCL) is waited on the device: wait() only makes the
// calling thread's current stream wait for it (an event), so the kernels that read its
// result run after it while the host goes on (c10d's WorkNCCL::wait); synchronize() blocks
// the host. Handles are shared: copies refer to one collective (c10d's Work, without
// futures or callbacks).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace dtr {

class Work {
 public:
  // A work that has already finished successfully (a collective with nothing to move).
  Work();
  // A running collective, collective `seq` of `group`. A host wait without an argument gives
  // up after `timeout`. run_inline, if given, runs the collective on the calling thread when
  // its backend allows it now (else it does nothing); a host wait calls it before blocking,
  // unless given less than timeout. device_wait, if given (a collective on a device stream),
  // makes the calling thread's current stream wait for the collective; wait() then calls it
  // instead of blocking. While tracing is on, each wait is a trace span (category wait, with
  // the group and seq) whether it blocked, ran the collective or found it done.
  Work(std::string description, std::string group, uint64_t seq, std::chrono::milliseconds timeout,
       std::function<void()> run_inline = {}, std::function<void()> device_wait = {});

  // Host collectives: synchronize(). Device collectives: rethrows the error if the
  // collective already failed, else orders the current stream after it and returns at once.
  void wait() const;
  // Blocks the host until the collective finished and rethrows its error, or throws
  // DistributedError(kTimeout) once `timeout` (default: the collective's) has passed.
  void synchronize() const;
  void wait(std::chrono::milliseconds timeout) const;
  // Whether wait() ordered a stream after this collective: its result may be in use on the
  // device before the host knows whether it succeeded.
  bool waited_on_device() const;
  bool is_completed() const;
  // The error the collective failed with; null while it runs and after success.
  std::exception_ptr exception() const;
  // "all_reduce #3 on group 'default_pg'".
  const std::string& description() const { return state_->description; }

  // For backends: marks the collective finished (with its error, if any) and wakes waiters.
  // Returns waited_on_device() as it stood at that moment (one step with wait()'s check, so
  // a failed collective is either rethrown by wait() or reported consumed here).
  // `held` (the collective's tensors and staging buffers) is let go by the first host wait
  // that sees the collective done, on the waiter's thread, or with the last copy of the
  // Work: so memory is freed at a point of the caller's program, the same in every run,
  // not when the backend's thread happens to finish.
  bool finish(std::exception_ptr error = nullptr, std::shared_ptr<void> held = nullptr) const;

 private:
  struct State {
    std::string description;
    std::string group;
    uint64_t seq = 0;
    std::chrono::milliseconds timeout;
    std::function<void()> run_inline;
    std::function<void()> device_wait;
    mutable std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    bool waited_on_device = false;
    std::exception_ptr error;
    std::shared_ptr<void> held;
  };
  std::shared_ptr<State> state_;
};

}  // namespace dtr
