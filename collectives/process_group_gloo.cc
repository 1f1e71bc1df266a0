#include "collectives/process_group_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "collectives/distributed_error.h"
#include "collectives/gloo_store.h"
#include "collectives/internal/ring_reduce_scatter.h"
#include "collectives/internal/wire_dtype.h"
#include "collectives/prefix_store.h"

namespace dtr {
namespace {

using Clock = std::chrono::steady_clock;

// An all_reduce whose ranks' tensors together are at most this many bytes gathers them all
// and reduces locally (one round of messages); larger ones reduce-scatter then all-gather.
constexpr int64_t kGatherReduceMaxBytes = 64 << 10;
// wait() allows this beyond the group's timeout, so the backend's own error, which names
// the peers, arrives first.
constexpr std::chrono::milliseconds kWaitMargin{5000};
// While callers wait on their collectives as soon as they issue them (and so run them
// themselves), issuing does not wake the group's thread; it looks at the queue this often
// instead, and runs what no caller came for.
constexpr std::chrono::milliseconds kPollPeriod{1};

// One TCP device (one epoll thread) per process, shared by every group. Leaked on purpose:
// its thread must outlive groups destroyed by static destructors at exit. A process forked
// after the device was made gets its own (the parent's thread does not exist in a child).
// Gloo writes to its sockets without MSG_NOSIGNAL, so SIGPIPE is ignored from then on: a
// peer that died must fail the collective, not kill this process (Python, and so
// PyTorch, ignores SIGPIPE the same way).
std::shared_ptr<gloo::transport::Device> process_device() {
  static std::mutex mutex;
  static pid_t owner = 0;
  static std::shared_ptr<gloo::transport::Device>* device = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (device == nullptr || owner != ::getpid()) {
    ::signal(SIGPIPE, SIG_IGN);
    gloo::transport::tcp::attr attr;
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr && *iface != '\0') {
      attr.iface = iface;  // multi-node runs: the interface the other nodes reach (as in PyTorch)
    } else {
      attr.hostname = "127.0.0.1";
      attr.ai_family = AF_INET;
    }
    device = new std::shared_ptr<gloo::transport::Device>(gloo::transport::tcp::CreateDevice(attr));
    owner = ::getpid();
  }
  return *device;
}

// A zero-size tensor has no memory (its data() is null); Gloo's buffers want an address,
// and any valid one will do.
void* address_of(const Tensor& t) {
  static char empty;
  return t.numel() == 0 ? &empty : t.data();
}

DistributedErrorKind kind_of_gloo_error(std::string_view what) {
  if (what.find("Timed out") != std::string_view::npos || what.find("timeout") != std::string_view::npos) {
    return DistributedErrorKind::kTimeout;
  }
  for (std::string_view s : {"closed", "reset", "refused", "Broken pipe", "Connection"}) {
    if (what.find(s) != std::string_view::npos) return DistributedErrorKind::kConnection;
  }
  return DistributedErrorKind::kBackend;
}

}  // namespace

struct ProcessGroupGloo::Impl {
  ProcessGroupGloo& group;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::pair<Collective, Work>> queue;
  bool running = false;  // a thread (the group's, or one waiting on the collective) runs the head
  // Whether issuing wakes the group's thread. Cleared when a waiting caller runs a collective
  // itself (a thread woken per collective would only compete for the cores with Gloo's TCP
  // loop thread, which spins while a collective holds a pair's lock); set again when the
  // group's thread finds a collective nobody came for (the caller is computing meanwhile).
  bool wake_on_issue = true;
  std::optional<gloo_ring::Ring> ring;  // dtr's ring on the context (destroyed before it)
  bool stopping = false;
  std::optional<DistributedError> broken;  // the first failure; only the comm thread touches it
  std::thread thread;

  explicit Impl(ProcessGroupGloo& g) : group(g) {}

