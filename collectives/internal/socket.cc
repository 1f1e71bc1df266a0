#include "collectives/internal/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "collectives/distributed_error.h"

namespace dtr::net {
namespace {

[[noreturn]] void throw_errno(DistributedErrorKind kind, const std::string& what, int err) {
  throw DistributedError(kind, fmt::format("{}: {}", what, std::strerror(err)));
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfo resolve(const std::string& host, uint16_t port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    throw DistributedError(DistributedErrorKind::kConnection,
                           fmt::format("cannot resolve {}:{}: {}", host, port, gai_strerror(rc)));
  }
  return AddrInfo(result);
}

std::string address_string(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  return fmt::format("{}:{}", buf, port);
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

}  // namespace

FileDescriptor listen_tcp(const std::string& host, uint16_t port) {
  AddrInfo info = resolve(host, port, AI_PASSIVE);
  int last_errno = 0;
  for (addrinfo* a = info.get(); a != nullptr; a = a->ai_next) {
    FileDescriptor fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd.valid()) {
      last_errno = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
      last_errno = errno;
      continue;
    }
    return fd;
  }
  throw_errno(DistributedErrorKind::kConnection, fmt::format("cannot listen on {}:{}", host, port), last_errno);
}

uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    throw_errno(DistributedErrorKind::kConnection, "getsockname", errno);
  }
  return ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return address_string(ss);
}

FileDescriptor connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline) {
  int last_errno = 0;
  while (true) {
    AddrInfo info = resolve(host, port, 0);
    for (addrinfo* a = info.get(); a != nullptr; a = a->ai_next) {
      FileDescriptor fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd.valid()) {
        last_errno = errno;
        continue;
      }
      if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) {
        const int one = 1;
        setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
      last_errno = errno;
    }
    const bool retry = last_errno == ECONNREFUSED || last_errno == ENETUNREACH || last_errno == EHOSTUNREACH ||
                       last_errno == ETIMEDOUT || last_errno == ECONNRESET;
    if (!retry)
      throw_errno(DistributedErrorKind::kConnection, fmt::format("cannot connect to {}:{}", host, port), last_errno);
    if (Clock::now() >= deadline) {
      throw DistributedError(DistributedErrorKind::kTimeout,
                             fmt::format("cannot connect to {}:{} before the timeout: {} (is the server up?)", host,
                                         port, std::strerror(last_errno)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void send_all(int fd, const void* data, size_t n, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      throw_errno(DistributedErrorKind::kConnection, what, errno);
    }
    p += sent;
    n -= static_cast<size_t>(sent);
  }
}

bool recv_exact(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, remaining_ms(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw_errno(DistributedErrorKind::kConnection, what, errno);
    }
    if (ready == 0) return false;
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw_errno(DistributedErrorKind::kConnection, what, errno);
    }
    if (got == 0)
      throw DistributedError(DistributedErrorKind::kConnection, fmt::format("{}: connection closed by peer", what));
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

}  // namespace dtr::net
