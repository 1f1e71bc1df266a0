// find_free_port: bind port 0, read the port back.
#include "tools/launcher/free_port.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <memory>

#include "core/error.h"
#include "core/file_descriptor.h"

namespace dtr::launcher {

int find_free_port(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "0", &hints, &found); rc != 0) {
    throw ValueError(fmt::format("cannot resolve master address '{}': {}", host, ::gai_strerror(rc)));
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  const FileDescriptor socket(::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol));
  if (!socket.valid()) {
    const int error = errno;
    throw OSError(error, "socket()");
  }
  if (::bind(socket.get(), found->ai_addr, found->ai_addrlen) != 0) {
    const int error = errno;
    throw OSError(error, fmt::format("bind() to port 0 on '{}'", host));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (::getsockname(socket.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    const int error = errno;
    throw OSError(error, "getsockname()");
  }
  const in_port_t port = bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(bound).sin6_port
                                                     : reinterpret_cast<const sockaddr_in&>(bound).sin_port;
  return ntohs(port);
}

}  // namespace dtr::launcher
