#include "collectives/tcp_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

#include "collectives/distributed_error.h"

namespace dtr {
namespace {

using net::Clock;

enum class Command : uint8_t { kSet = 1, kGet, kAdd, kCompareSet, kWait, kDelete, kNumKeys };
enum class Status : uint8_t { kOk = 0, kTimeout, kInvalid };

// The server answers a blocked get/wait when its timeout passes; the client allows this
// much more before it decides the server itself is gone.
constexpr std::chrono::milliseconds kReplyGrace{5000};

// Appends little-endian fields to a frame's payload.
class Writer {
 public:
  Writer& u8(uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& i64(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  // The frame: u32 payload length, then the payload.
  std::string frame() const {
    Writer w;
    w.u32(static_cast<uint32_t>(out_.size()));
    return w.out_ + out_;
  }
  size_t size() const { return out_.size(); }

 private:
  std::string out_;
};

struct Malformed {
  std::string reason;
};

// Reads fields from a payload; any read past its end is Malformed.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint32_t u32() {
    std::string_view b = take(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(b[i])) << (8 * i);
    return v;
  }
  int64_t i64() {
    std::string_view b = take(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
    return static_cast<int64_t>(v);
  }
  std::string str() { return std::string(take(u32())); }
  void expect_end() const {
    if (!in_.empty()) throw Malformed{fmt::format("{} unexpected trailing bytes", in_.size())};
  }

 private:
  std::string_view take(size_t n) {
    if (n > in_.size()) throw Malformed{fmt::format("field of {} bytes runs past the end of the message", n)};
    std::string_view b = in_.substr(0, n);
    in_.remove_prefix(n);
    return b;
  }
  std::string_view in_;
};

uint32_t read_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Server

struct TCPStoreServer::State {
  struct Connection {
    FileDescriptor fd;
    std::string peer;
    std::string in;        // bytes received, not yet parsed
    std::string out;       // bytes to send
    bool waiting = false;  // a get/wait is blocked; later frames stay queued
    bool closed = false;
  };
  struct Waiter {
    int fd;
    Command command;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  FileDescriptor listen_fd;
  FileDescriptor wake_read, wake_write;
  std::map<int, Connection> connections;
  std::unordered_map<std::string, std::string> data;
  std::vector<Waiter> waiters;
  std::atomic<int64_t> rejected{0};

  void run();
  void accept_all();
  void receive(Connection& c);
  void flush(Connection& c);
  void process_frames(Connection& c);
  void handle(Connection& c, std::string_view payload);
  void reply(Connection& c, const Writer& w);
  void reject(Connection& c, const std::string& reason);
  void close(Connection& c);
  bool has_all(const std::vector<std::string>& keys) const;
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  void answer(Connection& c, const Waiter& w);
  void notify_waiters();
  void expire_waiters();
};

void TCPStoreServer::State::run() {
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake_read.get(), POLLIN, 0});
    fds.push_back({listen_fd.get(), POLLIN, 0});
    bool ready_frames = false;
    for (auto& [fd, c] : connections) {
      fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      ready_frames = ready_frames || (!c.waiting && c.in.size() >= 4);
    }
    int timeout_ms = -1;
    for (const Waiter& w : waiters) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - Clock::now()).count() + 1;
      timeout_ms = static_cast<int>(
          std::clamp<int64_t>(timeout_ms < 0 ? left : std::min<int64_t>(timeout_ms, left), 0, 1 << 30));
    }
    if (ready_frames) timeout_ms = 0;
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      fmt::print(stderr, "dtr TCPStore server: poll failed: {}; stopping\n", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;  // destructor
    if (fds[1].revents & POLLIN) accept_all();
    for (size_t i = 2; i < fds.size(); ++i) {
      auto it = connections.find(fds[i].fd);
      if (it == connections.end()) continue;
      Connection& c = it->second;
      if (fds[i].revents & POLLOUT) flush(c);
      if (!c.closed && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) receive(c);
    }
    for (auto& [fd, c] : connections) {
      if (!c.closed) process_frames(c);
    }
    expire_waiters();
    std::erase_if(waiters, [&](const Waiter& w) { return connections.at(w.fd).closed; });
    std::erase_if(connections, [](const auto& kv) { return kv.second.closed; });
  }
}

