#include "collectives/work.h"

#include "collectives/collective_counter.h"
#include "collectives/distributed_error.h"
#include "core/trace.h"

namespace dtr {

Work::Work() : state_(std::make_shared<State>()) {
  state_->description = "a collective with nothing to move";
  state_->timeout = std::chrono::milliseconds(0);
  state_->done = true;
}

Work::Work(std::string description, std::string group, uint64_t seq, std::chrono::milliseconds timeout,
           std::function<void()> run_inline, std::function<void()> device_wait)
    : state_(std::make_shared<State>()) {
  state_->description = std::move(description);
  state_->group = std::move(group);
  state_->seq = seq;
  state_->timeout = timeout;
  state_->run_inline = std::move(run_inline);
  state_->device_wait = std::move(device_wait);
}

void Work::wait() const {
  if (!state_->device_wait) {
    synchronize();
    return;
  }
  trace::Span span("wait", trace::Category::kWait);
  if (span.active()) {
    span.arg("group", state_->group);
    span.arg("seq", static_cast<int64_t>(state_->seq));
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->error) std::rethrow_exception(state_->error);
    if (state_->done) return;  // its completion was observed: later work is ordered already
    state_->waited_on_device = true;
  }
  state_->device_wait();
}

void Work::synchronize() const { wait(state_->timeout); }

bool Work::waited_on_device() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->waited_on_device;
}

void Work::wait(std::chrono::milliseconds timeout) const {
  // The time spent here, whatever the outcome, counts as waiting on collectives.
  struct WaitTimer {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    ~WaitTimer() {
      collective_counter().record_wait(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
    }
  } timer;
  trace::Span span("wait", trace::Category::kWait);
  if (span.active()) {
    span.arg("group", state_->group);
    span.arg("seq", static_cast<int64_t>(state_->seq));
  }
  // Running it here is bounded by the collective's own timeout, so only a wait that grants
  // that much may do it.
  if (state_->run_inline && timeout >= state_->timeout && !is_completed()) state_->run_inline();
  std::unique_lock<std::mutex> lock(state_->mutex);
  if (!state_->done_cv.wait_for(lock, timeout, [&] { return state_->done; })) {
    throw DistributedError(DistributedErrorKind::kTimeout,
                           fmt::format("wait: {} did not finish within {} ms (a peer may be dead, hung or "
                                       "running a different collective)",
                                       state_->description, timeout.count()));
  }
  std::shared_ptr<void> held = std::move(state_->held);
  const std::exception_ptr error = state_->error;
  lock.unlock();
  held.reset();  // on this thread, outside the lock
  if (error) std::rethrow_exception(error);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->error;
}

bool Work::finish(std::exception_ptr error, std::shared_ptr<void> held) const {
  bool consumed = false;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    DTR_INTERNAL_ASSERT(!state_->done, "{} finished twice", state_->description);
    state_->done = true;
    state_->error = std::move(error);
    state_->held = std::move(held);
    consumed = state_->waited_on_device;
  }
  state_->done_cv.notify_all();
  return consumed;
}

}  // namespace dtr
