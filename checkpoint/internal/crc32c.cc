#include "checkpoint/internal/crc32c.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace dtr::checkpoint::internal {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected 0x1EDC6F41

// tables[0] is the byte-at-a-time table; tables[k][b] is the CRC of byte b followed by k
// zero bytes, so eight table lookups advance the CRC over eight bytes (slice-by-8).
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) != 0 ? kPolynomial : 0u);
    tables[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) tables[k][b] = (tables[k - 1][b] >> 8) ^ tables[0][tables[k - 1][b] & 0xffu];
  }
  return tables;
}

constexpr std::array<std::array<uint32_t, 256>, 8> kTables = make_tables();

}  // namespace

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian: p[0] is the low byte
    word ^= c;
    c = kTables[7][word & 0xff] ^ kTables[6][(word >> 8) & 0xff] ^ kTables[5][(word >> 16) & 0xff] ^
        kTables[4][(word >> 24) & 0xff] ^ kTables[3][(word >> 32) & 0xff] ^ kTables[2][(word >> 40) & 0xff] ^
        kTables[1][(word >> 48) & 0xff] ^ kTables[0][word >> 56];
  }
  for (; size > 0; --size, ++p) c = (c >> 8) ^ kTables[0][(c ^ *p) & 0xffu];
  return ~c;
}

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size) {
#if defined(__SSE4_2__)
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; size > 0; --size, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
#else
  return crc32c_extend_portable(crc, data, size);
#endif
}

}  // namespace dtr::checkpoint::internal
