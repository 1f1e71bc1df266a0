// philox_batch (the CPU kernels' vectorised Philox) gives, block for block, the words of
// philox_block: at block 0, across the carry from counter word 0 into word 1, near the top
// of the 64-bit block range, and for seeds whose two key words differ.
#include "kernels/cpu/internal/philox_batch.h"

#include <catch2/catch.hpp>

namespace dtr::cpu {
namespace {

TEST_CASE("philox_batch equals philox_block for every block of the batch", "[philox]") {
  const uint64_t seeds[] = {0, 1, 0x299f31d0a4093822ull, ~uint64_t{0}};
  const uint64_t firsts[] = {0, 7, (uint64_t{1} << 32) - 5, ~uint64_t{0} - kPhiloxBatch + 1};
  for (uint64_t seed : seeds) {
    for (uint64_t first : firsts) {
      PhiloxWords words;
      philox_batch(seed, first, words);
      for (int j = 0; j < kPhiloxBatch; ++j) {
        const Uint32x4 expected = philox_block(seed, first + j);
        for (int k = 0; k < 4; ++k) {
          INFO("seed " << seed << ", block " << first + j << ", word " << k);
          CHECK(words.w[k][j] == expected.v[k]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace dtr::cpu