void TCPStoreServer::State::accept_all() {
  while (true) {
    const int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left (other errors: the client is gone already)
    Connection c;
    c.fd = FileDescriptor(fd);
    c.peer = net::peer_name(fd);
    connections.emplace(fd, std::move(c));
  }
}

void TCPStoreServer::State::receive(Connection& c) {
  char buf[1 << 16];
  // Bounded per round, so that one client streaming data cannot starve the others.
  for (int round = 0; round < 64; ++round) {
    const ssize_t got = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (got > 0) {
      c.in.append(buf, static_cast<size_t>(got));
      if (c.in.size() >= 4 && read_u32(c.in.data()) > TCPStore::kMaxMessageBytes) {
        return reject(c, fmt::format("message of {} bytes exceeds the limit of {} bytes", read_u32(c.in.data()),
                                     TCPStore::kMaxMessageBytes));
      }
      if (c.in.size() > 4 + size_t{TCPStore::kMaxMessageBytes} + (1 << 16)) {
        return reject(c, "too much data sent while a get/wait was blocked");
      }
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
    return close(c);  // orderly shutdown or a reset: the client has gone
  }
}

void TCPStoreServer::State::flush(Connection& c) {
  while (!c.out.empty()) {
    const ssize_t sent = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      return close(c);
    }
    c.out.erase(0, static_cast<size_t>(sent));
  }
}

void TCPStoreServer::State::process_frames(Connection& c) {
  size_t pos = 0;
  while (!c.closed && !c.waiting && c.in.size() - pos >= 4) {
    const uint32_t len = read_u32(c.in.data() + pos);
    if (len > TCPStore::kMaxMessageBytes) {
      return reject(c,
                    fmt::format("message of {} bytes exceeds the limit of {} bytes", len, TCPStore::kMaxMessageBytes));
    }
    if (c.in.size() - pos - 4 < len) break;
    try {
      handle(c, std::string_view(c.in).substr(pos + 4, len));
    } catch (const Malformed& m) {
      return reject(c, "malformed message: " + m.reason);
    }
    pos += 4 + len;
  }
  if (!c.closed) c.in.erase(0, pos);
}

void TCPStoreServer::State::handle(Connection& c, std::string_view payload) {
  Reader r(payload);
  const uint8_t command = r.u8();
  Writer w;
  switch (static_cast<Command>(command)) {
    case Command::kSet: {
      std::string key = r.str();
      std::string value = r.str();
      r.expect_end();
      data[std::move(key)] = std::move(value);
      reply(c, w.u8(static_cast<uint8_t>(Status::kOk)));
      return notify_waiters();
    }
    case Command::kGet:
    case Command::kWait: {
      const int64_t timeout_ms = r.i64();
      std::vector<std::string> keys;
      if (static_cast<Command>(command) == Command::kGet) {
        keys.push_back(r.str());
      } else {
        const uint32_t n = r.u32();
        for (uint32_t i = 0; i < n; ++i) keys.push_back(r.str());
      }
      r.expect_end();
      Waiter waiter{c.fd.get(), static_cast<Command>(command), std::move(keys),
                    Clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0))};
      if (has_all(waiter.keys) || timeout_ms <= 0) return answer(c, waiter);
      c.waiting = true;
      waiters.push_back(std::move(waiter));
      return;
    }
    case Command::kAdd: {
      const std::string key = r.str();
      const int64_t delta = r.i64();
      r.expect_end();
      int64_t value = 0;
      auto it = data.find(key);
      if (it != data.end()) {
        const std::string& s = it->second;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
        if (ec != std::errc() || end != s.data() + s.size()) {
          return reply(c, w.u8(static_cast<uint8_t>(Status::kInvalid))
                              .str(fmt::format("add: key '{}' holds {:?}, which is not a decimal integer "
                                               "(add works only on keys that are missing or written by add)",
                                               key, s)));
        }
      }
      value += delta;
      data[key] = std::to_string(value);
      reply(c, w.u8(static_cast<uint8_t>(Status::kOk)).i64(value));
      return notify_waiters();
    }
    case Command::kCompareSet: {
      const std::string key = r.str();
      const std::string expected = r.str();
      std::string desired = r.str();
      r.expect_end();
      auto it = data.find(key);
      const bool matches = it == data.end() ? expected.empty() : it->second == expected;
      if (matches) {
        it = data.insert_or_assign(key, std::move(desired)).first;
      }
      reply(c, w.u8(static_cast<uint8_t>(Status::kOk)).str(it == data.end() ? "" : it->second));
      if (matches) notify_waiters();
      return;
    }
    case Command::kDelete: {
      const std::string key = r.str();
      r.expect_end();
      const bool existed = data.erase(key) > 0;
      return reply(c, w.u8(static_cast<uint8_t>(Status::kOk)).u8(existed ? 1 : 0));
    }
    case Command::kNumKeys: {
      r.expect_end();
      return reply(c, w.u8(static_cast<uint8_t>(Status::kOk)).i64(static_cast<int64_t>(data.size())));
    }
  }
  throw Malformed{fmt::format("unknown command {}", command)};
}

