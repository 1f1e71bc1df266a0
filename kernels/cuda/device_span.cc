#include "kernels/cuda/device_span.h"

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
  Pending(int device, std::string l, trace::Event e)
      : lane(std::move(l)), event(std::move(e)), begin(device, Event::Timing::kOn), end(device, Event::Timing::kOn) {}
};

namespace {

struct Anchor {
  Event event;
  int64_t host_ns = 0;
};

std::mutex g_mutex;
std::map<int, Anchor> g_anchors;  // by device, for the current run
std::vector<std::unique_ptr<DeviceSpan::Pending>> g_pending;

// The host time of a device event: the anchor's host time plus the device time between them.
int64_t host_ns_of(const Anchor& anchor, const Event& e) {
  return anchor.host_ns + static_cast<int64_t>(static_cast<double>(anchor.event.elapsed_ms(e)) * 1e6);
}

// At stop: every span's events, now complete, become events of its lane; the anchors go
// with the run.
void flush() {
  std::lock_guard lock(g_mutex);
  for (const std::unique_ptr<DeviceSpan::Pending>& p : g_pending) {
    p->end.synchronize();
    const Anchor& anchor = g_anchors.at(p->begin.device());
    p->event.begin_ns = host_ns_of(anchor, p->begin);
    p->event.end_ns = host_ns_of(anchor, p->end);
    trace::record_event(p->lane, std::move(p->event));
  }
  g_pending.clear();
  g_anchors.clear();
}

// The run's anchor on `stream`'s device, made (one host wait) at its first span.
void ensure_anchor(const Stream& stream) {
  static std::once_flag hooked;
  std::call_once(hooked, [] { trace::add_stop_hook(flush); });
  std::lock_guard lock(g_mutex);
  if (g_anchors.contains(stream.device())) return;
  Anchor a{Event(stream.device(), Event::Timing::kOn), 0};
  a.event.record(stream);
  a.event.synchronize();
  a.host_ns = trace::now_ns();
  g_anchors.emplace(stream.device(), std::move(a));
}

}  // namespace

DeviceSpan::DeviceSpan(const Stream& stream, std::string lane, std::string_view name, trace::Category category) {
  if (!trace::enabled(category)) return;
  ensure_anchor(stream);
  stream_ = &stream;
  pending_ = std::make_unique<Pending>(
      stream.device(), std::move(lane),
      trace::Event{.name = std::string(name), .category = category, .region = trace::current_region()});
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
