#include "collectives/process_group_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/distributed_error.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/device_span.h"
#include "core/cuda/stream.h"
#include "core/trace.h"

namespace dtr {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kWaitMargin{5000};
constexpr std::chrono::milliseconds kWatchdogPeriod{1};

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case kFloat32: return ncclFloat32;
    case kFloat64: return ncclFloat64;
    case kBFloat16: return ncclBfloat16;
    case kFloat16: return ncclFloat16;
    case kInt32: return ncclInt32;
    case kInt64: return ncclInt64;
    case kBool: break;
  }
  DTR_INTERNAL_ASSERT(false, "nccl: {} reached the backend; ProcessGroup rejects it", d);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  DTR_INTERNAL_ASSERT(false, "unknown ReduceOp {}", static_cast<int>(op));
}

// The one owner of an NCCL communicator (FileDescriptor's idea, for an ncclComm_t): made
// through init_target(), freed exactly once whatever throws afterwards. Destruction aborts
// it (ncclCommAbort frees it at once, cancelling what is queued, and never waits for a
// peer, so no error path can hang in it); a clean shutdown finalizes it and calls destroy().
// Empty (owning nothing) before ncclCommInitRank* and after abort() or destroy().
class NcclComm {
 public:
  NcclComm() = default;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() { abort(); }

  ncclComm_t get() const { return comm_; }
  // Where ncclCommInitRank* writes the new communicator: the handle owns it from then on,
  // including when the call fails after writing it (a non-blocking init in progress).
  ncclComm_t* init_target() {
    DTR_INTERNAL_ASSERT(comm_ == nullptr, "a second communicator into one NcclComm");
    return &comm_;
  }
  // ncclCommAbort, once; the handle is empty afterwards.
  void abort() noexcept {
    if (comm_ != nullptr) ncclCommAbort(std::exchange(comm_, nullptr));
  }
  // ncclCommDestroy of a communicator whose ncclCommFinalize has settled; empty afterwards.
  void destroy() noexcept {
    if (comm_ != nullptr) ncclCommDestroy(std::exchange(comm_, nullptr));
  }

 private:
  ncclComm_t comm_ = nullptr;
};

}  // namespace

struct ProcessGroupNCCL::Impl {
  // An issued collective. It holds c's buffers (and the tensors pack and unpack name) until
  // its event completes, so the host may drop its own references at once: the memory is
  // not reused before the communication stream is done with it.
  struct Pending {
    Collective c;
    Work work;
    std::shared_ptr<cuda::Event> done;
    Clock::time_point start;
  };

  ProcessGroupNCCL& group;
  int device;
  std::optional<cuda::Stream> stream;  // the group's communication stream
  std::string comm_lane;               // its trace lane: "cuda:0 nccl default_pg"
  Tensor barrier_buffer;
  // Empty once aborted. Declared after the stream and the buffer its calls use, so that when
  // a constructor that throws destroys them, the communicator is aborted first.
  NcclComm comm;
  std::mutex mutex;            // guards comm calls, pending and broken
  std::condition_variable cv;  // a collective was issued, or the group is going
  std::deque<Pending> pending;
  // Failed collectives, after the abort: their buffers stay until the stream has passed
  // them (copies queued behind an aborted kernel may still run), then the watchdog drops them.
  std::deque<Pending> retired;
  std::optional<DistributedError> broken;
  bool stopping = false;
  std::thread watchdog;

  Impl(ProcessGroupNCCL& g, int d) : group(g), device(d) {}

  // Throws DistributedError(kBackend) naming the call, device, rank and NCCL's own message.
  void check(ncclResult_t result, const char* call) const {
    if (result == ncclSuccess || result == ncclInProgress) return;
    const char* last = comm.get() != nullptr ? ncclGetLastError(comm.get()) : "";
    throw DistributedError(DistributedErrorKind::kBackend,
                           fmt::format("{} failed on cuda:{} (rank {} of group '{}'): {} ({})", call, device,
                                       group.rank(), group.name(), ncclGetErrorString(result), last));
  }
  // The communicator is non-blocking: a call may return ncclInProgress with its work not
  // yet on the stream (the first collective between two ranks connects them, and a peer
  // that never comes would otherwise hold the host, under the mutex, inside NCCL). Waits,
  // polling NCCL, until the last call has settled; DistributedError(kTimeout) naming `what`
  // after the group's timeout, kBackend for an error.
  void settle(const std::string& what);
  void launch(const Collective& c);
  void abort_all(DistributedErrorKind kind, const std::string& reason);
  void watch();
};

