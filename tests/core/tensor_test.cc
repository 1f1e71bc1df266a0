// Local Tensor: storage, views without copies, copies and casts, allocator statistics and
// the CPU allocator's cache.
#include <bit>
#include <cmath>
#include <cstring>
#include <thread>
#include <tuple>

#include "core/allocator.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "kernels/fill.h"
#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_equal;
using testing::to_f64;

Tensor iota(Shape shape, DType dtype = kFloat32) { return arange(shape_numel(shape), dtype).view(shape); }

TEST_CASE("empty tensors are contiguous and 64-byte aligned", "[tensor]") {
  for (DType d : testing::kAllDTypes) {
    Tensor t = Tensor::empty({3, 5}, d);
    CHECK(t.is_contiguous());
    CHECK(t.strides() == Shape{5, 1});
    CHECK(t.nbytes() == 15 * itemsize(d));
    CHECK(reinterpret_cast<uintptr_t>(t.data()) % 64 == 0);
  }
  Tensor zero = Tensor::empty({0, 4});
  CHECK(zero.numel() == 0);
  CHECK(zero.is_contiguous());
}

TEST_CASE("narrow, slice and select share storage and address the right elements", "[tensor][view]") {
  Tensor t = iota({4, 6});
  Tensor n = t.narrow(1, 2, 3);
  CHECK(n.storage().is_same(t.storage()));
  CHECK(n.shape() == Shape{4, 3});
  CHECK_FALSE(n.is_contiguous());
  check_equal(n.select(0, 1), Shape{3}, {8, 9, 10}, "narrow+select");
  check_equal(t.slice(1, 1, 6, 2).select(0, 3), Shape{3}, {19, 21, 23}, "slice step 2");
  check_equal(t.slice(0, -1, 100), Shape{1, 6}, {18, 19, 20, 21, 22, 23}, "slice clamps like Python");
  check_equal(t.select(1, -1), Shape{4}, {5, 11, 17, 23}, "negative index");
  CHECK(t.narrow(0, 4, 0).numel() == 0);
}

