// The instruction-set paths of dtr's hand-written CPU kernels (the GEMM, kernels/cpu/gemm.h),
// chosen at run time from what the CPU and the OS report (cpuid, xgetbv, and for AMX the
// Linux tile-data permission), never from the build machine: hosts of one kind alternate
// between AVX-512+AMX Xeons and AVX2-only EPYCs. Each path implies the ones before it:
//
//   scalar       portable C++ (SSE2, every x86-64)
//   avx2         AVX2 + FMA, 8 float lanes
//   avx512       AVX-512 F/BW/VL/DQ + FMA, 16 float lanes
//   avx512_bf16  avx512 + vdpbf16ps (bfloat16 pairs summed into float32)
//   amx          avx512_bf16 + AMX tiles (TDPBF16PS), with the OS's permission for tile data
//
// DTR_CPU_ISA=<name> forces a lower path (for tests and for comparing paths on one host);
// asking for one the CPU lacks is a ValueError. (oneDNN's ONEDNN_MAX_CPU_ISA plays this role.)
#pragma once

#include <cstdint>
#include <string_view>

namespace dtr::cpu {

enum class CpuIsa : uint8_t { kScalar, kAvx2, kAvx512, kAvx512Bf16, kAmx };

// The best path this CPU and OS support (probed once per process; for AMX this requests the
// tile-data permission, arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)).
CpuIsa detected_cpu_isa();

// The path kernels use: DTR_CPU_ISA's when set, else detected_cpu_isa(). ValueError naming
// the legal values when DTR_CPU_ISA is unknown or above what the CPU supports.
CpuIsa cpu_isa();

// value ("scalar", "avx2", "avx512", "avx512_bf16" or "amx") as a path no higher than
// `detected`, or ValueError saying why not (what cpu_isa() applies to DTR_CPU_ISA).
CpuIsa parse_cpu_isa(std::string_view value, CpuIsa detected);

// The name DTR_CPU_ISA takes for isa.
std::string_view cpu_isa_name(CpuIsa isa);

}  // namespace dtr::cpu
