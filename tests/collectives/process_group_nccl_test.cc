// NCCL process groups on real rank processes, one CUDA device each: the collective sweeps
// of collective_sweep.h (out-of-place and in-place), coalesced forms, the device check,
// stream-ordered waits (the host does not block; the buffers outlive the caller's
// references), and a rank absent from a collective (the watchdog aborts the communicator,
// or exits the rank whose stream already waited for the collective). Every case
// is tagged gpu (Bazel and Catch2); those that need two or more devices are also tagged
// multi_gpu and run from their own target (tools/test.sh --multi-gpu). A case that finds
// fewer devices than it needs fails: none passes where it did not run.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <thread>

#include "collectives/collective_counter.h"
#include "collectives/distributed_error.h"
#include "collectives/init.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/stream.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "tests/collectives/collective_sweep.h"
#include "tests/collectives/rank_data.h"
#include "tests/testing/hold_stream.h"
#include "tests/testing/multi_rank.h"

namespace dtr {
namespace {

using namespace testing;
using namespace std::chrono_literals;

// CUDA devices, counted in a child: the test process itself must not initialise CUDA,
// or its forked ranks could not use it.
int cuda_devices() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(cuda::device_count(), 100));
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

// The devices a case needs, or the case fails (it never passes where it could not run).
int require_devices(int needed) {
  const int devices = cuda_devices();
  INFO("NCCL puts one rank on each CUDA device; this machine has " << devices);
  REQUIRE(devices >= needed);
  return devices;
}

// Every collective's sweep on `world` ranks, one device each.
void sweep_on(int world) {
  run_ranks(world, [](int rank, int) {
    auto pg = init_process_group(Backend::kNccl);
    const Device device(kCUDA, rank);
    sweep_all_reduce(*pg, device, kCudaLayouts);
    sweep_all_gather(*pg, device, kCudaLayouts);
    sweep_reduce_scatter(*pg, device, kCudaLayouts);
    sweep_all_to_all(*pg, device, kCudaLayouts);
    sweep_broadcast(*pg, device, kCudaLayouts);
    pg->barrier().wait();
  });
}

// The coalesced forms and the device check on `world` ranks.
void coalesced_on(int world) {
  run_ranks(world, [](int rank, int n) {
    auto pg = init_process_group(Backend::kNccl);
    const Device device(kCUDA, rank);
    CHECK(pg->device() == device);  // where callers without tensors put control messages
    collective_counter().reset();
    std::vector<Tensor> ins = {make_tensor(4, 0, kBFloat16, [&](int64_t i) { return rank * 10.0 + i; }).to(device),
                               make_tensor(2, 3, kBFloat16, [&](int64_t i) { return -rank * 10.0 - i; }).to(device)};
    std::vector<Tensor> outs = {Tensor::empty({4L * n}, kBFloat16, device),
                                Tensor::empty({2L * n, 3}, kBFloat16, device)};
    pg->all_gather_into_tensor_coalesced(outs, ins).wait();
    std::vector<double> e0, e1;
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 4; ++i) e0.push_back(r * 10.0 + i);
      for (int i = 0; i < 6; ++i) e1.push_back(-r * 10.0 - i);
    }
    check_exact(outs[0], e0, "coalesced all_gather [0]");
    check_exact(outs[1], e1, "coalesced all_gather [1]");
    std::vector<Tensor> rs_in = {
        make_tensor(2L * n, 0, kFloat32, [&](int64_t i) { return (rank + 1) * weight(i); }).to(device),
        make_tensor(n, 3, kFloat32, [&](int64_t i) { return (rank + 1) * weight(i + 5); }).to(device)};
    std::vector<Tensor> rs_out = {Tensor::empty({2}, kFloat32, device), Tensor::empty({1, 3}, kFloat32, device)};
    pg->reduce_scatter_tensor_coalesced(rs_out, rs_in, ReduceOp::kAvg).wait();
    check_exact(rs_out[0],
                {reduced(weight(2 * rank), n, ReduceOp::kAvg), reduced(weight(2 * rank + 1), n, ReduceOp::kAvg)},
                "coalesced reduce_scatter [0]");
    CHECK(collective_counter().calls(CollectiveKind::kAllGather) == 1);
    CHECK(collective_counter().calls(CollectiveKind::kReduceScatter) == 1);
    Tensor cpu = Tensor::empty({4}, kFloat32);
    CHECK_THROWS_AS(pg->all_reduce(cpu), TypeError);
    CHECK_THROWS_WITH(pg->all_reduce(cpu), Catch::Contains("nccl backend") && Catch::Contains("CUDA"));
  });
}

