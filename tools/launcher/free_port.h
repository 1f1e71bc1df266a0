// find_free_port: a TCP port that nothing listens on, for MASTER_PORT on a single node.
//
// It binds a socket to port 0 on the given address, reads back the port the kernel chose
// and closes the socket, as torchrun does for --standalone. The port is free when this
// returns, not reserved: another process could take it before rank 0 binds it, a window
// of microseconds that every launcher of this kind accepts.
#pragma once

#include <string>

namespace dtr::launcher {

// A free TCP port on `host` (a numeric address or a host name). Throws ValueError if
// `host` does not resolve, OSError if binding fails.
int find_free_port(const std::string& host);

}  // namespace dtr::launcher
