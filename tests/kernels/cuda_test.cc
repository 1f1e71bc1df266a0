// CUDA side of the local tensor: allocator statistics, fill and cast kernels, host/device
// copies. Cases tagged [gpu] need a GPU; the untagged case checks what a CPU-only machine
// answers (no device, and a clear error instead of a crash).
#include "kernels/allocator.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/fill.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_equal;
using testing::to_f64;

TEST_CASE("without a GPU, CUDA tensors raise a clear error", "[cuda]") {
  if (cuda::device_count() > 0) return;  // the [gpu] cases below cover machines with a GPU
  CHECK_THROWS_AS(Tensor::empty({4}, kFloat32, Device(kCUDA, 0)), ValueError);
  CHECK_THROWS_WITH(Tensor::empty({4}, kFloat32, Device(kCUDA, 0)),
                    Catch::Contains("cuda:0") && Catch::Contains("0 CUDA devices"));
}

TEST_CASE("CUDA allocator counts bytes; fill and cast match the CPU kernels", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Device gpu(kCUDA, 0);
  const MemoryStats before = memory_stats(gpu);
  for (int64_t n : testing::kAwkwardSizes) {
    for (DType d : testing::kAllDTypes) {
      Tensor t = full({n}, 3.0, d, gpu);
      CHECK(memory_stats(gpu).bytes_in_use == before.bytes_in_use + static_cast<int64_t>(n * itemsize(d)));
      check_equal(t, std::vector<double>(n, 3.0), fmt::format("cuda fill {} n={}", dtype_name(d), n));
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

}  // namespace
}  // namespace dtr