#define DTR_NCCL_CHECK(call) check((call), #call)

void ProcessGroupNCCL::Impl::settle(const std::string& what) {
  const Clock::time_point deadline = Clock::now() + group.timeout();
  while (true) {
    ncclResult_t state = ncclSuccess;
    DTR_NCCL_CHECK(ncclCommGetAsyncError(comm.get(), &state));
    if (state == ncclSuccess) return;
    check(state, what.c_str());  // an error: throws
    if (Clock::now() > deadline) {
      throw DistributedError(DistributedErrorKind::kTimeout,
                             fmt::format("{} on cuda:{} (rank {} of group '{}'): NCCL did not finish setting it up "
                                         "within the group's timeout of {} ms (a peer that never joined?)",
                                         what, device, group.rank(), group.name(), group.timeout().count()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void ProcessGroupNCCL::Impl::launch(const Collective& c) {
  const ncclDataType_t type = nccl_type(c.dtype);
  const size_t elem = itemsize(c.dtype);
  cudaStream_t s = stream->handle();
  auto* in = static_cast<char*>(c.input.numel() > 0 ? c.input.data() : nullptr);
  auto* out = static_cast<char*>(c.output.numel() > 0 ? c.output.data() : nullptr);
  const int n = group.size(), rank = group.rank();
  auto equal = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; });
  };
  switch (c.kind) {
    case CollectiveKind::kAllReduce:
      if (c.output.numel() == 0) return;
      DTR_NCCL_CHECK(ncclAllReduce(out, out, c.output.numel(), type, nccl_op(c.op), comm.get(), s));
      return;
    case CollectiveKind::kAllGather: {
      if (c.output.numel() == 0) return;
      const int64_t mine = c.output_counts[rank];
      if (equal(c.output_counts)) {
        DTR_NCCL_CHECK(ncclAllGather(in, out, mine, type, comm.get(), s));
        return;
      }
      DTR_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < n; ++r) {
        if (c.output_counts[r] == 0) continue;
        char* block = out + Collective::offset_of(c.output_counts, r) * elem;
        DTR_NCCL_CHECK(ncclBroadcast(r == rank ? in : block, block, c.output_counts[r], type, r, comm.get(), s));
      }
      DTR_NCCL_CHECK(ncclGroupEnd());
      return;
    }
    case CollectiveKind::kReduceScatter: {
      if (c.input.numel() == 0) return;
      if (equal(c.input_counts)) {
        DTR_NCCL_CHECK(ncclReduceScatter(in, out, c.input_counts[rank], type, nccl_op(c.op), comm.get(), s));
        return;
      }
      DTR_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < n; ++r) {
        if (c.input_counts[r] == 0) continue;
        char* block = in + Collective::offset_of(c.input_counts, r) * elem;
        DTR_NCCL_CHECK(
            ncclReduce(block, r == rank ? out : nullptr, c.input_counts[r], type, nccl_op(c.op), r, comm.get(), s));
      }
      DTR_NCCL_CHECK(ncclGroupEnd());
      return;
    }
    case CollectiveKind::kAllToAll:
      DTR_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < n; ++r) {
        if (c.input_counts[r] > 0) {
          DTR_NCCL_CHECK(ncclSend(in + Collective::offset_of(c.input_counts, r) * elem, c.input_counts[r], type, r,
                                  comm.get(), s));
        }
        if (c.output_counts[r] > 0) {
          DTR_NCCL_CHECK(ncclRecv(out + Collective::offset_of(c.output_counts, r) * elem, c.output_counts[r], type, r,
                                  comm.get(), s));
        }
      }
      DTR_NCCL_CHECK(ncclGroupEnd());
      return;
    case CollectiveKind::kBroadcast:
      if (c.output.numel() == 0) return;
      DTR_NCCL_CHECK(ncclBroadcast(out, out, c.output.numel(), type, c.root, comm.get(), s));
      return;
    case CollectiveKind::kBarrier:
      DTR_NCCL_CHECK(
          ncclAllReduce(barrier_buffer.data(), barrier_buffer.data(), 1, ncclFloat32, ncclSum, comm.get(), s));
      return;
  }
}

