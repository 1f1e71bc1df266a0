#include "tools/train/mfu.h"

#include <array>

namespace dtr::train {
namespace {

struct Peak {
  std::string_view name;  // matched as a substring of the device name; the first match wins
  double half, tf32, fp32;
};

// Dense TFLOP/s from NVIDIA's datasheets (SXM parts unless named).
constexpr std::array<Peak, 9> kPeaks = {{
    {"H100 PCIe", 756, 378, 51},
    {"H100 NVL", 835, 418, 60},
    {"H100", 989, 494, 67},  // SXM5
    {"H200 NVL", 835, 418, 60},
    {"H200", 989, 494, 67},  // SXM
    {"B200", 2250, 1100, 75},
    {"A100", 312, 156, 19.5},
    {"L40S", 362, 183, 91.6},
    {"L4", 121, 60, 30.3},
}};

}  // namespace

double model_flops_per_token(int64_t parameters, int64_t layers, int64_t dim, int64_t seq_len) {
  return 6.0 * static_cast<double>(parameters) +
         12.0 * static_cast<double>(layers) * static_cast<double>(dim) * static_cast<double>(seq_len);
}

std::optional<double> dense_peak_tflops(std::string_view gpu_name, DType compute, bool tf32) {
  for (const Peak& p : kPeaks) {
    if (gpu_name.find(p.name) == std::string_view::npos) continue;
    if (compute == kBFloat16 || compute == kFloat16) return p.half;
    if (compute == kFloat32) return tf32 ? p.tf32 : p.fp32;
    return std::nullopt;
  }
  return std::nullopt;
}

double mfu(double tokens_per_s, double flops_per_token, double peak_tflops) {
  return tokens_per_s * flops_per_token / (peak_tflops * 1e12);
}

}  // namespace dtr::train
