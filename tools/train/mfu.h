// Model FLOPs utilisation (PaLM's MFU, as llm.c and torchtitan report it): the FLOPs a
// token costs the model, over what the device could do at its dense peak.
//
// FLOPs per token: 6 per parameter (2 forward, 4 backward; every parameter, embeddings
// included, as llm.c counts them) plus attention's score and value products,
// 12 * layers * dim * seq (PaLM's appendix B; the causal mask is not subtracted, so the
// figure is comparable with torchtitan's and llm.c's). Peaks are the dense (non-sparse)
// tensor-core figures of NVIDIA's datasheets, per GPU (llm.c's table): bf16/f16, TF32, and
// float32 without tensor cores.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/dtype.h"

namespace dtr::train {

double model_flops_per_token(int64_t parameters, int64_t layers, int64_t dim, int64_t seq_len);

// The dense peak TFLOP/s of the GPU named `gpu_name` (cudaDeviceProp::name, e.g. "NVIDIA
// H200") for matrix products in `compute` (bfloat16/float16; float32 with tf32 or without);
// nullopt for a GPU not in the table.
std::optional<double> dense_peak_tflops(std::string_view gpu_name, DType compute, bool tf32 = false);

// Achieved model FLOP/s over the peak: tokens/s of one device times flops_per_token.
double mfu(double tokens_per_s, double flops_per_token, double peak_tflops);

}  // namespace dtr::train
