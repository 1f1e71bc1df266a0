// Blocking TCP helpers for the store and the test harness: listen, connect with retry,
// and exact sends and receives bounded by a deadline.
//
// Every failure throws DistributedError (kConnection, or kTimeout for a deadline) whose
// message names the address and the system's error string. Descriptors are close-on-exec
// and owned by a FileDescriptor, so no error path leaks one. SIGPIPE is never raised
// (MSG_NOSIGNAL).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/file_descriptor.h"

namespace dtr::net {

using Clock = std::chrono::steady_clock;

// A listening socket bound to host:port (port 0 picks a free one), non-blocking.
FileDescriptor listen_tcp(const std::string& host, uint16_t port);
// The port a bound socket listens on.
uint16_t local_port(int fd);
// "address:port" of the other end of a connected socket.
std::string peer_name(int fd);

// Connects to host:port with TCP_NODELAY, retrying while the server is not yet up
// (refused or unreachable) until the deadline.
FileDescriptor connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline);

// Sends all n bytes (blocking).
void send_all(int fd, const void* data, size_t n, const std::string& what);
// Receives exactly n bytes; returns false if the deadline passes first. Throws if the
// peer closes the connection or on any other error.
bool recv_exact(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what);

}  // namespace dtr::net
