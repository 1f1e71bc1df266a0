// CUDA side of the local tensor: streams and events, the caching allocator (reuse, no
// cudaMalloc once warm, record_stream, the out-of-memory message), fill and cast kernels,
// host/device copies, strided and broadcasting device copies, device-timed trace spans.
// Cases tagged [gpu] need a GPU; the untagged cases check what a CPU-only machine answers
// (no device, and clear errors instead of crashes).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/allocator.h"
#include "core/caching_allocator.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/device_span.h"
#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/fill.h"
#include "kernels/shape_ops.h"
#include "tests/testing/hold_stream.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_equal;
using testing::hold;
using testing::to_f64;

TEST_CASE("without a GPU, CUDA tensors raise a clear error", "[cuda]") {
  if (cuda::device_count() > 0) return;  // the [gpu] cases below cover machines with a GPU
  CHECK_THROWS_AS(Tensor::empty({4}, kFloat32, Device(kCUDA, 0)), ValueError);
  CHECK_THROWS_WITH(Tensor::empty({4}, kFloat32, Device(kCUDA, 0)),
                    Catch::Contains("cuda:0") && Catch::Contains("0 CUDA devices"));
}

TEST_CASE("without a GPU, streams and events raise a clear error", "[cuda]") {
  if (cuda::device_count() > 0) return;
  CHECK_THROWS_MATCHES(cuda::Stream(0), ValueError,
                       testing::MessageContains("cuda::Stream: device cuda:0 does not exist (0 CUDA devices visible)"));
  CHECK_THROWS_MATCHES(cuda::Event(0), ValueError,
                       testing::MessageContains("cuda::Event: device cuda:0 does not exist"));
  CHECK_THROWS_MATCHES(cuda::current_stream(0), ValueError,
                       testing::MessageContains("cuda::current_stream: device cuda:0 does not exist"));
}

TEST_CASE("without a GPU, pin_memory raises a clear error and nothing is pinned", "[cuda]") {
  if (cuda::device_count() > 0) return;
  const Tensor t = zeros({4});
  CHECK_FALSE(t.is_pinned());
  CHECK_THROWS_MATCHES(t.pin_memory(), ValueError,
                       testing::MessageContains("pin_memory: device cuda:0 does not exist (0 CUDA devices visible)"));
  CHECK_THROWS_MATCHES(pinned_host_allocator(0), ValueError,
                       testing::MessageContains("pin_memory: device cuda:0 does not exist"));
}

TEST_CASE("streams: the compute stream is current unless a guard says otherwise; events order them", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const cuda::Stream& compute = cuda::compute_stream(0);
  CHECK(&cuda::current_stream(0) == &compute);
  cuda::Stream side(0);
  {
    const cuda::StreamGuard guard(side);
    CHECK(&cuda::current_stream(0) == &side);
  }
  CHECK(&cuda::current_stream(0) == &compute);
  // side waits for compute's event: a fill queued on side after the wait sees compute's fill.
  Tensor t = full({1 << 20}, 1.0, kFloat32, Device(kCUDA, 0));
  hold(compute, 100);
  fill_(t, 2.0);  // on compute, after the hold
  cuda::Event filled(0);
  filled.record(compute);
  CHECK_FALSE(filled.query());
  side.wait(filled);
  CHECK_FALSE(side.query());
  side.synchronize();
  CHECK(filled.query());
  CHECK(t.to(kCPU).data_ptr<float>()[0] == 2.0f);
  cuda::Event start(0, cuda::Event::Timing::kOn), end(0, cuda::Event::Timing::kOn);
  start.record(side);
  hold(side, 20);
  end.record(side);
  end.synchronize();
  CHECK(start.elapsed_ms(end) >= 15.0f);
}

TEST_CASE("the caching allocator: reuse without cudaMalloc, record_stream, out of memory", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Device gpu(kCUDA, 0);
  for (int step = 0; step < 2; ++step) {  // the first step warms the cache
    const int64_t before = memory_stats(gpu).system_allocs;
    {
      std::vector<Tensor> ts;
      for (int64_t n : {1, 7, 1023, 4097, 1 << 20, 3 << 20}) ts.push_back(Tensor::empty({n}, kFloat32, gpu));
    }
    if (step == 1) CHECK(memory_stats(gpu).system_allocs == before);
  }
  CHECK(memory_stats(gpu).bytes_cached > 0);
  // A block a side stream still uses is not handed out until the side stream has run.
  cuda::Stream side(0);
  void* used = nullptr;
  {
    Tensor t = Tensor::empty({1 << 18}, kFloat32, gpu);
    used = t.data();
    hold(side, 200);
    t.record_stream(side);  // the allocator's record_stream, through the tensor
  }
  {
    Tensor u = Tensor::empty({1 << 18}, kFloat32, gpu);
    CHECK(u.data() != used);
  }
  side.synchronize();
  {
    Tensor v = Tensor::empty({1 << 18}, kFloat32, gpu);
    CHECK(v.data() == used);
  }
  CHECK_THROWS_MATCHES(zeros({2}).record_stream(side), ValueError,
                       testing::MessageContains("record_stream: float32[2] is neither on a CUDA device nor pinned"));
  // Far more than any GPU holds: the cache is emptied, the request retried, then a clear error.
  CHECK_THROWS_MATCHES(Tensor::empty({int64_t{1} << 48}, kFloat32, gpu), OutOfMemoryError,
                       testing::MessageContains("out of memory on cuda:0: asked for 1125899906842624 bytes") &&
                           testing::MessageContains("the cache was emptied and the request retried"));
  CHECK(memory_stats(gpu).bytes_cached == 0);
}

