#include "kernels/cpu/cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cstdlib>

#include "core/error.h"

namespace dtr::cpu {
namespace {

constexpr std::array kIsas = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx};

// Linux's arch_prctl request for permission to use an extended state component, and the
// component number of AMX's tile data (asm/prctl.h, the kernel's xstate numbering).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool bit(uint32_t word, int i) { return ((word >> i) & 1u) != 0; }

// XCR0: which register states the OS saves and restores (xgetbv needs OSXSAVE, checked first).
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuIsa probe() {
  uint32_t a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return CpuIsa::kScalar;
  __cpuid(1, a, b, c, d);
  const bool fma = bit(c, 12), osxsave = bit(c, 27), avx = bit(c, 28);
  if (!(osxsave && avx && fma)) return CpuIsa::kScalar;
  const uint64_t xcr = xcr0();
  if ((xcr & 0x6) != 0x6) return CpuIsa::kScalar;  // XMM and YMM state
  __cpuid_count(7, 0, a, b, c, d);
  const uint32_t leaf7_ebx = b, leaf7_edx = d;
  if (!bit(leaf7_ebx, 5)) return CpuIsa::kScalar;  // AVX2
  // AVX-512 F (16), DQ (17), BW (30), VL (31), and the opmask and ZMM states in XCR0.
  const bool avx512 =
      bit(leaf7_ebx, 16) && bit(leaf7_ebx, 17) && bit(leaf7_ebx, 30) && bit(leaf7_ebx, 31) && (xcr & 0xe0) == 0xe0;
  if (!avx512) return CpuIsa::kAvx2;
  __cpuid_count(7, 1, a, b, c, d);
  if (!bit(a, 5)) return CpuIsa::kAvx512;  // AVX512_BF16
  // AMX-BF16 (22) and AMX-TILE (24), the tile config and data states in XCR0, and Linux's
  // permission for this process to use tile data (refused before 5.16).
  const bool amx = bit(leaf7_edx, 22) && bit(leaf7_edx, 24) && (xcr & (3ull << 17)) == (3ull << 17);
  if (!amx || syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return CpuIsa::kAvx512Bf16;
  return CpuIsa::kAmx;
}

}  // namespace

CpuIsa detected_cpu_isa() {
  static const CpuIsa detected = probe();
  return detected;
}

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512_bf16";
    case CpuIsa::kAmx: return "amx";
  }
  DTR_INTERNAL_ASSERT(false, "unknown CpuIsa {}", static_cast<int>(isa));
}

CpuIsa parse_cpu_isa(std::string_view value, CpuIsa detected) {
  for (const CpuIsa isa : kIsas) {
    if (value != cpu_isa_name(isa)) continue;
    DTR_CHECK(
        isa <= detected, ValueError,
        "DTR_CPU_ISA={} asks for a path this CPU lacks: it supports up to {}; set one of scalar .. {} or unset it",
        value, cpu_isa_name(detected), cpu_isa_name(detected));
    return isa;
  }
  DTR_CHECK(false, ValueError,
            "DTR_CPU_ISA={} is not a CPU path; legal: scalar, avx2, avx512, avx512_bf16, amx (up to "
            "{} on this CPU)",
            value, cpu_isa_name(detected));
  return detected;
}

CpuIsa cpu_isa() {
  // Read once: a kernel's path does not change while the process runs.
  static const CpuIsa isa = [] {
    const char* forced = std::getenv("DTR_CPU_ISA");
    return forced != nullptr && *forced != '\0' ? parse_cpu_isa(forced, detected_cpu_isa()) : detected_cpu_isa();
  }();
  return isa;
}

}  // namespace dtr::cpu
