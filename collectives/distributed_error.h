// DistributedError: the one exception a failing collective, rendezvous or store raises.
//
// Its kind says what went wrong (a timeout, a lost or refused connection, a backend
// failure reported by Gloo or NCCL, a store failure); its message names the group, the
// collective, its sizes and dtype, and the peer where one is known, so that every
// surviving rank can say which rank it was waiting for (c10d's DistBackendError and
// DistStoreError, folded into one type with a kind).
#pragma once

#include <string>
#include <string_view>

#include "core/error.h"

namespace dtr {

enum class DistributedErrorKind { kTimeout, kConnection, kBackend, kStore };

constexpr std::string_view distributed_error_kind_name(DistributedErrorKind kind) {
  switch (kind) {
    case DistributedErrorKind::kTimeout: return "timeout";
    case DistributedErrorKind::kConnection: return "connection";
    case DistributedErrorKind::kBackend: return "backend";
    case DistributedErrorKind::kStore: return "store";
  }
  return "?";
}

class DistributedError : public Error {
 public:
  DistributedError(DistributedErrorKind kind, const std::string& message) : Error(message), kind_(kind) {}
  DistributedErrorKind kind() const { return kind_; }

 private:
  DistributedErrorKind kind_;
};

}  // namespace dtr
