// Blocking TCP helpers for the store and the test harness: an owning descriptor,
// listen, connect with retry, and exact sends and receives bounded by a deadline.
//
// Every failure throws DistributedError (kConnection, or kTimeout for a deadline) whose
// message names the address and the system's error string. Descriptors are close-on-exec
// and owned by UniqueFd, so no error path leaks one. SIGPIPE is never raised (MSG_NOSIGNAL).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dtr::net {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// A listening socket bound to host:port (port 0 picks a free one), non-blocking.
UniqueFd listen_tcp(const std::string& host, uint16_t port);
// The port a bound socket listens on.
uint16_t local_port(int fd);
// "address:port" of the other end of a connected socket.
std::string peer_name(int fd);

// Connects to host:port with TCP_NODELAY, retrying while the server is not yet up
// (refused or unreachable) until the deadline.
UniqueFd connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline);

// Sends all n bytes (blocking).
void send_all(int fd, const void* data, size_t n, const std::string& what);
// Receives exactly n bytes; returns false if the deadline passes first. Throws if the
// peer closes the connection or on any other error.
bool recv_exact(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what);

}  // namespace dtr::net