  void connect();
  void loop();
  // Runs collective `seq` on the calling thread if it is next in line and none is running.
  void run_if_next(uint64_t seq);
  void execute(std::pair<Collective, Work>& item);
  void run(Collective& c);
  void all_reduce(Collective& c);
  // Gloo's ring all-gather (allgatherv for uneven blocks) of bytes[r] from each rank r into
  // output; input null means in place (this rank's block already sits in output).
  void gather_bytes(const void* input, void* output, const std::vector<size_t>& bytes, uint32_t tag);
  void all_gather(Collective& c);
  void reduce_scatter(Collective& c);
  void all_to_all(Collective& c);
  void broadcast(Collective& c);
  void barrier(Collective& c);
  DistributedError failure(const Collective& c, std::exception_ptr error, Clock::time_point start);
};

void ProcessGroupGloo::Impl::connect() {
  context = std::make_shared<gloo::rendezvous::Context>(group.rank(), group.size());
  context->setTimeout(group.timeout());
  auto store = std::make_shared<PrefixStore>("gloo", group.store());
  store->set_timeout(group.timeout());
  GlooStore gloo_store(store);
  std::shared_ptr<gloo::transport::Device> device = process_device();
  try {
    context->connectFullMesh(gloo_store, device);
    ring.emplace(*context);  // every rank, here: its pool must be registered before a peer's first piece
  } catch (const DistributedError& e) {
    throw DistributedError(e.kind(), fmt::format("gloo group '{}' (rank {} of {}): connecting to the other ranks "
                                                 "failed: {}",
                                                 group.name(), group.rank(), group.size(), e.what()));
  } catch (const std::exception& e) {
    throw DistributedError(kind_of_gloo_error(e.what()),
                           fmt::format("gloo group '{}' (rank {} of {}): connecting to the other ranks failed: "
                                       "Gloo: {}",
                                       group.name(), group.rank(), group.size(), e.what()));
  }
}

void ProcessGroupGloo::Impl::loop() {
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    if (!running && !queue.empty()) {
      std::pair<Collective, Work> item = std::move(queue.front());
      queue.pop_front();
      running = true;
      wake_on_issue = true;
      lock.unlock();
      execute(item);
      lock.lock();
      running = false;
      continue;
    }
    if (stopping && !running) return;
    if (wake_on_issue) {
      cv.wait(lock);
    } else {
      cv.wait_for(lock, kPollPeriod);
    }
  }
}

void ProcessGroupGloo::Impl::run_if_next(uint64_t seq) {
  std::pair<Collective, Work> item;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (running || queue.empty() || queue.front().first.seq != seq) return;
    item = std::move(queue.front());
    queue.pop_front();
    running = true;
    wake_on_issue = false;
  }
  execute(item);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mutex);
    running = false;
    wake = stopping || !queue.empty();  // collectives issued meanwhile, or a group going away
  }
  if (wake) cv.notify_all();
}

