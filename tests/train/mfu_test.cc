// MFU's pieces: the FLOPs per token of a transformer (6N + 12 L d T) and the dense peaks of
// known GPUs, matched by the name CUDA reports, the more specific part first.
#include <catch2/catch.hpp>

#include "tools/train/mfu.h"

namespace dtr::train {
namespace {

TEST_CASE("model FLOPs per token: 6 per parameter plus attention's 12 L d T", "[train]") {
  // GPT-2 small: 124,475,904 parameters, 12 layers, dim 768, context 1024.
  CHECK(model_flops_per_token(124475904, 12, 768, 1024) == 6.0 * 124475904 + 12.0 * 12 * 768 * 1024);
  CHECK(model_flops_per_token(1000, 0, 64, 128) == 6000.0);
  // The attention term grows with the context, the parameter term does not.
  CHECK(model_flops_per_token(1000, 2, 64, 256) - model_flops_per_token(1000, 2, 64, 128) == 12.0 * 2 * 64 * 128);
}

TEST_CASE("dense peaks by GPU name and compute dtype", "[train]") {
  CHECK(dense_peak_tflops("NVIDIA H200", kBFloat16) == 989.0);
  CHECK(dense_peak_tflops("NVIDIA H200", kFloat16) == 989.0);
  CHECK(dense_peak_tflops("NVIDIA H200", kFloat32) == 67.0);
  CHECK(dense_peak_tflops("NVIDIA H200", kFloat32, /*tf32=*/true) == 494.0);
  CHECK(dense_peak_tflops("NVIDIA H200 NVL", kBFloat16) == 835.0);  // not the SXM part's
  CHECK(dense_peak_tflops("NVIDIA H100 80GB HBM3", kBFloat16) == 989.0);
  CHECK(dense_peak_tflops("NVIDIA H100 PCIe", kBFloat16) == 756.0);
  CHECK(dense_peak_tflops("NVIDIA A100-SXM4-80GB", kBFloat16) == 312.0);
  CHECK(dense_peak_tflops("NVIDIA L40S", kBFloat16) == 362.0);
  CHECK(dense_peak_tflops("NVIDIA L4", kBFloat16) == 121.0);
  CHECK_FALSE(dense_peak_tflops("NVIDIA GeForce GTX 1080", kBFloat16).has_value());
  CHECK_FALSE(dense_peak_tflops("NVIDIA H200", kFloat64).has_value());
}

TEST_CASE("MFU is achieved model FLOP/s over the peak", "[train]") {
  // 10,000 tokens/s of a 1 GFLOP/token model on a 100 TFLOP/s device: 10%.
  CHECK(mfu(10000, 1e9, 100) == Approx(0.1));
  CHECK(mfu(0, 1e9, 100) == 0.0);
}

}  // namespace
}  // namespace dtr::train
