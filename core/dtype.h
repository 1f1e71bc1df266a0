// DType: the element types of a tensor, and the one place where ops dispatch on them.
//
// bfloat16 and float16 are storage types: kernels load them into float, compute, and
// store back with round-to-nearest-even (so f32 -> bf16 -> f32 is exact for values that
// bf16 can hold). Their arithmetic accumulates in float (acc_t), float64 in double.
// dispatch_*(dtype, op, f) calls f(TypeTag<T>{}) for the C++ type of dtype, or throws
// NotImplementedError naming the op and the dtype.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>

#if defined(__CUDACC__)
#define DTR_HOST_DEVICE __host__ __device__
#else
#define DTR_HOST_DEVICE
#endif

// x86's half <-> float instructions, in host code only (nvcc's host pass too keeps the
// portable path, so that a CUDA source and a C++ source compile Half alike).
#if defined(__F16C__) && !defined(__CUDACC__)
#define DTR_HAS_F16C 1
#include <immintrin.h>
#else
#define DTR_HAS_F16C 0
#endif

namespace dtr {

enum class DType : uint8_t { kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kBool };
inline constexpr DType kFloat32 = DType::kFloat32;
inline constexpr DType kFloat64 = DType::kFloat64;
inline constexpr DType kBFloat16 = DType::kBFloat16;
inline constexpr DType kFloat16 = DType::kFloat16;
inline constexpr DType kInt32 = DType::kInt32;
inline constexpr DType kInt64 = DType::kInt64;
inline constexpr DType kBool = DType::kBool;

constexpr size_t itemsize(DType d) {
  switch (d) {
    case kFloat64:
    case kInt64: return 8;
    case kFloat32:
    case kInt32: return 4;
    case kBFloat16:
    case kFloat16: return 2;
    case kBool: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType d) {
  switch (d) {
    case kFloat32: return "float32";
    case kFloat64: return "float64";
    case kBFloat16: return "bfloat16";
    case kFloat16: return "float16";
    case kInt32: return "int32";
    case kInt64: return "int64";
    case kBool: return "bool";
  }
  return "?";
}

constexpr bool is_floating(DType d) { return d == kFloat32 || d == kFloat64 || d == kBFloat16 || d == kFloat16; }

// Bit casts usable on host and device (std::bit_cast is not available in device code).
DTR_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
DTR_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// bfloat16: the top 16 bits of a float32. Conversion rounds to nearest, ties to even;
// NaN stays a (quiet) NaN.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  DTR_HOST_DEVICE BFloat16(float f) {  // NOLINT: implicit like a built-in float type
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      bits = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  DTR_HOST_DEVICE operator float() const { return bits_float(static_cast<uint32_t>(bits) << 16); }
};

// IEEE float16 (1-5-10), portable bit manipulation: the conversions of device code and of
// hosts without F16C. float -> half rounds to nearest, ties to even, including into
// subnormals; overflow gives infinity. A NaN stays NaN, quieted, keeping its payload's
// top bits (exactly what x86's F16C instructions do, so both paths agree bit for bit).
DTR_HOST_DEVICE inline uint16_t fp16_from_float_portable(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x3ffu);  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (a < 0x38800000u) {                        // below the smallest normal 2^-14: subnormal or zero
    // Scale so the subnormal's integer mantissa sits in the low bits, then round.
    float scaled = bits_float(a) * 16777216.0f;  // * 2^24: one ulp of half subnormal = 1.0
    uint32_t m = static_cast<uint32_t>(scaled);
    float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return sign | static_cast<uint16_t>(m);
  }
  uint32_t e = ((a >> 23) - 112u) << 10;  // rebias 127 -> 15
  uint32_t m = a & 0x7fffffu;
  uint32_t h = e | (m >> 13);
  uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
  return sign | static_cast<uint16_t>(h);
}

