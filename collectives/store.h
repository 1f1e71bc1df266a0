// Store: the key-value service ranks rendezvous through (c10d's Store).
//
// Keys and values are byte strings. Every blocking call (get, wait) gives up after a
// timeout and throws DistributedError(kTimeout) naming the keys still missing; a store
// that cannot be reached throws DistributedError(kStore). Counters written by add() are
// decimal text, so get() on them reads "3". Gloo's rendezvous and NCCL's unique id both
// go through a Store; sub-groups see a PrefixStore over their parent's.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtr {

// Keys for a store's messages: ['a', 'b'].
std::string quoted_keys(const std::vector<std::string>& keys);

class Store {
 public:
  // PyTorch's default for collectives; the store uses the same unless told otherwise.
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(10)};

  explicit Store(std::chrono::milliseconds timeout = kDefaultTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;

  virtual void set(const std::string& key, std::string_view value) = 0;
  // Waits up to `timeout` for key to exist, then returns its value.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  std::string get(const std::string& key) { return get(key, timeout_); }
  // Adds delta to the integer at key (a missing key counts as 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to desired if it holds expected (a missing key holds ""); returns the value
  // the key holds afterwards ("" if it is still missing).
  virtual std::string compare_set(const std::string& key, std::string_view expected, std::string_view desired) = 0;
  // Waits up to `timeout` until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  // Removes key; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;
  // Number of keys in the whole store (not only under a prefix).
  virtual int64_t num_keys() = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::chrono::milliseconds timeout_;
};

}  // namespace dtr
