// Copies of raw bytes to, from and within a CUDA device, queued on a stream.
//
// With host memory on either side the host waits for the copy (the stream's earlier work
// first), so the host buffer may be read or reused as soon as the call returns, unless
// HostWait::kNo (page-locked host memory only: the caller keeps the buffer alive and
// untouched until the stream has run the copy); a copy from device to device is only
// queued, ordered after the stream's earlier work.
#pragma once

#include <cstddef>

#include "core/cuda/stream.h"

namespace dtr::cuda {

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
enum class HostWait : bool { kNo, kYes };

void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, const Stream& stream,
                HostWait host_wait = HostWait::kYes);

}  // namespace dtr::cuda