TEST_CASE("CUDA allocator counts bytes; fill and cast match the CPU kernels", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Device gpu(kCUDA, 0);
  const MemoryStats before = memory_stats(gpu);
  for (int64_t n : testing::kAwkwardSizes) {
    for (DType d : testing::kAllDTypes) {
      Tensor t = full({n}, 3.0, d, gpu);
      CHECK(memory_stats(gpu).bytes_in_use == before.bytes_in_use + static_cast<int64_t>(n * itemsize(d)));
      check_equal(t, Shape{n}, std::vector<double>(n, 3.0), fmt::format("cuda fill {} n={}", dtype_name(d), n));
    }
  }
  CHECK(memory_stats(gpu).bytes_in_use == before.bytes_in_use);
  // Casts on the device round exactly as the CPU kernels do (the CPU is the reference).
  Tensor src = testing::random_tensor({4097}, kFloat32, 7, -100.0, 100.0);
  for (DType d : testing::kAllDTypes) {
    Tensor on_gpu = src.to(gpu).to(d);
    CHECK(to_f64(on_gpu) == to_f64(src.to(d)));
  }
}

TEST_CASE("host <-> device copies round-trip every dtype", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Device gpu(kCUDA, 0);
  for (DType d : testing::kAllDTypes) {
    Tensor host = testing::random_tensor({33, 7}, d, 11, -50.0, 50.0);
    Tensor back = host.to(gpu).to(kCPU);
    CHECK(to_f64(back) == to_f64(host));
    // A strided host view is packed on the host before the transfer.
    Tensor strided = testing::strided_copy(host);
    CHECK(to_f64(strided.to(gpu)) == to_f64(host));
  }
}

TEST_CASE("device spans time a stream's work on the device and land on its trace lane", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  cuda::Stream side(0);
  { const cuda::DeviceSpan off(side, "cuda:0 side", "untraced", trace::Category::kCollective); }
  trace::start();
  const int64_t queued_ns = trace::now_ns();
  {
    cuda::DeviceSpan span(side, "cuda:0 side", "held", trace::Category::kCollective);
    span.arg("seq", int64_t{7});
    hold(side, 100);
  }
  const int64_t host_done_ns = trace::now_ns();  // the host queued it all at once
  const std::vector<trace::ThreadEvents> lanes = trace::stop();
  const auto lane = std::find_if(lanes.begin(), lanes.end(), [](const auto& l) { return l.name == "cuda:0 side"; });
  REQUIRE(lane != lanes.end());
  REQUIRE(lane->events.size() == 1);
  const trace::Event& e = lane->events[0];
  CHECK(e.name == "held");
  CHECK(e.args.at(0).key == "seq");
  CHECK(e.args.at(0).json == "7");
  // The device ran it for the 100 ms hold, long after the host had queued it.
  CHECK(e.end_ns - e.begin_ns >= 90'000'000);
  CHECK(host_done_ns - queued_ns < 50'000'000);
  CHECK(e.begin_ns >= queued_ns - 1'000'000);
  CHECK(e.end_ns > host_done_ns);
}