// Fails every pending Work and aborts the communicator (once). Called with mutex held.
// A stream that waited for a failed collective went on without the host: kernels may
// already have read its (now garbage) output, and a later host read would see it as a
// result. Nothing can report the error to that computation, so the process stops with it,
// as PyTorch's NCCL watchdog does (TORCH_NCCL_ASYNC_ERROR_HANDLING), before the abort lets
// those kernels run. Work::finish says whether the stream waited, in one step with wait()'s
// own check, so every failed collective is either rethrown to its waiter or ends the process.
void ProcessGroupNCCL::Impl::abort_all(DistributedErrorKind kind, const std::string& reason) {
  std::vector<DistributedError> errors;
  for (const Pending& p : pending) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - p.start).count();
    // Only the oldest collective asks the store about peers: that question takes a grace period.
    errors.emplace_back(
        kind, fmt::format("{} failed after {} ms ({}): {}; {}", p.c.description, ms, distributed_error_kind_name(kind),
                          errors.empty() ? group.diagnose_failure(p.c.seq) : "an earlier collective failed", reason));
  }
  bool consumed = false;
  for (size_t i = 0; i < pending.size(); ++i) consumed |= pending[i].work.finish(std::make_exception_ptr(errors[i]));
  if (consumed) {
    fmt::print(stderr,
               "dtr: {}\ndtr: rank {} of group '{}' exits: the collective's result was already in use on cuda:{}\n",
               errors.front().what(), group.rank(), group.name(), device);
    std::fflush(stderr);
    std::_Exit(1);
  }
  comm.abort();
  if (!errors.empty()) broken = errors.front();
  for (Pending& p : pending) retired.push_back(std::move(p));
  pending.clear();
  if (!broken) broken = DistributedError(kind, reason);
}

void ProcessGroupNCCL::Impl::watch() {
  cudaSetDevice(device);  // were the device broken, the event queries below would say so
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    std::erase_if(retired, [](const Pending& p) { return cudaEventQuery(p.done->handle()) != cudaErrorNotReady; });
    if (pending.empty()) {
      if (stopping) return;
      if (retired.empty()) {  // sleep until a collective is issued (or the group goes)
        cv.wait(lock, [&] { return stopping || !pending.empty(); });
        continue;
      }
    }
    cv.wait_for(lock, kWatchdogPeriod);
    if (pending.empty()) continue;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm.get(), &async) != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      abort_all(DistributedErrorKind::kBackend, fmt::format("NCCL reported an asynchronous error: {} ({})",
                                                            ncclGetErrorString(async), ncclGetLastError(comm.get())));
      continue;
    }
    // Collectives finish in issue order on the one stream: only the oldest can be next.
    while (!pending.empty()) {
      Pending& p = pending.front();
      const cudaError_t q = cudaEventQuery(p.done->handle());
      if (q == cudaErrorNotReady) {
        if (Clock::now() - p.start > group.timeout()) {
          abort_all(DistributedErrorKind::kTimeout,
                    fmt::format("NCCL: not finished within the group's timeout of {} ms; communicator aborted",
                                group.timeout().count()));
        }
        break;
      }
      if (q != cudaSuccess) {
        abort_all(DistributedErrorKind::kBackend, fmt::format("CUDA: {} on cuda:{}", cudaGetErrorString(q), device));
        break;
      }
      Pending done = std::move(p);
      pending.pop_front();
      done.work.finish();
    }
  }
}

ProcessGroupNCCL::ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size, GroupOptions options)
    : ProcessGroup(std::move(store), rank, size, std::move(options)) {
  const int device = this->options().device_index;
  if (device < 0 || device >= cuda::device_count()) {
    throw DistributedError(DistributedErrorKind::kBackend,
                           fmt::format("nccl group '{}' (rank {} of {}): needs CUDA device cuda:{}, but this machine "
                                       "has {} CUDA device(s); use the gloo backend for CPU tensors",
                                       name(), rank, size, device, cuda::device_count()));
  }
  impl_ = std::make_unique<Impl>(*this, device);
  join_ranks();
  ncclUniqueId id;
  if (rank == 0) {
    impl_->check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    this->store()->set("nccl_unique_id", std::string_view(reinterpret_cast<const char*>(&id), sizeof id));
  } else {
    const std::string bytes = this->store()->get("nccl_unique_id", timeout());
    DTR_INTERNAL_ASSERT(bytes.size() == sizeof id, "nccl unique id of {} bytes", bytes.size());
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // see Impl::settle
  // From here on impl_->comm owns the communicator: a throw below (NCCL's, the stream's, the
  // buffer's allocation, the thread's) destroys impl_, which aborts it.
  impl_->check(ncclCommInitRankConfig(impl_->comm.init_target(), size, id, rank, &config), "ncclCommInitRankConfig");
  impl_->settle("ncclCommInitRankConfig");
  impl_->stream.emplace(device);
  impl_->comm_lane = fmt::format("cuda:{} nccl {}", device, name());
  impl_->barrier_buffer = Tensor::empty({1}, kFloat32, Device(kCUDA, device));
  impl_->watchdog = std::thread([impl = impl_.get()] { impl->watch(); });
}

ProcessGroupNCCL::~ProcessGroupNCCL() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->watchdog.join();
  // Buffers of aborted collectives the stream has not passed yet are left allocated
  // (leaked, deliberately): freeing them could hand memory a copy still writes to others.
  if (!impl_->retired.empty()) new std::deque<Impl::Pending>(std::move(impl_->retired));
  if (impl_->comm.get() == nullptr) return;  // aborted already
  // A destructor never throws: a communicator that does not finalise in time is left to its
  // handle, which aborts it when impl_ goes.
  try {
    impl_->check(ncclCommFinalize(impl_->comm.get()), "ncclCommFinalize");
    impl_->settle("ncclCommFinalize");
    impl_->comm.destroy();
  } catch (const std::exception&) {}
}

