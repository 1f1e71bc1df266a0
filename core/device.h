// Device: where a tensor's storage lives, CPU or CUDA(index).
//
// CPU is a first-class device, not a fallback. A CUDA device is usable only where
// cuda::device_count() > 0; every op on a tensor checks that its operands share a device.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace dtr {

enum class DeviceType : uint8_t { kCPU, kCUDA };
inline constexpr DeviceType kCPU = DeviceType::kCPU;
inline constexpr DeviceType kCUDA = DeviceType::kCUDA;

struct Device {
  DeviceType type = kCPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(t == kCPU ? 0 : i) {}  // NOLINT: implicit from kCPU
  bool is_cpu() const { return type == kCPU; }
  bool is_cuda() const { return type == kCUDA; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }
};

}  // namespace dtr

template <>
struct fmt::formatter<dtr::Device> : fmt::formatter<std::string> {
  auto format(const dtr::Device& d, format_context& ctx) const {
    return fmt::formatter<std::string>::format(d.str(), ctx);
  }
};