TEST_CASE("pinned host memory: pin_memory, copies through staging and non-blocking copies", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Device gpu(kCUDA, 0);
  const cuda::Stream& stream = cuda::compute_stream(0);
  const Tensor host = arange(0, 1 << 20).to(kFloat32);
  const Tensor pinned = host.pin_memory();
  CHECK(pinned.is_pinned());
  CHECK_FALSE(host.is_pinned());
  CHECK(pinned.pin_memory().storage().is_same(pinned.storage()));
  check_equal(pinned, host, "pin_memory keeps the values");
  CHECK_THROWS_MATCHES(zeros({2}, kFloat32, gpu).pin_memory(), ValueError,
                       testing::MessageContains("only CPU tensors are pinned"));

  // A pageable source goes through pinned staging: the copy is only queued, so changing
  // the source at once must not change what arrives.
  Tensor source = host.clone();
  Tensor device = Tensor::empty(host.shape(), kFloat32, gpu);
  hold(stream, 100);
  device.copy_(source);
  CHECK_FALSE(stream.query());  // queued behind the hold: the host did not wait
  fill_(source, -1.0);
  check_equal(device, host, "a host-to-device copy reads the source as it was");

  // non_blocking from pinned memory: queued, and the block stays reserved after the
  // tensor is freed until the copy has run.
  void* block = nullptr;
  {
    const Tensor staged = host.pin_memory();
    block = staged.storage().data();
    hold(stream, 100);
    device.copy_(staged, /*non_blocking=*/true);
    CHECK_FALSE(stream.query());
  }
  const Tensor next = host.pin_memory();  // the same size, while the copy is pending
  CHECK(next.storage().data() != block);
  stream.synchronize();
  check_equal(device, host, "a non-blocking copy from pinned memory");
  // Once the copy has run, the reserved block is free again: the next request of its size
  // needs no cudaHostAlloc.
  const int64_t host_allocs = pinned_host_allocator(0).stats().system_allocs;
  const Tensor reused = host.pin_memory();
  CHECK(pinned_host_allocator(0).stats().system_allocs == host_allocs);

  // non_blocking into pinned memory: queued; the values are there once the stream has run.
  Tensor back = zeros(host.shape()).pin_memory();
  hold(stream, 50);
  back.copy_(device, /*non_blocking=*/true);
  CHECK_FALSE(stream.query());
  stream.synchronize();
  check_equal(back, host, "a non-blocking copy into pinned memory");
  // Blocking copies into pinned memory wait, whatever the stream holds.
  Tensor waited = zeros(host.shape()).pin_memory();
  hold(stream, 50);
  waited.copy_(device);
  check_equal(waited, host, "a blocking copy into pinned memory");
}

TEST_CASE("device copies take any layout: transposes, slices, broadcasts, casts, into views", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Device gpu(kCUDA, 0);
  const Tensor host = testing::random_tensor({5, 7, 9}, kFloat32, 3, -10.0, 10.0);
  const Tensor dev = host.to(gpu);
  // contiguous() of views: the strided copy kernel.
  CHECK(to_f64(dev.transpose(0, 2).contiguous()) == to_f64(host.transpose(0, 2).contiguous()));
  CHECK(to_f64(dev.slice(1, 1, 7, 3).contiguous()) == to_f64(host.slice(1, 1, 7, 3).contiguous()));
  // A broadcast source, with a cast.
  Tensor wide = Tensor::empty({4, 5, 7, 9}, kBFloat16, gpu);
  wide.copy_(dev);
  CHECK(to_f64(wide) == to_f64(host.expand({4, 5, 7, 9}).to(kBFloat16)));
  // Into a view on the device, from the device and from the host; out of a view to the host.
  Tensor target = zeros({5, 14, 9}, kFloat32, gpu);
  Tensor every_other = target.slice(1, 0, 14, 2);
  every_other.copy_(dev);
  Tensor expected = zeros({5, 14, 9});
  Tensor expected_view = expected.slice(1, 0, 14, 2);
  expected_view.copy_(host);
  CHECK(to_f64(target) == to_f64(expected));
  Tensor odd = target.slice(1, 1, 14, 2);
  odd.copy_(host);
  Tensor expected_odd = expected.slice(1, 1, 14, 2);
  expected_odd.copy_(host);
  CHECK(to_f64(target) == to_f64(expected));
  CHECK(to_f64(target.slice(1, 1, 14, 2).to(kCPU)) == to_f64(host));
}

TEST_CASE("cat on the device matches the CPU along every dim, with views and empty pieces", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Device gpu(kCUDA, 0);
  const Tensor a = testing::random_tensor({3, 4, 5}, kFloat32, 20), b = testing::random_tensor({3, 4, 5}, kFloat32, 21);
  for (int64_t dim : {0, 1, 2, -1}) {
    INFO("dim " << dim);
    CHECK(to_f64(cat({a.to(gpu), b.to(gpu).transpose(0, 1).transpose(0, 1)}, dim)) == to_f64(cat({a, b}, dim)));
  }
  const Tensor none = zeros({3, 0, 5}, kFloat32);
  CHECK(to_f64(cat({a.to(gpu), none.to(gpu), b.to(gpu)}, 1)) == to_f64(cat({a, none, b}, 1)));
  CHECK(to_f64(cat({a.to(gpu).transpose(0, 2), b.to(gpu).transpose(0, 2)}, 0)) ==
        to_f64(cat({a.transpose(0, 2), b.transpose(0, 2)}, 0)));
}

}  // namespace
}  // namespace dtr
