#include "core/cuda/stream.h"

#include <array>
#include <mutex>
#include <utility>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#include "core/error.h"

namespace dtr::cuda {
namespace {

constexpr int kMaxDevices = 64;

// The thread's current stream per device; nullptr: the compute stream.
thread_local std::array<const Stream*, kMaxDevices> t_current{};

}  // namespace

void check_device(int device, const char* op) {
  const int n = device_count();
  DTR_CHECK(device >= 0 && device < n && device < kMaxDevices, ValueError,
            "{}: device cuda:{} does not exist ({} CUDA devices visible)", op, device, n);
}

Stream::Stream(int device, int priority) : device_(device) {
  check_device(device, "cuda::Stream");
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  DTR_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority), device);
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);  // queued work still runs; never throws
}

Stream::Stream(Stream&& other) noexcept : device_(other.device_), stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    device_ = other.device_;
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Stream::wait(const Event& event) const {
  DTR_CUDA_CHECK(cudaStreamWaitEvent(stream_, event.handle(), 0), device_);
}

bool Stream::query() const {
  const cudaError_t status = cudaStreamQuery(stream_);
  if (status == cudaErrorNotReady) return false;
  DTR_CUDA_CHECK(status, device_);
  return true;
}

void Stream::synchronize() const { DTR_CUDA_CHECK(cudaStreamSynchronize(stream_), device_); }

Event::Event(int device, Timing timing) : device_(device) {
  check_device(device, "cuda::Event");
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  DTR_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing == Timing::kOn ? cudaEventDefault : cudaEventDisableTiming),
                 device);
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(const Stream& stream) {
  DTR_CHECK(stream.device() == device_, ValueError,
            "cuda::Event::record: the event is on cuda:{} and the stream on cuda:{}", device_, stream.device());
  DTR_CUDA_CHECK(cudaEventRecord(event_, stream.handle()), device_);
}

bool Event::query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  DTR_CUDA_CHECK(status, device_);
  return true;
}

void Event::synchronize() const { DTR_CUDA_CHECK(cudaEventSynchronize(event_), device_); }

float Event::elapsed_ms(const Event& end) const {
  float ms = 0;
  DTR_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_), device_);
  return ms;
}

const Stream& compute_stream(int device) {
  check_device(device, "cuda::compute_stream");
  // Never destroyed: kernels may be queued from static destructors' tensors.
  static std::array<Stream*, kMaxDevices> streams{};
  static std::array<std::once_flag, kMaxDevices> once;
  std::call_once(once[device], [&] { streams[device] = new Stream(device); });
  return *streams[device];
}

const Stream& current_stream(int device) {
  check_device(device, "cuda::current_stream");
  const Stream* s = t_current[device];
  return s != nullptr ? *s : compute_stream(device);
}

StreamGuard::StreamGuard(const Stream& stream) : device_(stream.device()), previous_(t_current[stream.device()]) {
  t_current[device_] = &stream;
}

StreamGuard::~StreamGuard() { t_current[device_] = previous_; }

}  // namespace dtr::cuda