Device ProcessGroupNCCL::device() const { return Device(kCUDA, impl_->device); }

bool ProcessGroupNCCL::accepts(Device device) const { return device.is_cuda() && device.index == impl_->device; }

Work ProcessGroupNCCL::enqueue(Collective c) {
  const int device = impl_->device;
  auto done = std::make_shared<cuda::Event>(device);
  // A barrier's wait() blocks the host, as PyTorch's does; any other orders the caller's stream.
  // While tracing, the wait is a device span on the waiting stream: how long that stream
  // stalled for the collective (its exposed time, as trace/comm_accounting.h counts it).
  std::function<void()> device_wait;
  if (c.kind != CollectiveKind::kBarrier) {
    device_wait = [done, device, group = c.group, seq = c.seq] {
      const cuda::Stream& waiter = cuda::current_stream(device);
      const bool traced = trace::enabled(trace::Category::kWait);
      cuda::DeviceSpan span(waiter, traced ? fmt::format("cuda:{} compute", device) : "", "wait",
                            trace::Category::kWait);
      span.arg("group", group);
      span.arg("seq", static_cast<int64_t>(seq));
      waiter.wait(*done);
    };
  }
  Work work(c.description, c.group, c.seq, timeout() + kWaitMargin, {}, std::move(device_wait));
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->broken) {
    work.finish(std::make_exception_ptr(DistributedError(
        impl_->broken->kind(),
        fmt::format("{}: not run: the group failed earlier: {}", c.description, impl_->broken->what()))));
    return work;
  }
  try {
    DTR_CUDA_CHECK(cudaSetDevice(device), device);
    if (c.pack) c.pack();  // on the caller's stream, before the event below
    // The comm stream waits for what the caller's stream (its kernels) has queued so far.
    cuda::Event ready(device);
    ready.record(cuda::current_stream(device));
    impl_->stream->wait(ready);
    {
      const cuda::StreamGuard on_comm(*impl_->stream);
      cuda::DeviceSpan span(*impl_->stream, impl_->comm_lane, c.call, trace::Category::kCollective);
      c.trace_args(span);
      impl_->launch(c);
      impl_->settle(c.description);  // the collective is on the stream now
      if (c.unpack) c.unpack();      // staged outputs reach the caller's tensors on the comm stream
    }
    done->record(*impl_->stream);
    impl_->pending.push_back(Impl::Pending{std::move(c), work, std::move(done), Clock::now()});
    impl_->cv.notify_all();
  } catch (const std::exception& e) {
    const auto* distributed = dynamic_cast<const DistributedError*>(&e);
    const DistributedErrorKind kind = distributed != nullptr ? distributed->kind() : DistributedErrorKind::kBackend;
    const std::string message = fmt::format("{} failed ({}): {}; {}", c.description, distributed_error_kind_name(kind),
                                            diagnose_failure(c.seq), e.what());
    impl_->abort_all(kind, e.what());
    // NCCL may have queued part of it: its buffers stay until the stream passes them.
    if (cudaEventRecord(done->handle(), impl_->stream->handle()) == cudaSuccess) {
      impl_->retired.push_back(Impl::Pending{std::move(c), Work(), std::move(done), Clock::now()});
    }
    work.finish(std::make_exception_ptr(DistributedError(kind, message)));
  }
  return work;
}

}  // namespace dtr