// half -> float is exact; a NaN comes back quieted (as F16C does).
DTR_HOST_DEVICE inline float float_from_fp16_portable(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t e = (bits >> 10) & 0x1fu;
  uint32_t m = bits & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m != 0 ? 0x400000u : 0u) | (m << 13));
  if (e == 0) {  // zero or subnormal: m * 2^-24
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// IEEE float16, converted as fp16_from_float_portable / float_from_fp16_portable say. Host
// code compiled with F16C (-march=native on x86) uses the hardware instructions instead:
// one instruction and no branches per element, the same bits.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  DTR_HOST_DEVICE Half(float f) {  // NOLINT: implicit like a built-in float type
#if DTR_HAS_F16C
    bits = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    bits = fp16_from_float_portable(f);
#endif
  }
  DTR_HOST_DEVICE operator float() const {
#if DTR_HAS_F16C
    return _cvtsh_ss(bits);
#else
    return float_from_fp16_portable(bits);
#endif
  }
};

template <class T>
struct TypeTag {
  using type = T;
};

// The type arithmetic on T accumulates in: float for the 16-bit floats, int64 for int32 and
// bool (sums and counts), T itself otherwise.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>, float,
                                 std::conditional_t<std::is_same_v<T, int32_t> || std::is_same_v<T, bool>, int64_t, T>>;

// The dtype whose elements are stored as T.
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return kFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return kFloat64;
  else if constexpr (std::is_same_v<T, BFloat16>)
    return kBFloat16;
  else if constexpr (std::is_same_v<T, Half>)
    return kFloat16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return kInt32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return kInt64;
  else {
    static_assert(std::is_same_v<T, bool>, "dtype_of<T>: T stores no dtype");
    return kBool;
  }
}

// The dtype of acc_t: what a kernel's saved statistics (layer_norm's mean, cross_entropy's
// logsumexp) are stored in.
constexpr DType acc_dtype(DType d) {
  switch (d) {
    case kBFloat16:
    case kFloat16: return kFloat32;
    case kInt32:
    case kBool: return kInt64;
    default: return d;
  }
}

// The type an element is computed in by elementwise kernels (CPU and CUDA): float for the
// 16-bit floats, the type itself otherwise.
template <class T>
using opmath_t = std::conditional_t<std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>, float, T>;

// Converts between any two element types through the accumulation type.
template <class To, class From>
DTR_HOST_DEVICE inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, BFloat16> || std::is_same_v<From, Half>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, BFloat16> || std::is_same_v<To, Half>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

// Throws NotImplementedError "op: not implemented for dtype int32" (defined in dtype.cc,
// so that CUDA sources need no fmt).
[[noreturn]] void throw_dtype_not_implemented(std::string_view op, DType d);

// Calls f(TypeTag<T>{}) for float32, float64, bfloat16 and float16; any other dtype throws.
template <class F>
decltype(auto) dispatch_floating(DType d, std::string_view op, F&& f) {
  switch (d) {
    case kFloat32: return f(TypeTag<float>{});
    case kFloat64: return f(TypeTag<double>{});
    case kBFloat16: return f(TypeTag<BFloat16>{});
    case kFloat16: return f(TypeTag<Half>{});
    default: throw_dtype_not_implemented(op, d);
  }
}

// Every dtype: the floating ones, int32, int64 and bool.
template <class F>
decltype(auto) dispatch_all(DType d, std::string_view op, F&& f) {
  switch (d) {
    case kInt32: return f(TypeTag<int32_t>{});
    case kInt64: return f(TypeTag<int64_t>{});
    case kBool: return f(TypeTag<bool>{});
    default: return dispatch_floating(d, op, std::forward<F>(f));
  }
}

// Numbers (every dtype but bool): arithmetic that makes no sense on bool throws.
template <class F>
decltype(auto) dispatch_numeric(DType d, std::string_view op, F&& f) {
  if (d == kBool) throw_dtype_not_implemented(op, d);
  return dispatch_all(d, op, std::forward<F>(f));
}

}  // namespace dtr

#if !defined(__CUDACC__)
#include <fmt/format.h>

template <>
struct fmt::formatter<dtr::DType> : fmt::formatter<std::string_view> {
  auto format(dtr::DType d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtr::dtype_name(d), ctx);
  }
};
#endif