TEST_CASE("transpose and permute swap strides; contiguous() copies in the new order", "[tensor][view]") {
  Tensor t = iota({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  Tensor c = p.contiguous();
  CHECK(c.is_contiguous());
  CHECK_FALSE(c.storage().is_same(t.storage()));
  // c[k][i][j] = t[i][j][k] = 12 i + 4 j + k
  std::vector<double> expected;
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) expected.push_back(12 * i + 4 * j + k);
  check_equal(c, Shape{4, 2, 3}, expected, "permute(2,0,1)");
  check_equal(iota({2, 3}).t(), Shape{3, 2}, {0, 3, 1, 4, 2, 5}, "t()");
}

TEST_CASE("transposing copies (tiled) match an element-by-element reference", "[tensor][copy]") {
  // Sizes off the 32-wide tile, a batch dim, and a cast on the way.
  for (Shape shape : {Shape{33, 70}, Shape{3, 100, 41}, Shape{64, 64}}) {
    Tensor t = iota(shape, kFloat32);
    Tensor tt = t.transpose(-1, -2);
    for (DType to : {kFloat32, kFloat64, kBFloat16}) {
      Tensor out = Tensor::empty(tt.shape(), to);
      out.copy_(tt);
      const int64_t b = shape.size() == 3 ? shape[0] : 1, r = shape[shape.size() - 2], c = shape.back();
      std::vector<double> expected;
      for (int64_t k = 0; k < b; ++k)
        for (int64_t j = 0; j < c; ++j)
          for (int64_t i = 0; i < r; ++i) expected.push_back(static_cast<double>((k * r + i) * c + j));
      testing::check_close(out, tt.shape(), expected, testing::tolerance_for(to),
                           fmt::format("transposed copy {}", shape));
    }
  }
}

// Outputs of 8 MiB and more go out with streaming stores in src-row order (kernels/cpu/
// copy.cc): sizes off the tile on both sides, a 16-bit output, 1 and 2 threads.
TEST_CASE("transposing copies into outputs beyond the caches (streamed) write every element", "[tensor][copy]") {
  testing::ThreadCountGuard guard;
  for (auto [rows, cols, to] : {std::tuple<int64_t, int64_t, DType>{2077, 1031, kFloat32},
                                std::tuple<int64_t, int64_t, DType>{2077, 2063, kBFloat16}}) {
    Tensor src = arange(0.0, static_cast<double>(rows * cols), 1.0, kFloat32).view({rows, cols});
    const float* s = src.data_ptr<float>();
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor out = Tensor::empty({cols, rows}, to);
      REQUIRE(out.nbytes() >= (size_t{8} << 20));
      out.copy_(src.t());
      int64_t wrong = 0;
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = 0; i < rows; ++i) {
          const float want = s[i * cols + j];
          const float got = to == kFloat32 ? out.data_ptr<float>()[j * rows + i]
                                           : static_cast<float>(out.data_ptr<BFloat16>()[j * rows + i]);
          wrong += got != (to == kFloat32 ? want : static_cast<float>(BFloat16(want)));
        }
      }
      INFO(fmt::format("[{}, {}] -> {} on {} threads", rows, cols, to, threads));
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("copies of narrowed rows write every element, whatever the run's length", "[tensor][copy]") {
  // Runs of 4 B to 8 KiB + 4 B, around the lengths where copy_bytes changes method (256 B,
  // 8 KiB) and 64-byte lines, starting at, just past and just short of a line.
  uint64_t seed = 1;
  for (DType dtype : {kFloat32, kBFloat16}) {
    const int64_t size = static_cast<int64_t>(itemsize(dtype));
    for (int64_t run_bytes : {4, 64, 256, 260, 320, 2046, 2048, 2050, 4096, 8188, 8192, 8196}) {
      const int64_t run = std::max<int64_t>(1, run_bytes / size), width = run + 64;
      const Tensor src = testing::random_tensor({5, width}, dtype, seed++);
      const std::vector<double> values = to_f64(src);
      for (int64_t start : {int64_t{0}, int64_t{1}, 64 / size - 1}) {
        const std::vector<double> got = to_f64(src.narrow(1, start, run).contiguous());
        int64_t wrong = 0;
        for (int64_t i = 0; i < 5; ++i) {
          for (int64_t j = 0; j < run; ++j) wrong += got[i * run + j] != values[i * width + start + j];
        }
        INFO(fmt::format("{} runs of {} elements from column {}", dtype, run, start));
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("copies and fills large enough to split across threads write every element once", "[tensor][copy]") {
  testing::ThreadCountGuard guard;
  // 301 x 517 = 155617 elements: above the split threshold, with ranges that start and end
  // inside runs. Values i * 0.5 are exact in bfloat16 only below 256: the cast checks rounding too.
  Tensor src = arange(0.0, 301.0 * 517.0 * 0.5, 0.5, kFloat32).view({301, 517});
  const float* s = src.data_ptr<float>();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    INFO(threads << " threads");
    const Tensor transposed = src.t().contiguous();  // tiled, in bands of tile rows
    const Tensor strided = src.slice(1, 0, 517, 2).contiguous();
    const Tensor cast = src.t().to(kBFloat16);
    Tensor filled = zeros({301, 517});
    Tensor every_third = filled.slice(1, 1, 517, 3);
    fill_(every_third, 7.0);
    int64_t wrong = 0;
    for (int64_t i = 0; i < 301; ++i) {
      for (int64_t j = 0; j < 517; ++j) {
        const float v = s[i * 517 + j];
        wrong += transposed.data_ptr<float>()[j * 301 + i] != v;
        wrong += static_cast<float>(cast.data_ptr<BFloat16>()[j * 301 + i]) != static_cast<float>(BFloat16(v));
        wrong += j % 2 == 0 && strided.data_ptr<float>()[i * 259 + j / 2] != v;
        wrong += filled.data_ptr<float>()[i * 517 + j] != (j % 3 == 1 ? 7.0f : 0.0f);
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("view is legal exactly when strides allow; reshape copies otherwise", "[tensor][view]") {
  Tensor t = iota({2, 3, 4});
  Tensor v = t.view({6, -1});
  CHECK(v.shape() == Shape{6, 4});
  CHECK(v.storage().is_same(t.storage()));
  // A narrow along the last dim keeps dims 0,1 mergeable.
  Tensor n = t.narrow(2, 0, 2);
  Tensor merged = n.view({6, 2});
  CHECK(merged.storage().is_same(t.storage()));
  check_equal(merged.select(0, 5), Shape{2}, {20, 21}, "view of a narrow");
  // A transposed tensor cannot be flattened without a copy.
  Tensor tt = t.transpose(1, 2);
  CHECK_THROWS_AS(tt.view({24}), ValueError);
  CHECK_THROWS_WITH(tt.view({24}), Catch::Contains("view") && Catch::Contains("reshape"));
  Tensor r = tt.reshape({24});
  CHECK_FALSE(r.storage().is_same(t.storage()));
  CHECK(to_f64(r) == to_f64(tt.contiguous()));
  CHECK(t.flatten(1).shape() == Shape{2, 12});
  CHECK(t.unsqueeze(1).shape() == Shape{2, 1, 3, 4});
  CHECK(t.unsqueeze(-1).shape() == Shape{2, 3, 4, 1});
  CHECK(t.unsqueeze(0).squeeze(0).shape() == t.shape());
  CHECK_THROWS_AS(t.view({5, 5}), ValueError);
  CHECK_THROWS_AS(t.view({-1, -1}), ValueError);
}

TEST_CASE("expand broadcasts with stride 0 and refuses to write through", "[tensor][view]") {
  Tensor row = iota({1, 3});
  Tensor e = row.expand({4, 3});
  CHECK(e.strides()[0] == 0);
  CHECK(to_f64(e.select(0, 3)) == std::vector<double>{0, 1, 2});
  CHECK(row.expand({2, -1, 3}).shape() == Shape{2, 1, 3});
  CHECK_THROWS_AS(iota({2, 3}).expand({4, 3}), ValueError);
  CHECK_THROWS_AS(e.copy_(zeros({4, 3})), ValueError);
}

TEST_CASE("copy_ broadcasts and converts every dtype pair", "[tensor][copy]") {
  for (DType to : testing::kAllDTypes) {
    for (DType from : testing::kAllDTypes) {
      Tensor src = arange(0, 6, 1, from == kBool ? kInt64 : from).to(from).view({2, 3});
      Tensor dst = zeros({2, 3}, to);
      dst.copy_(src);
      std::vector<double> expected;
      for (int i = 0; i < 6; ++i) expected.push_back(from == kBool || to == kBool ? (i != 0) : i);
      check_equal(dst, Shape{2, 3}, expected, fmt::format("copy {} <- {}", dtype_name(to), dtype_name(from)));
    }
  }
  Tensor dst = zeros({3, 2});
  dst.copy_(Tensor::from_vector<float>({7, 8}));
  check_equal(dst, Shape{3, 2}, {7, 8, 7, 8, 7, 8}, "broadcast copy");
  CHECK_THROWS_AS(dst.copy_(zeros({3})), ValueError);
}

TEST_CASE("bfloat16 and float16 round to nearest even", "[tensor][dtype]") {
  // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1 (even).
  // 1 + 3*2^-8 is a tie between 1 + 2^-7 and 1 + 2^-6 -> 1 + 2^-6 (even).
  std::vector<float> in = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f, 65504.0f};
  Tensor b = Tensor::from_vector(in).to(kBFloat16);
  check_equal(b, Shape{5}, {1.0, 1.0 + 0x1p-6, 1.0 + 0x1p-7, -2.5, 65536.0}, "f32 -> bf16");
  // f16: 10 mantissa bits. 1 + 2^-11 ties to 1; 65520 overflows to inf; 2^-25 (half the
  // smallest subnormal) ties to 0; 3 * 2^-25 rounds to 2^-23 (subnormal, even).
  std::vector<float> hin = {1.0f + 0x1p-11f, 65520.0f, 0x1p-25f, 3 * 0x1p-25f, 65504.0f, -0.0f};
  Tensor h = Tensor::from_vector(hin).to(kFloat16);
  check_equal(h, Shape{6}, {1.0, INFINITY, 0.0, 0x1p-23, 65504.0, 0.0}, "f32 -> f16");
  // Every f16 bit pattern survives f16 -> f32 -> f16.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    Half x;
    x.bits = static_cast<uint16_t>(bits);
    float f = x;
    if (std::isnan(f)) continue;
    REQUIRE(Half(f).bits == x.bits);
  }
}

TEST_CASE("Half's conversions (F16C where compiled in) agree bit for bit with the portable ones", "[tensor][dtype]") {
  INFO("Half uses " << (DTR_HAS_F16C ? "the F16C instructions" : "the portable conversions"));
  auto bits_of = [](float f) { return std::bit_cast<uint32_t>(f); };
  // half -> float: every bit pattern, NaNs included.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    Half x;
    x.bits = static_cast<uint16_t>(h);
    REQUIRE(bits_of(static_cast<float>(x)) == bits_of(float_from_fp16_portable(x.bits)));
  }
  // float -> half: every half value, each midpoint between neighbours (the ties) and the
  // floats one ulp either side of those, with both signs.
  std::vector<float> inputs;
  auto around = [&](float f) {
    for (float v : {f, std::nextafter(f, -INFINITY), std::nextafter(f, INFINITY)}) {
      inputs.push_back(v);
      inputs.push_back(-v);
    }
  };
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    Half lo, hi;
    lo.bits = static_cast<uint16_t>(h);
    hi.bits = static_cast<uint16_t>(h + 1);
    around(static_cast<float>(lo));
    around(0.5f * (static_cast<float>(lo) + static_cast<float>(hi)));  // exact: 12 significant bits
  }
  // The thresholds: overflow (65504 is the largest half, 65520 the first float that
  // rounds to infinity), the smallest normal 2^-14 and subnormal 2^-24, half of that
  // (ties to zero), float subnormals, the largest float, infinities.
  for (float f : {65504.0f, 65520.0f, 65536.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-126f, 0x1p-149f,
                  0x1.fffffep-127f, 0x1.fffffep127f, INFINITY}) {
    around(f);
  }
  // NaNs: quiet and signalling, with payloads in the bits a half keeps and in those it drops.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0x7fffffffu, 0x7f802000u, 0x7fc01fffu}) {
    inputs.push_back(std::bit_cast<float>(nan));
    inputs.push_back(std::bit_cast<float>(nan | 0x80000000u));
  }
  // And a sweep of float bit patterns (every 4099th), for anything the classes above miss.
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
    inputs.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  }
  for (float f : inputs) {
    INFO("float bits " << std::hex << bits_of(f));
    REQUIRE(Half(f).bits == fp16_from_float_portable(f));
  }
  // The portable path's known answers: ties to even, overflow, NaN quieted with its payload.
  CHECK(fp16_from_float_portable(1.0f + 0x1p-11f) == 0x3c00);
  CHECK(fp16_from_float_portable(1.0f + 3 * 0x1p-11f) == 0x3c02);
  CHECK(fp16_from_float_portable(65520.0f) == 0x7c00);
  CHECK(fp16_from_float_portable(std::bit_cast<float>(0x7fa00000u)) == 0x7f00);
  CHECK(bits_of(float_from_fp16_portable(0x7d00)) == 0x7fe00000u);
}

TEST_CASE("fill, full and arange", "[tensor][fill]") {
  for (DType d : testing::kAllDTypes) {
    Tensor t = full({2, 2}, 1.0, d);
    check_equal(t, Shape{2, 2}, {1, 1, 1, 1}, fmt::format("full {}", dtype_name(d)));
  }
  check_equal(arange(1.0, 2.0, 0.25, kFloat32), Shape{4}, {1.0, 1.25, 1.5, 1.75}, "arange f32");
  check_equal(arange(5), Shape{5}, {0, 1, 2, 3, 4}, "arange i64");
  CHECK(arange(3.0, 1.0).numel() == 0);
  CHECK_THROWS_AS(arange(0.0, 1.0, 0.0), ValueError);
  Tensor t = zeros({3, 4});
  Tensor col = t.select(1, 2);
  fill_(col, 5.0);
  check_equal(t.select(0, 1), Shape{4}, {0, 0, 5, 0}, "fill a strided view");
}

TEST_CASE("allocator statistics follow allocations, release and refill", "[tensor][memory]") {
  reset_peak_memory_stats(kCPU);
  const MemoryStats before = memory_stats(kCPU);
  {
    Tensor t = Tensor::empty({1024}, kFloat32);
    CHECK(memory_stats(kCPU).bytes_in_use == before.bytes_in_use + 4096);
    CHECK(memory_stats(kCPU).live_allocs == before.live_allocs + 1);
    Tensor view = t.narrow(0, 0, 10);  // views allocate nothing
    CHECK(memory_stats(kCPU).total_allocs == before.total_allocs + 1);
    // FSDP's pattern: release the storage (memory falls), refill it (the same storage).
    Storage s = t.storage();
    s.release();
    CHECK(memory_stats(kCPU).bytes_in_use == before.bytes_in_use);
    CHECK_THROWS_AS(view.data(), ValueError);
    CHECK_THROWS_WITH(view.data(), Catch::Contains("released"));
    s.allocate(4096);
    CHECK(view.storage().is_same(s));
    fill_(t, 3.0);
    CHECK(view.select(0, 9).item() == 3.0);
    CHECK(memory_stats(kCPU).peak_bytes >= before.bytes_in_use + 4096);
  }
  CHECK(memory_stats(kCPU).bytes_in_use == before.bytes_in_use);
}

constexpr size_t kMiB = size_t{1} << 20;

TEST_CASE("an allocation the system cannot serve is an OutOfMemoryError naming the device and bytes",
          "[tensor][memory]") {
  CpuAllocator a(16 * kMiB);
  void* held = a.allocate(3 * kMiB);
  a.deallocate(a.allocate(2 * kMiB), 2 * kMiB);  // leaves a 2 MiB block cached
  REQUIRE(a.stats().bytes_cached == int64_t{2 * kMiB});
  const size_t huge = size_t{1} << 60;  // beyond any address space
  try {
    a.allocate(huge);
    FAIL("allocate(2^60 bytes) returned");
  } catch (const OutOfMemoryError& e) {
    CHECK_THAT(std::string(e.what()),
               Catch::Contains("out of memory on cpu") && Catch::Contains(std::to_string(huge) + " bytes") &&
                   Catch::Contains(std::to_string(3 * kMiB) + " in use") && Catch::Contains("0 cached"));
  }
  // The allocator returned its cached blocks to the system before giving up.
  CHECK(a.stats().bytes_cached == 0);
  // The failed request changed no statistic, and the allocator still serves requests.
  CHECK(a.stats().bytes_in_use == int64_t{3 * kMiB});
  CHECK(a.stats().live_allocs == 1);
  a.deallocate(held, 3 * kMiB);
  CHECK_THROWS_AS(Tensor::empty({int64_t{1} << 58}, kFloat32), OutOfMemoryError);
}

TEST_CASE("the CPU cache reuses large blocks by rounded size and counts them as cached, not in use",
          "[tensor][memory]") {
  CpuAllocator a(16 * kMiB);
  // 3 MiB is served by a 4 MiB block (two 2 MiB granules), 64-byte aligned.
  void* p = a.allocate(3 * kMiB);
  CHECK(reinterpret_cast<uintptr_t>(p) % CpuAllocator::kAlignment == 0);
  CHECK(a.stats().bytes_in_use == int64_t{3 * kMiB});
  CHECK(a.stats().bytes_cached == 0);
  std::memset(p, 7, 3 * kMiB);
  a.deallocate(p, 3 * kMiB);
  CHECK(a.stats().bytes_in_use == 0);
  CHECK(a.stats().bytes_cached == int64_t{4 * kMiB});
  CHECK(a.stats().live_allocs == 0);
  // Any request that rounds to the same block size gets the same block back.
  void* q = a.allocate(4 * kMiB - 100);
  CHECK(q == p);
  CHECK(a.stats().bytes_in_use == int64_t{4 * kMiB - 100});
  CHECK(a.stats().bytes_cached == 0);
  CHECK(a.stats().total_allocs == 2);
  CHECK(a.stats().system_allocs == 1);  // the second came from the cache
  // Another size class does not take it.
  void* r = a.allocate(5 * kMiB);
  CHECK(r != q);
  a.deallocate(q, 4 * kMiB - 100);
  a.deallocate(r, 5 * kMiB);
  CHECK(a.stats().bytes_cached == int64_t{(4 + 6) * kMiB});
  CHECK(a.stats().peak_bytes == int64_t{9 * kMiB - 100});
  // Blocks under 1 MiB are cached in runs of 64 KiB: 300 KiB takes a 320 KiB block.
  void* mid = a.allocate(300 << 10);
  CHECK(reinterpret_cast<uintptr_t>(mid) % CpuAllocator::kAlignment == 0);
  std::memset(mid, 1, 300 << 10);
  a.deallocate(mid, 300 << 10);
  CHECK(a.stats().bytes_cached == int64_t{10 * kMiB} + (320 << 10));
  CHECK(a.allocate(310 << 10) == mid);
  a.deallocate(mid, 310 << 10);
  // Blocks under 128 KiB come from the system allocator and are never cached.
  void* small = a.allocate((128 << 10) - 1);
  a.deallocate(small, (128 << 10) - 1);
  CHECK(a.stats().system_allocs == 4);  // 4 MiB, 6 MiB, 320 KiB blocks and the small one
  CHECK(a.stats().bytes_cached == int64_t{10 * kMiB} + (320 << 10));
  CHECK(CpuAllocator::block_size(kMiB - 1) == kMiB);
  CHECK(CpuAllocator::block_size(kMiB) == 2 * kMiB);  // from 1 MiB: whole huge-page granules
  CHECK(CpuAllocator::block_size(2 * kMiB) == 2 * kMiB);
  CHECK(CpuAllocator::block_size(2 * kMiB + 1) == 4 * kMiB);
  a.empty_cache();
  CHECK(a.stats().bytes_cached == 0);
  CHECK(a.stats().bytes_in_use == 0);
}

TEST_CASE("the CPU cache never holds more than its limit; the oldest blocks go first", "[tensor][memory]") {
  const size_t limit = 8 * kMiB;
  CpuAllocator a(limit);
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(a.allocate(4 * kMiB));  // 3 x 4 MiB in use
  for (void* b : blocks) {
    a.deallocate(b, 4 * kMiB);
    CHECK(a.stats().bytes_cached <= int64_t{limit});
  }
  CHECK(a.stats().bytes_cached == int64_t{limit});
  // The first freed was evicted: the two kept are the last two, most recent first.
  CHECK(a.allocate(4 * kMiB) == blocks[2]);
  CHECK(a.allocate(4 * kMiB) == blocks[1]);
  CHECK(a.stats().bytes_cached == 0);
  a.deallocate(blocks[2], 4 * kMiB);
  a.deallocate(blocks[1], 4 * kMiB);
  // A block larger than the limit is returned at once and evicts nothing.
  void* big = a.allocate(10 * kMiB);
  a.deallocate(big, 10 * kMiB);
  CHECK(a.stats().bytes_cached == int64_t{limit});
  // Freeing a 6 MiB block evicts both 4 MiB blocks, oldest first, to stay within 8 MiB.
  void* six = a.allocate(6 * kMiB);
  a.deallocate(six, 6 * kMiB);
  CHECK(a.stats().bytes_cached == int64_t{6 * kMiB});
  CHECK(a.allocate(6 * kMiB) == six);
  a.deallocate(six, 6 * kMiB);
}

TEST_CASE("the CPU cache is consistent under concurrent allocation", "[tensor][memory]") {
  CpuAllocator a(12 * kMiB);
  auto churn = [&a](size_t seed) {
    for (size_t i = 0; i < 200; ++i) {
      const size_t n = (1 + (i * 7 + seed) % 5) * kMiB;  // 1-5 MiB: three block sizes
      auto* p = static_cast<char*>(a.allocate(n));
      p[0] = p[n - 1] = 1;  // the whole block is ours
      a.deallocate(p, n);
    }
  };
  std::thread other(churn, 3);
  churn(0);
  other.join();
  const MemoryStats s = a.stats();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.live_allocs == 0);
  CHECK(s.total_allocs == 400);
  CHECK(s.bytes_cached <= int64_t{12 * kMiB});
  CHECK(s.bytes_cached % int64_t{CpuAllocator::kRun} == 0);
}

TEST_CASE("tensors reuse cached CPU blocks; empty_cache(kCPU) returns them", "[tensor][memory]") {
  const void* first = nullptr;
  {
    Tensor t = Tensor::empty({1024, 1024}, kFloat32);  // 4 MiB
    first = t.data();
  }
  const MemoryStats freed = memory_stats(kCPU);
  CHECK(freed.bytes_cached >= int64_t{4 * kMiB});
  {
    Tensor t = Tensor::empty({1024, 1024}, kFloat32);
    CHECK(t.data() == first);
    CHECK(memory_stats(kCPU).bytes_cached == freed.bytes_cached - int64_t{4 * kMiB});
    CHECK(memory_stats(kCPU).bytes_in_use == freed.bytes_in_use + int64_t{4 * kMiB});
  }
  empty_cache(kCPU);
  CHECK(memory_stats(kCPU).bytes_cached == 0);
  CHECK(memory_stats(kCPU).bytes_in_use == freed.bytes_in_use);
}

TEST_CASE("bad input throws typed errors that name the op and the shapes", "[tensor][errors]") {
  Tensor t = iota({2, 3});
  CHECK_THROWS_AS(t.narrow(2, 0, 1), IndexError);
  CHECK_THROWS_WITH(t.narrow(1, 2, 2), Catch::Contains("narrow") && Catch::Contains("float32[2, 3]"));
  CHECK_THROWS_AS(t.select(0, 2), IndexError);
  CHECK_THROWS_AS(t.transpose(0, 5), IndexError);
  CHECK_THROWS_AS(t.permute({0, 0}), ValueError);
  CHECK_THROWS_AS(t.data_ptr<double>(), TypeError);
  CHECK_THROWS_AS(t.item(), ValueError);
  CHECK_THROWS_AS(Tensor::empty({-1}), ValueError);
  CHECK_THROWS_WITH(t.view({4, 2}), Catch::Contains("[4, 2]") && Catch::Contains("6 elements"));
}

TEST_CASE("printing shows values, dtype and shape", "[tensor]") {
  Tensor t = iota({2, 2});
  CHECK(t.to_string() == "Tensor([[0, 1],\n        [2, 3]], float32[2, 2])");
  CHECK(Tensor::from_vector<double>({2.5}).to_string() == "Tensor(2.5, float64[])");
  CHECK(arange(10).to_string() == "Tensor([0, 1, 2, ..., 7, 8, 9], int64[10])");
}

}  // namespace
}  // namespace dtr
