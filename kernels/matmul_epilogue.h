// MatmulEpilogue: what matmul_bias (kernels/matmul.h) applies to the product, one enum for
// the Tensor-level op and its CPU and CUDA kernels. cuBLASLt's GELU epilogue is the tanh
// approximation (torch's gelu(approximate="tanh"); PyTorch's _addmm_activation uses it so
// on CUDA), so that is the only fused GELU: the exact erf GELU stays its own kernel, gelu().
// Whether the GELU's input is saved too is not an epilogue: the kernels save it when given a
// `pre` to write (cuBLASLt's GELU_AUX_BIAS). No includes beyond the standard library.
#pragma once

#include <cstdint>

namespace dtr {

enum class MatmulEpilogue : uint8_t {
  kBias,          // a b + bias                                  (CUBLASLT_EPILOGUE_BIAS)
  kBiasGeluTanh,  // gelu(a b + bias, GeluApproximation::kTanh)  (CUBLASLT_EPILOGUE_GELU_BIAS)
};

}  // namespace dtr
