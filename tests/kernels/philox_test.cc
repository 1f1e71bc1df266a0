// Philox4x32-10: the known-answer vectors of Random123 (Salmon et al., SC 2011) and the
// per-element draws' documented mapping from blocks to elements. The vectors were
// recomputed independently of this code (the script above the first test) and match
// Random123's kat_vectors file.
#include "kernels/philox.h"

#include <catch2/catch.hpp>

#include <cmath>

namespace dtr {
namespace {

void check_kat(Uint32x4 counter, Uint32x2 key, Uint32x4 expected) {
  const Uint32x4 got = philox4x32_10(counter, key);
  for (int i = 0; i < 4; ++i) {
    INFO("word " << i);
    CHECK(got.v[i] == expected.v[i]);
  }
}

// The known-answer vectors, recomputed by this Python script:
//   M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
//   def philox(c, k):
//       for _ in range(10):
//           p0, p1 = M0 * c[0], M1 * c[2]
//           c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & 0xffffffff, (p0 >> 32) ^ c[3] ^ k[1], p0 & 0xffffffff]
//           k = [(k[0] + W0) & 0xffffffff, (k[1] + W1) & 0xffffffff]
//       return c
TEST_CASE("philox4x32_10 reproduces Random123's known-answer vectors", "[philox]") {
  check_kat({{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  check_kat({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, {{0xffffffffu, 0xffffffffu}},
            {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  // The pi-digit case: counter and key are the first hex digits of pi.
  check_kat({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, {{0xa4093822u, 0x299f31d0u}},
            {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

TEST_CASE("philox_block puts the block index in counter words 0-1 and the seed in the key", "[philox]") {
  const uint64_t seed = 0x299f31d0a4093822ull;
  const uint64_t block = 0x85a308d3243f6a88ull;
  const Uint32x4 direct = philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0, 0}}, {{0xa4093822u, 0x299f31d0u}});
  const Uint32x4 got = philox_block(seed, block);
  for (int i = 0; i < 4; ++i) CHECK(got.v[i] == direct.v[i]);
}

TEST_CASE("per-element draws take their documented words", "[philox]") {
  const uint64_t seed = 1234;
  const Uint32x4 w = philox_block(seed, 3);
  // uniform: element 7 = block 3, words 2 and 3, top 53 of their 64 bits.
  const uint64_t bits = ((uint64_t{w.v[2]} << 32) | w.v[3]) >> 11;
  CHECK(philox_uniform(seed, 7) == static_cast<double>(bits) / 9007199254740992.0);
  // bernoulli: element 13 = block 3, word 1, compared with p * 2^32.
  const double p = (static_cast<double>(w.v[1]) + 0.5) / 4294967296.0;
  CHECK(philox_bernoulli(seed, 13, p));
  CHECK_FALSE(philox_bernoulli(seed, 13, (static_cast<double>(w.v[1]) - 0.5) / 4294967296.0));
  // p = 0 never, p = 1 always, whatever the word.
  for (uint64_t i = 0; i < 64; ++i) {
    CHECK_FALSE(philox_bernoulli(seed, i, 0.0));
    CHECK(philox_bernoulli(seed, i, 1.0));
  }
  // normal: elements 2b and 2b+1 are the cos and sin halves of one Box-Muller pair.
  const double z0 = philox_normal(seed, 6), z1 = philox_normal(seed, 7);
  const double u1 = 1.0 - static_cast<double>(((uint64_t{w.v[0]} << 32) | w.v[1]) >> 11) / 9007199254740992.0;
  CHECK(z0 * z0 + z1 * z1 == Approx(-2.0 * std::log(u1)).epsilon(1e-12));
}

}  // namespace
}  // namespace dtr
