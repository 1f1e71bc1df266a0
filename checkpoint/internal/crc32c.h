// CRC32C: the Castagnoli CRC (polynomial 0x1EDC6F41, reflected 0x82F63B78) that iSCSI,
// ext4, gRPC and Snappy's framing use, here the checksum of checkpoint chunks.
//
// crc32c("123456789") = 0xE3069283 (RFC 3720's check value). Extending is associative
// over concatenation: crc32c_extend(crc32c(a), b) == crc32c(a + b). x86 CPUs with SSE4.2
// (the build's -march=native) compute it with the crc32 instruction, 8 bytes at a time;
// elsewhere a slice-by-8 table does, with the same results.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtr::checkpoint::internal {

// The CRC32C of data[0, size) continuing from `crc`, the CRC32C of the bytes before it (0
// for none).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32c(const void* data, size_t size) { return crc32c_extend(0, data, size); }

// The table-driven computation alone (what crc32c_extend uses without SSE4.2), for tests.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t size);

}  // namespace dtr::checkpoint::internal