TEST_CASE("nccl: wait() orders the compute stream without blocking the host; buffers outlive their tensors",
          "[collectives][nccl][gpu]") {
  require_devices(1);
  run_ranks(1, [](int, int) {
    auto pg = init_process_group(Backend::kNccl);
    const Device gpu(kCUDA, 0);
    const cuda::Stream& compute = cuda::compute_stream(0);
    Tensor x = full({1 << 20}, 2.0, kFloat32, gpu);
    compute.synchronize();
    // The collective waits for the compute stream's work, held for 300 ms: after issue and
    // wait() the host is back at once, the collective still pending.
    hold(compute, 300);
    const auto start = std::chrono::steady_clock::now();
    Work w = pg->all_reduce(x);
    w.wait();
    CHECK(std::chrono::steady_clock::now() - start < 150ms);
    CHECK_FALSE(w.is_completed());
    CHECK(w.waited_on_device());
    // A kernel queued now reads the reduced value (one rank: the sum is the input).
    Tensor y = add(x, full({1 << 20}, 1.0, kFloat32, gpu));
    check_exact(y.slice(0, 0, 4), {3.0, 3.0, 3.0, 3.0}, "after a stream-ordered wait");

    // The caller drops its only reference while the collective is pending: the block is not
    // handed out again until the collective is done with it.
    hold(compute, 300);
    void* block = nullptr;
    Work pending;
    {
      Tensor z = full({1 << 20}, 1.0, kFloat32, gpu);
      block = z.data();
      pending = pg->all_reduce(z);
    }
    Tensor other = Tensor::empty({1 << 20}, kFloat32, gpu);
    CHECK(other.data() != block);
    pending.synchronize();
    CHECK(pending.is_completed());
  });
}

TEST_CASE("nccl: every collective, dtype, size, even/uneven and layout, on one rank", "[collectives][nccl][gpu]") {
  require_devices(1);
  sweep_on(1);
}

TEST_CASE("nccl: every collective, dtype, size, even/uneven and layout, on 2 to 4 ranks",
          "[collectives][nccl][gpu][multi_gpu]") {
  const int devices = require_devices(2);
  for (int world = 2; world <= std::min(devices, 4); ++world) sweep_on(world);
}

TEST_CASE("nccl: coalesced forms are one collective; CPU tensors are refused; on one rank",
          "[collectives][nccl][gpu]") {
  require_devices(1);
  coalesced_on(1);
}

TEST_CASE("nccl: coalesced forms are one collective; CPU tensors are refused; on 2 ranks",
          "[collectives][nccl][gpu][multi_gpu]") {
  require_devices(2);
  coalesced_on(2);
}

TEST_CASE("nccl: a rank absent from a collective times out; the communicator is aborted",
          "[collectives][nccl][gpu][multi_gpu]") {
  require_devices(2);
  RanksOptions options;
  options.group_timeout = 3000ms;
  run_ranks(
      2,
      [](int rank, int) {
        auto pg = init_process_group(Backend::kNccl);
        if (rank == 1) {
          pg->store()->wait({"test/done"}, 60s);
          return;
        }
        Tensor x = full({1024}, 1.0, kFloat32, Device(kCUDA, 0));
        Work w = pg->all_reduce(x);
        try {
          w.synchronize();  // the host waits: the error reaches this thread
          FAIL("the all_reduce finished without rank 1");
        } catch (const DistributedError& e) {
          CHECK(e.kind() == DistributedErrorKind::kTimeout);
          CHECK_THAT(e.what(), Catch::Contains("all_reduce #0") && Catch::Contains("peer group rank(s) [1]"));
        }
        pg->store()->set("test/done", "");
      },
      options);
}

TEST_CASE("nccl: a collective that fails after a stream waited for it ends that rank with the error",
          "[collectives][nccl][gpu][multi_gpu]") {
  require_devices(2);
  RanksOptions options;
  options.group_timeout = 3000ms;
  const std::vector<RankOutcome> outcomes = run_ranks_outcomes(
      2,
      [](int rank, int) {
        auto pg = init_process_group(Backend::kNccl);
        if (rank == 1) {
          std::this_thread::sleep_for(20s);  // absent; the peer exits long before
          return;
        }
        Tensor x = full({1024}, 1.0, kFloat32, Device(kCUDA, 0));
        pg->all_reduce(x).wait();  // the stream waits; the host goes on
        (void)x.to(kCPU);          // blocks on the stream until the watchdog acts
        FAIL("rank 0 went on with the result of a collective that never ran");
      },
      options);
  REQUIRE(outcomes.size() == 2);
  // The watchdog's exit (std::_Exit(1), its message on stderr), nothing else: no failed
  // check, no exception reaching the body, no hang or signal.
  CHECK_FALSE(outcomes[0].ok);
  CHECK(outcomes[0].report == "\n  exited with code 1");
  CHECK(outcomes[1].ok);
}

}  // namespace
}  // namespace dtr
