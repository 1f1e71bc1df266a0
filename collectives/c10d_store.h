// C10dStore: a client of PyTorch c10d's TCPStore server, the store torchrun's elastic agent
// hosts on MASTER_PORT for its workers (TORCHELASTIC_USE_AGENT_STORE=True), so dtr ranks
// started by torchrun rendezvous there.
//
// The wire format is c10d's (torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp): a
// connection opens with VALIDATE and the magic number 0x3C85F7CE; each request is a query
// byte (SET 1, COMPARE_SET 2, GET 3, ADD 4, CHECK 5, WAIT 6, GETNUMKEYS 7, DELETE_KEY 8)
// then its fields, strings as a u64 length and the bytes, integers as i64, key lists as a
// u64 count and the keys, all little-endian. Every key goes under the prefix "/" that
// c10d's client adds (its keyPrefix_), so PyTorch clients of the same server see the same
// keys. SET has no reply; WAIT's is one byte (0: every key is there), sent once the server
// has every key, so a wait that runs out of time closes the connection (the server drops
// the waiter) and names the missing keys.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/distributed_error.h"
#include "collectives/store.h"
#include "core/file_descriptor.h"

namespace dtr {

class C10dStore : public Store {
 public:
  // Connects to c10d's server at host:port (retrying until `timeout` while it comes up).
  C10dStore(std::string host, uint16_t port, std::chrono::milliseconds timeout = kDefaultTimeout);

  void set(const std::string& key, std::string_view value) override;
  using Store::get;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, std::string_view expected, std::string_view desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

 private:
  // Sends `request` and reads `reply_bytes` bytes of reply (0: none) before `timeout`;
  // false when the time ran out (the connection is closed then).
  bool call(const std::string& request, void* reply, size_t reply_bytes, std::chrono::milliseconds timeout,
            const std::string& op);
  // A u64-length-prefixed string reply.
  std::string read_string(const std::string& op);
  // Connects (retrying until `deadline`) and sends VALIDATE.
  void connect(std::chrono::steady_clock::time_point deadline);
  DistributedError no_reply(const std::string& op) const;

  std::string host_;
  uint16_t port_;
  std::mutex mutex_;
  FileDescriptor fd_;
};

}  // namespace dtr