void TCPStoreServer::State::reply(Connection& c, const Writer& w) {
  c.out += w.frame();
  flush(c);
}

void TCPStoreServer::State::reject(Connection& c, const std::string& reason) {
  fmt::print(stderr, "dtr TCPStore server: closing the connection from {}: {}\n", c.peer, reason);
  rejected.fetch_add(1);
  close(c);
}

void TCPStoreServer::State::close(Connection& c) {
  c.closed = true;
  c.fd.reset();
}

bool TCPStoreServer::State::has_all(const std::vector<std::string>& keys) const {
  for (const std::string& k : keys) {
    if (!data.contains(k)) return false;
  }
  return true;
}

std::vector<std::string> TCPStoreServer::State::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    if (!data.contains(k)) out.push_back(k);
  }
  return out;
}

void TCPStoreServer::State::answer(Connection& c, const Waiter& waiter) {
  Writer w;
  std::vector<std::string> absent = missing(waiter.keys);
  if (!absent.empty()) {
    w.u8(static_cast<uint8_t>(Status::kTimeout)).u32(static_cast<uint32_t>(absent.size()));
    for (const std::string& k : absent) w.str(k);
  } else if (waiter.command == Command::kGet) {
    w.u8(static_cast<uint8_t>(Status::kOk)).str(data.at(waiter.keys[0]));
  } else {
    w.u8(static_cast<uint8_t>(Status::kOk));
  }
  c.waiting = false;
  reply(c, w);
}

void TCPStoreServer::State::notify_waiters() {
  std::erase_if(waiters, [&](const Waiter& w) {
    Connection& c = connections.at(w.fd);
    if (c.closed || !has_all(w.keys)) return c.closed;
    answer(c, w);
    return true;
  });
}

void TCPStoreServer::State::expire_waiters() {
  const auto now = Clock::now();
  std::erase_if(waiters, [&](const Waiter& w) {
    Connection& c = connections.at(w.fd);
    if (c.closed || w.deadline > now) return c.closed;
    answer(c, w);
    return true;
  });
}

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port) : state_(std::make_unique<State>()) {
  state_->listen_fd = net::listen_tcp(host, port);
  port_ = net::local_port(state_->listen_fd.get());
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    throw DistributedError(DistributedErrorKind::kStore,
                           fmt::format("TCPStore server: pipe2 failed: {}", std::strerror(errno)));
  }
  state_->wake_read = FileDescriptor(pipe_fds[0]);
  state_->wake_write = FileDescriptor(pipe_fds[1]);
  thread_ = std::thread([s = state_.get()] { s->run(); });
}

TCPStoreServer::~TCPStoreServer() {
  const char stop = 's';
  [[maybe_unused]] ssize_t n = ::write(state_->wake_write.get(), &stop, 1);
  thread_.join();
}

int64_t TCPStoreServer::rejected_connections() const { return state_->rejected.load(); }

// ---------------------------------------------------------------------------------------
// Client

class TCPStore::Request {
 public:
  explicit Request(Command command) { w_.u8(static_cast<uint8_t>(command)); }
  Writer& fields() { return w_; }
  const Writer& writer() const { return w_; }

 private:
  Writer w_;
};

TCPStore::TCPStore(const std::string& host, uint16_t port, TCPStoreOptions options)
    : Store(options.timeout), host_(host), port_(port) {
  if (options.is_server) {
    server_ = std::make_unique<TCPStoreServer>(host, port);
    port_ = server_->port();
  }
  fd_ = net::connect_tcp(host_, port_, Clock::now() + options.timeout);
}

