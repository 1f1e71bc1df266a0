// Philox4x32-10, the counter-based generator under every random op in dtr, and the
// per-element draws built on it (usable on host and device).
//
// philox4x32_10(counter, key) is a keyed bijection of 128-bit counters (Salmon et al.,
// SC 2011; cuRAND's and PyTorch's Philox). Element i of a global tensor is drawn from the
// block whose counter is {lo(i / w), hi(i / w), 0, 0} under key = seed, w elements sharing
// one block, so a value depends only on (seed, global row-major index): never on threads,
// ranks or sharding. The philox_* draws below are that contract; kernels build their values
// from the same helpers, the CPU ones on batches of blocks (cpu/internal/philox_batch.h).
#pragma once

#include <math.h>
#include <stdint.h>

#include "core/dtype.h"

namespace dtr {

struct Uint32x4 {
  uint32_t v[4];
};
struct Uint32x2 {
  uint32_t v[2];
};

// Ten Philox rounds of counter under key (Random123's philox4x32_R with R = 10).
DTR_HOST_DEVICE inline Uint32x4 philox4x32_10(Uint32x4 counter, Uint32x2 key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
  uint32_t k0 = key.v[0], k1 = key.v[1];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t next0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t next2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c0 = next0;
    c1 = static_cast<uint32_t>(p1);
    c2 = next2;
    c3 = static_cast<uint32_t>(p0);
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Uint32x4{{c0, c1, c2, c3}};
}

// The four random words of block `block` under `seed`.
DTR_HOST_DEVICE inline Uint32x4 philox_block(uint64_t seed, uint64_t block) {
  return philox4x32_10(Uint32x4{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}},
                       Uint32x2{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}});
}

// 53 random bits of two words as a double in [0, 1), a multiple of 2^-53: the top 53 of
// hi:lo, computed as hi * 2^21 + (lo >> 11) (both parts and their sum are exact in a
// double), which vectorises where a 64-bit integer conversion does not.
DTR_HOST_DEVICE inline double philox_unit_double(uint32_t hi, uint32_t lo) {
  return (static_cast<double>(hi) * 0x1.0p21 + static_cast<double>(lo >> 11)) * 0x1.0p-53;
}

// The Box-Muller pair of one block's words: words 0-1 give u1 in (0, 1], words 2-3 give
// u2 in [0, 1); z0 = r cos(2 pi u2), z1 = r sin(2 pi u2) with r = sqrt(-2 log u1).
DTR_HOST_DEVICE inline void philox_box_muller(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, double* z0,
                                              double* z1) {
  const double u1 = 1.0 - philox_unit_double(w0, w1);
  const double theta = 6.283185307179586476925 * philox_unit_double(w2, w3);
  const double r = sqrt(-2.0 * log(u1));
  *z0 = r * cos(theta);
  *z1 = r * sin(theta);
}

// offset + scale * v rounded once (a fused multiply-add): how uniform_ places u in
// [lo, hi) (lo + (hi - lo) u) and normal_ scales z (mean + std z). Spelled out so that no
// compiler's choice to contract a * b + c (GCC's under -march=native, nvcc's by default)
// changes a value: host and device compute the same bits.
DTR_HOST_DEVICE inline double philox_affine(double v, double scale, double offset) { return fma(scale, v, offset); }

// Whether a random word draws true with probability p: word < p * 2^32 (so p = 0 is never
// and p = 1 always true).
DTR_HOST_DEVICE inline bool philox_word_below(uint32_t word, double p) {
  return static_cast<double>(word) < p * 4294967296.0;
}

// Uniform in [0, 1) for global element `index`: words 2(i%2), 2(i%2)+1 of block i/2.
DTR_HOST_DEVICE inline double philox_uniform(uint64_t seed, uint64_t index) {
  const Uint32x4 w = philox_block(seed, index / 2);
  const int k = static_cast<int>(index % 2) * 2;
  return philox_unit_double(w.v[k], w.v[k + 1]);
}

// Standard normal for global element `index`: the Box-Muller pair of block i/2, z0 for
// even i and z1 for odd i.
DTR_HOST_DEVICE inline double philox_normal(uint64_t seed, uint64_t index) {
  const Uint32x4 w = philox_block(seed, index / 2);
  double z0, z1;
  philox_box_muller(w.v[0], w.v[1], w.v[2], w.v[3], &z0, &z1);
  return index % 2 == 0 ? z0 : z1;
}

// True with probability p for global element `index`: word i%4 of block i/4 is below
// p * 2^32.
DTR_HOST_DEVICE inline bool philox_bernoulli(uint64_t seed, uint64_t index, double p) {
  return philox_word_below(philox_block(seed, index / 4).v[index % 4], p);
}

}  // namespace dtr
