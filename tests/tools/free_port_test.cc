// find_free_port: a port nothing listens on, and typed errors for an address that does not
// resolve (ValueError: the user's --master-addr) or a socket call that fails (OSError).
#include "tools/launcher/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/file_descriptor.h"

namespace {

// Whether a TCP socket can listen on 127.0.0.1:port (plain POSIX: what any server would do).
bool can_listen(uint16_t port) {
  const dtr::FileDescriptor fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return fd.valid() && ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 &&
         ::listen(fd.get(), 1) == 0;
}

TEST_CASE("find_free_port: the port it returns can be listened on") {
  const int port = dtr::launcher::find_free_port("127.0.0.1");
  CHECK(port > 0);
  CHECK(port <= 65535);
  CHECK(can_listen(static_cast<uint16_t>(port)));
}

TEST_CASE("find_free_port: an address that does not resolve is a ValueError naming it") {
  CHECK_THROWS_AS(dtr::launcher::find_free_port("no-such-host.invalid"), dtr::ValueError);
  CHECK_THROWS_WITH(dtr::launcher::find_free_port("no-such-host.invalid"),
                    Catch::Contains("cannot resolve master address 'no-such-host.invalid'"));
}

TEST_CASE("find_free_port: an address of another machine cannot be bound: OSError naming the call") {
  // 192.0.2.1 (TEST-NET-1, RFC 5737) is never an address of this machine.
  CHECK_THROWS_AS(dtr::launcher::find_free_port("192.0.2.1"), dtr::OSError);
  CHECK_THROWS_WITH(dtr::launcher::find_free_port("192.0.2.1"),
                    Catch::Contains("bind() to port 0 on '192.0.2.1'") && Catch::Contains("address"));
}

}  // namespace
