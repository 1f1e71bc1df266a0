#include "core/cuda/device_span.h"

#include <nlohmann/json.hpp>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace dtr::cuda {

struct DeviceSpan::Pending {
  std::string lane;
  trace::Event event;
  Event begin, end;
  uint64_t run;  // the tracing run it began in
  Pending(int device, std::string l, trace::Event e, uint64_t r)
      : lane(std::move(l)),
        event(std::move(e)),
        begin(device, Event::Timing::kOn),
        end(device, Event::Timing::kOn),
        run(r) {}
};

namespace {

// A device event and the host time it ran at. It is recorded on a stream of its own, idle,
// so the host's wait for it is not a wait for queued work (a collective stuck on a dead
// peer would stall it).
struct Anchor {
  Stream stream;
  Event event;
  int64_t host_ns = 0;
};

std::mutex g_mutex;               // guards the three below; never held while waiting for a device
uint64_t g_run = 0;               // the current run's number (a flush ends a run)
std::map<int, Anchor> g_anchors;  // by device, for the current run
std::vector<std::unique_ptr<DeviceSpan::Pending>> g_pending;

// The host time of a device event: the anchor's host time plus the device time between them.
int64_t host_ns_of(const Anchor& anchor, const Event& e) {
  return anchor.host_ns + static_cast<int64_t>(static_cast<double>(anchor.event.elapsed_ms(e)) * 1e6);
}

// At stop: every span of the run that ended, once its events completed, becomes an event
// of its lane; the anchors go with the run. A span still open at stop ends in the next
// run's list and is dropped there (its anchor is gone).
void flush() {
  std::map<int, Anchor> anchors;
  std::vector<std::unique_ptr<DeviceSpan::Pending>> pending;
  uint64_t run = 0;
  {
    std::lock_guard lock(g_mutex);
    anchors.swap(g_anchors);
    pending.swap(g_pending);
    run = g_run++;
  }
  for (const std::unique_ptr<DeviceSpan::Pending>& p : pending) {
    const auto anchor = anchors.find(p->begin.device());
    if (p->run != run || anchor == anchors.end()) continue;
    p->end.synchronize();
    p->event.begin_ns = host_ns_of(anchor->second, p->begin);
    p->event.end_ns = p->event.begin_ns + static_cast<int64_t>(static_cast<double>(p->begin.elapsed_ms(p->end)) * 1e6);
    trace::record_event(p->lane, std::move(p->event));
  }
}

// The run's anchor on `device`, made (one short host wait) at its first span; returns the run.
uint64_t ensure_anchor(int device) {
  static std::once_flag hooked;
  std::call_once(hooked, [] { trace::add_stop_hook(flush); });
  {
    std::lock_guard lock(g_mutex);
    if (g_anchors.contains(device)) return g_run;
  }
  Anchor a{Stream(device), Event(device, Event::Timing::kOn), 0};
  a.event.record(a.stream);
  a.event.synchronize();
  a.host_ns = trace::now_ns();
  std::lock_guard lock(g_mutex);
  g_anchors.try_emplace(device, std::move(a));  // a thread that made one first keeps its own
  return g_run;
}

}  // namespace

DeviceSpan::DeviceSpan(const Stream& stream, std::string lane, std::string_view name, trace::Category category) {
  if (!trace::enabled(category)) return;
  const uint64_t run = ensure_anchor(stream.device());
  stream_ = &stream;
  pending_ = std::make_unique<Pending>(
      stream.device(), std::move(lane),
      trace::Event{.name = std::string(name), .category = category, .region = trace::current_region()}, run);
  pending_->begin.record(stream);
}

DeviceSpan::~DeviceSpan() {
  if (!pending_) return;
  pending_->end.record(*stream_);
  std::lock_guard lock(g_mutex);
  g_pending.push_back(std::move(pending_));
}

void DeviceSpan::arg(std::string_view key, int64_t value) {
  if (active()) pending_->event.args.push_back({std::string(key), std::to_string(value)});
}

void DeviceSpan::arg(std::string_view key, std::string_view value) {
  if (active()) {
    pending_->event.args.push_back(
        {std::string(key), nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
  }
}

}  // namespace dtr::cuda
