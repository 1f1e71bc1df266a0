#include "collectives/c10d_store.h"

#include <fmt/format.h>

#include <cstring>

#include "collectives/distributed_error.h"
#include "collectives/internal/socket.h"
#include "core/error.h"

namespace dtr {
namespace {

using Clock = std::chrono::steady_clock;

enum class Query : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
};
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr uint8_t kReady = 0;  // CHECK's READY, WAIT's STOP_WAITING

// A request in c10d's encoding.
class Request {
 public:
  explicit Request(Query q) { bytes_.push_back(static_cast<char>(q)); }
  template <typename T>
  Request& raw(T value) {
    char b[sizeof(T)];
    std::memcpy(b, &value, sizeof(T));
    bytes_.append(b, sizeof(T));
    return *this;
  }
  Request& str(std::string_view s) {
    raw<uint64_t>(s.size());
    bytes_.append(s);
    return *this;
  }
  // A key as c10d's TCPStore client sends it: under its key prefix "/".
  Request& key(std::string_view k) {
    raw<uint64_t>(k.size() + 1);
    bytes_.push_back('/');
    bytes_.append(k);
    return *this;
  }
  Request& keys(const std::vector<std::string>& keys) {
    raw<uint64_t>(keys.size());
    for (const std::string& k : keys) key(k);
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

}  // namespace

C10dStore::C10dStore(std::string host, uint16_t port, std::chrono::milliseconds timeout)
    : Store(timeout), host_(std::move(host)), port_(port) {
  connect(Clock::now() + timeout);
}

void C10dStore::connect(Clock::time_point deadline) {
  fd_ = net::connect_tcp(host_, port_, deadline);
  const std::string validate = Request(Query::kValidate).raw(kValidationMagic).bytes();
  net::send_all(fd_.get(), validate.data(), validate.size(), fmt::format("c10d TCPStore {}:{}", host_, port_));
}

DistributedError C10dStore::no_reply(const std::string& op) const {
  return DistributedError(DistributedErrorKind::kStore,
                          fmt::format("c10d TCPStore {}:{} {}: no reply within {} ms; is torchrun's agent still "
                                      "running?",
                                      host_, port_, op, timeout().count()));
}

bool C10dStore::call(const std::string& request, void* reply, size_t reply_bytes, std::chrono::milliseconds timeout,
                     const std::string& op) {
  const std::string what = fmt::format("c10d TCPStore {}:{} {}", host_, port_, op);
  try {
    if (!fd_.valid()) connect(Clock::now());  // once: retrying is for a server coming up
    net::send_all(fd_.get(), request.data(), request.size(), what);
    if (reply_bytes == 0) return true;
    if (net::recv_exact(fd_.get(), reply, reply_bytes, Clock::now() + timeout, what)) return true;
  } catch (const DistributedError& e) {
    fd_.reset();
    throw DistributedError(DistributedErrorKind::kStore, e.what());
  }
  fd_.reset();  // a late reply would desynchronise the stream; the server drops a closed waiter
  return false;
}

std::string C10dStore::read_string(const std::string& op) {
  const std::string what = fmt::format("c10d TCPStore {}:{} {}", host_, port_, op);
  const auto deadline = Clock::now() + timeout();
  uint64_t length = 0;
  std::string value;
  bool ok = net::recv_exact(fd_.get(), &length, sizeof(length), deadline, what);
  if (ok) {
    value.resize(length);
    ok = net::recv_exact(fd_.get(), value.data(), length, deadline, what);
  }
  if (!ok) {
    fd_.reset();
    throw no_reply(op);
  }
  return value;
}

void C10dStore::set(const std::string& key, std::string_view value) {
  std::lock_guard<std::mutex> lock(mutex_);
  call(Request(Query::kSet).key(key).str(value).bytes(), nullptr, 0, timeout(), fmt::format("set('{}')", key));
}

std::string C10dStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string op = fmt::format("get('{}')", key);
  call(Request(Query::kGet).key(key).bytes(), nullptr, 0, timeout, op);
  return read_string(op);
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string op = fmt::format("add('{}', {})", key, delta);
  int64_t value = 0;
  if (!call(Request(Query::kAdd).key(key).raw(delta).bytes(), &value, sizeof(value), timeout(), op)) throw no_reply(op);
  return value;
}

std::string C10dStore::compare_set(const std::string& key, std::string_view expected, std::string_view desired) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string op = fmt::format("compare_set('{}')", key);
  call(Request(Query::kCompareSet).key(key).str(expected).str(desired).bytes(), nullptr, 0, timeout(), op);
  return read_string(op);
}

void C10dStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string op = fmt::format("wait({})", quoted_keys(keys));
  uint8_t answer = 1;
  if (call(Request(Query::kWait).keys(keys).bytes(), &answer, 1, timeout, op)) {
    DTR_INTERNAL_ASSERT(answer == kReady, "c10d TCPStore {}:{} {}: WAIT answered {}", host_, port_, op, answer);
    return;
  }
  // The keys still missing, asked one by one on a new connection.
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    uint8_t ready = 1;
    if (call(Request(Query::kCheck).keys({key}).bytes(), &ready, 1, this->timeout(), op) && ready != kReady) {
      missing.push_back(key);
    }
  }
  throw DistributedError(DistributedErrorKind::kTimeout,
                         fmt::format("c10d TCPStore {}:{} {} timed out after {} ms; keys still missing: {}", host_,
                                     port_, op, timeout.count(), quoted_keys(missing)));
}

bool C10dStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string op = fmt::format("delete_key('{}')", key);
  int64_t deleted = 0;
  if (!call(Request(Query::kDeleteKey).key(key).bytes(), &deleted, sizeof(deleted), timeout(), op)) throw no_reply(op);
  return deleted > 0;
}

int64_t C10dStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  if (!call(Request(Query::kGetNumKeys).bytes(), &n, sizeof(n), timeout(), "num_keys()")) throw no_reply("num_keys()");
  return n;
}

}  // namespace dtr
