// TCPStore: the rendezvous store served over TCP (c10d's TCPStore), and its server.
//
// One TCPStoreServer (rank 0's, or the launcher's) binds to the address it is given,
// loopback by default, and serves any number of TCPStore clients from one poll() thread.
// The wire format is length-prefixed frames of at most kMaxMessageBytes: a u32 length,
// then a command byte and its fields (u32-length-prefixed strings, little-endian i64s).
// A malformed or oversized frame closes that one connection with a line on stderr; the
// server keeps serving everyone else. get() and wait() block on the server side, which
// answers with the keys still missing when the caller's timeout passes.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "collectives/internal/socket.h"
#include "collectives/store.h"
#include "core/file_descriptor.h"

namespace dtr {

// The serving side: a thread that owns every connection. Stops (and closes them) on destruction.
class TCPStoreServer {
 public:
  // Binds host:port (port 0: any free port, see port()). Throws DistributedError if it cannot.
  TCPStoreServer(const std::string& host, uint16_t port);
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  uint16_t port() const { return port_; }
  // Connections closed so far because their messages were malformed or oversized.
  int64_t rejected_connections() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  uint16_t port_ = 0;
  std::thread thread_;
};

struct TCPStoreOptions {
  // Also serve the store from this process (PyTorch's is_master).
  bool is_server = false;
  // For connecting, and the default for get() and wait().
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
};

// A client; safe to share between threads (one request at a time on its connection).
class TCPStore : public Store {
 public:
  static constexpr uint32_t kMaxMessageBytes = 64u << 20;

  // Connects to host:port, retrying until options.timeout while the server comes up.
  // With is_server, starts the server first (port 0 then picks a free port).
  TCPStore(const std::string& host, uint16_t port, TCPStoreOptions options = {});
  ~TCPStore() override;

  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  using Store::get;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, std::string_view expected, std::string_view desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }

 private:
  class Request;
  // Sends one request and returns the reply's payload (after its status byte).
  std::string call(const Request& request, std::string_view op, std::chrono::milliseconds reply_timeout);

  std::string host_;
  uint16_t port_;
  std::unique_ptr<TCPStoreServer> server_;
  std::mutex mutex_;
  FileDescriptor fd_;
};

}  // namespace dtr