// Runs one collective on whichever thread holds `running`. Only one does at a time, so
// `broken` and the Gloo context are never used concurrently.
void ProcessGroupGloo::Impl::execute(std::pair<Collective, Work>& item) {
  Collective& c = item.first;
  if (broken) {
    item.second.finish(std::make_exception_ptr(DistributedError(
        broken->kind(), fmt::format("{}: not run: the group failed earlier: {}", c.description, broken->what()))));
    return;
  }
  const auto start = Clock::now();
  std::exception_ptr error;
  {
    // The span ends before finish(): a waiter woken by it may stop the trace at once.
    trace::Span span(c.call, trace::Category::kCollective);
    c.trace_args(span);
    try {
      if (c.pack) c.pack();
      run(c);
      if (c.unpack) c.unpack();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (!error) {
    item.second.finish(nullptr, std::make_shared<Collective>(std::move(c)));
    return;
  }
  // Closing every connection (the ring's abandon) makes the peers' collectives fail now
  // rather than at their timeout (NCCL's abort, for Gloo), so they too report before the
  // diagnosis ends.
  ring->abandon();
  broken = failure(c, error, start);
  item.second.finish(std::make_exception_ptr(*broken));
}

void ProcessGroupGloo::Impl::run(Collective& c) {
  switch (c.kind) {
    case CollectiveKind::kAllReduce: return all_reduce(c);
    case CollectiveKind::kAllGather: return all_gather(c);
    case CollectiveKind::kReduceScatter: return reduce_scatter(c);
    case CollectiveKind::kAllToAll: return all_to_all(c);
    case CollectiveKind::kBroadcast: return broadcast(c);
    case CollectiveKind::kBarrier: return barrier(c);
  }
}

// Not Gloo's allreduce: its bcube and ring each collapse at some sizes on loopback
// (docs/ring_reduce_scatter.md). Small tensors are gathered whole and reduced here in rank
// order (one round of messages, the same bits on every rank); larger ones take dtr's ring
// all-reduce (ring_reduce_scatter.h: reduce-scatter with each reduced piece gathered as it
// is done), so each rank sends 2(n-1)/n of the tensor, the least an all-reduce can, and
// avg divides once, in the reduce-scatter.
void ProcessGroupGloo::Impl::all_reduce(Collective& c) {
  if (c.output.numel() == 0) return;
  Tensor wire = is_half_precision(c.dtype) ? c.output.to(kFloat32) : c.output;  // reduce in float32
  const int n = group.size();
  const int64_t count = wire.numel();
  const size_t elem = itemsize(wire.dtype());
  const auto tag = static_cast<uint32_t>(c.seq);
  if (count * static_cast<int64_t>(elem) * n <= kGatherReduceMaxBytes) {
    Tensor all = Tensor::empty({count * n}, wire.dtype());
    gather_bytes(wire.data(), all.data(), std::vector<size_t>(n, count * elem), tag);
    dispatch_wire(wire.dtype(), [&]<class T>(TypeTag<T>) {
      const T* rows = all.data_ptr<T>();
      T* out = wire.data_ptr<T>();
      std::copy(rows, rows + count, out);
      for (int r = 1; r < n; ++r) combine(out, out, rows + r * count, count, c.op);
      if (c.op == ReduceOp::kAvg) divide_by(out, count, n);
    });
  } else {
    // count / n each and one more for the first count % n (10 over 4: 3, 3, 2, 2, as
    // torch.tensor_split; not torch.chunk's 3, 3, 3, 1): the blocks differ by one at most.
    std::vector<int64_t> blocks(n, count / n);
    for (int r = 0; r < count % n; ++r) ++blocks[r];
    ring->all_reduce(wire.dtype(), c.op, wire.data(), blocks, tag);
  }
  if (is_half_precision(c.dtype)) c.output.copy_(wire);
}

void ProcessGroupGloo::Impl::gather_bytes(const void* input, void* output, const std::vector<size_t>& bytes,
                                          uint32_t tag) {
  auto* out = static_cast<uint8_t*>(output);
  auto* in = static_cast<uint8_t*>(const_cast<void*>(input));
  if (std::all_of(bytes.begin(), bytes.end(), [&](size_t b) { return b == bytes[0]; })) {
    gloo::AllgatherOptions opts(context);
    if (in != nullptr) opts.setInput(in, bytes[0]);
    opts.setOutput(out, bytes[0] * bytes.size());
    opts.setTag(tag);
    opts.setTimeout(group.timeout());
    gloo::allgather(opts);
  } else {
    gloo::AllgathervOptions opts(context);
    if (in != nullptr) opts.setInput(in, bytes[group.rank()]);
    opts.setOutput(out, bytes);
    opts.setTag(tag);
    opts.setTimeout(group.timeout());
    gloo::allgatherv(opts);
  }
}

void ProcessGroupGloo::Impl::all_gather(Collective& c) {
  if (c.output.numel() == 0) return;  // every rank sends nothing: the counts are global
  const size_t elem = itemsize(c.dtype);
  std::vector<size_t> bytes;
  for (int64_t n : c.output_counts) bytes.push_back(static_cast<size_t>(n) * elem);
  const int64_t offset = Collective::offset_of(c.output_counts, group.rank());
  const bool in_place = c.input.numel() == 0 || (c.input.storage().is_same(c.output.storage()) &&
                                                 c.input.offset() == c.output.offset() + offset);
  gather_bytes(in_place ? nullptr : c.input.data(), c.output.data(), bytes, static_cast<uint32_t>(c.seq));
}

void ProcessGroupGloo::Impl::reduce_scatter(Collective& c) {
  if (c.input.numel() == 0) return;  // the counts are global: every rank skips
  Tensor in = is_half_precision(c.dtype) ? c.input.to(kFloat32) : c.input;
  Tensor out = is_half_precision(c.dtype) ? Tensor::empty({c.output.numel()}, kFloat32) : c.output;
  ring->reduce_scatter(in.dtype(), c.op, in.data(), address_of(out), c.input_counts);
  if (is_half_precision(c.dtype)) c.output.copy_(out);
}

void ProcessGroupGloo::Impl::all_to_all(Collective& c) {
  // No rank may skip: its peers post sends and receives for it even when they are empty.
  const int64_t elem = static_cast<int64_t>(itemsize(c.dtype));
  std::vector<int64_t> in_bytes, out_bytes;
  for (int64_t n : c.input_counts) in_bytes.push_back(n * elem);
  for (int64_t n : c.output_counts) out_bytes.push_back(n * elem);
  gloo::AlltoallvOptions opts(context);
  opts.setInput(static_cast<uint8_t*>(address_of(c.input)), in_bytes);
  opts.setOutput(static_cast<uint8_t*>(address_of(c.output)), out_bytes);
  opts.setTag(static_cast<uint32_t>(c.seq));
  opts.setTimeout(group.timeout());
  gloo::alltoallv(opts);
}

void ProcessGroupGloo::Impl::broadcast(Collective& c) {
  if (c.output.numel() == 0) return;
  gloo::BroadcastOptions opts(context);
  opts.setRoot(c.root);
  auto* p = static_cast<uint8_t*>(c.output.data());
  if (group.rank() == c.root) opts.setInput(p, c.output.nbytes());
  opts.setOutput(p, c.output.nbytes());
  opts.setTag(static_cast<uint32_t>(c.seq));
  opts.setTimeout(group.timeout());
  gloo::broadcast(opts);
}

void ProcessGroupGloo::Impl::barrier(Collective& c) {
  gloo::BarrierOptions opts(context);
  opts.setTag(static_cast<uint32_t>(c.seq));
  opts.setTimeout(group.timeout());
  gloo::barrier(opts);
}

DistributedError ProcessGroupGloo::Impl::failure(const Collective& c, std::exception_ptr error,
                                                 Clock::time_point start) {
  std::string what;
  DistributedErrorKind kind = DistributedErrorKind::kBackend;
  try {
    std::rethrow_exception(error);
  } catch (const DistributedError& e) {
    what = e.what();
    kind = e.kind();
  } catch (const gloo::Exception& e) {
    what = fmt::format("Gloo: {}", e.what());
    kind = kind_of_gloo_error(e.what());
  } catch (const std::exception& e) {
    what = e.what();
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  return DistributedError(kind, fmt::format("{} failed after {} ms ({}): {}; {}", c.description, ms,
                                            distributed_error_kind_name(kind), group.diagnose_failure(c.seq), what));
}

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GroupOptions options)
    : ProcessGroup(std::move(store), rank, size, std::move(options)), impl_(std::make_shared<Impl>(*this)) {
  join_ranks();
  impl_->connect();
  impl_->thread = std::thread([impl = impl_.get(), lane = fmt::format("comm {}", name())] {
    trace::set_thread_name(lane);
    impl->loop();
  });
}

ProcessGroupGloo::~ProcessGroupGloo() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

Work ProcessGroupGloo::enqueue(Collective c) {
  // The Work may outlive the group; its waiter then finds the queue drained and runs nothing.
  Work work(c.description, c.group, c.seq, timeout() + kWaitMargin, [impl = std::weak_ptr<Impl>(impl_), seq = c.seq] {
    if (auto alive = impl.lock()) alive->run_if_next(seq);
  });
  bool wake;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->queue.emplace_back(std::move(c), work);
    wake = impl_->wake_on_issue;
  }
  if (wake) impl_->cv.notify_one();
  return work;
}

}  // namespace dtr