TCPStore::~TCPStore() = default;

std::string TCPStore::call(const Request& request, std::string_view op, std::chrono::milliseconds reply_timeout) {
  DTR_CHECK(request.writer().size() <= kMaxMessageBytes, ValueError,
            "TCPStore {}: the request is {} bytes, over the store's limit of {} bytes; store large data elsewhere", op,
            request.writer().size(), kMaxMessageBytes);
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string what = fmt::format("TCPStore {}:{} {}", host_, port_, op);
  std::string payload;
  try {
    // Reconnecting after a lost connection tries once: retrying is for a server coming up.
    if (!fd_.valid()) fd_ = net::connect_tcp(host_, port_, Clock::now());
    const std::string frame = request.writer().frame();
    net::send_all(fd_.get(), frame.data(), frame.size(), what);
    const auto deadline = Clock::now() + reply_timeout;
    char header[4];
    bool ok = net::recv_exact(fd_.get(), header, 4, deadline, what);
    const uint32_t len = ok ? read_u32(header) : 0;
    DTR_INTERNAL_ASSERT(len <= kMaxMessageBytes, "{}: reply of {} bytes", what, len);
    payload.resize(len);
    ok = ok && net::recv_exact(fd_.get(), payload.data(), len, deadline, what);
    if (!ok) {
      fd_.reset();  // a late reply would desynchronise the stream: reconnect next time
      throw DistributedError(
          DistributedErrorKind::kStore,
          fmt::format("{}: no reply within {} ms; is the store's server still running?", what, reply_timeout.count()));
    }
  } catch (const DistributedError& e) {
    fd_.reset();
    throw DistributedError(DistributedErrorKind::kStore, e.what());
  }
  DTR_INTERNAL_ASSERT(!payload.empty(), "{}: empty reply", what);
  Reader r(std::string_view(payload).substr(1));
  switch (static_cast<Status>(payload[0])) {
    case Status::kOk: return payload.substr(1);
    case Status::kTimeout: {
      std::vector<std::string> absent(r.u32());
      for (std::string& k : absent) k = r.str();
      throw DistributedError(DistributedErrorKind::kTimeout,
                             fmt::format("{} timed out after {} ms; keys still missing: {}", what,
                                         (reply_timeout - kReplyGrace).count(), quoted_keys(absent)));
    }
    case Status::kInvalid: throw ValueError(fmt::format("{}: {}", what, r.str()));
  }
  DTR_INTERNAL_ASSERT(false, "{}: unknown reply status {}", what, static_cast<int>(payload[0]));
}

void TCPStore::set(const std::string& key, std::string_view value) {
  Request q(Command::kSet);
  q.fields().str(key).str(value);
  call(q, fmt::format("set('{}')", key), timeout());
}

std::string TCPStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  Request q(Command::kGet);
  q.fields().i64(timeout.count()).str(key);
  std::string reply = call(q, fmt::format("get('{}')", key), timeout + kReplyGrace);
  return Reader(reply).str();
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  Request q(Command::kAdd);
  q.fields().str(key).i64(delta);
  std::string reply = call(q, fmt::format("add('{}', {})", key, delta), timeout());
  return Reader(reply).i64();
}

std::string TCPStore::compare_set(const std::string& key, std::string_view expected, std::string_view desired) {
  Request q(Command::kCompareSet);
  q.fields().str(key).str(expected).str(desired);
  std::string reply = call(q, fmt::format("compare_set('{}')", key), timeout());
  return Reader(reply).str();
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  Request q(Command::kWait);
  q.fields().i64(timeout.count()).u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) q.fields().str(k);
  call(q, fmt::format("wait({})", quoted_keys(keys)), timeout + kReplyGrace);
}

bool TCPStore::delete_key(const std::string& key) {
  Request q(Command::kDelete);
  q.fields().str(key);
  std::string reply = call(q, fmt::format("delete_key('{}')", key), timeout());
  return Reader(reply).u8() != 0;
}

int64_t TCPStore::num_keys() {
  std::string reply = call(Request(Command::kNumKeys), "num_keys()", timeout());
  return Reader(reply).i64();
}

}  // namespace dtr
