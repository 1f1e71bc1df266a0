#include "collectives/init.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <string>

#include "collectives/c10d_store.h"
#include "collectives/distributed_error.h"
#include "collectives/prefix_store.h"
#include "collectives/process_group_gloo.h"
#include "collectives/process_group_nccl.h"
#include "collectives/tcp_store.h"
#include "core/cuda/cuda_device.h"

namespace dtr {
namespace {

struct World {
  std::mutex mutex;
  std::shared_ptr<ProcessGroup> group;
  Backend backend = Backend::kGloo;
  int64_t generation = 0;  // inits so far in this process: the world's store prefix
  int64_t next_group = 0;  // new_group calls since the last init
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
};

World& world() {
  static World w;
  return w;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  DTR_CHECK(v != nullptr && *v != '\0', ValueError,
            "init_process_group: environment variable {} is not set (set RANK, WORLD_SIZE, MASTER_ADDR and "
            "MASTER_PORT, as torchrun does, or pass a store)",
            name);
  int value = 0;
  const std::string_view s(v);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  DTR_CHECK(ec == std::errc() && end == s.data() + s.size(), ValueError,
            "init_process_group: environment variable {}={:?} is not an integer", name, s);
  return value;
}

// This rank's CUDA device for an NCCL group: LOCAL_RANK where a launcher set it, else the
// world rank modulo the devices. Gloo groups never touch CUDA (forked test ranks rely on it).
int device_for(Backend backend, int world_rank) {
  if (backend != Backend::kNccl) return 0;
  if (const char* v = std::getenv("LOCAL_RANK"); v != nullptr && *v != '\0') return env_int("LOCAL_RANK");
  return world_rank % std::max(1, cuda::device_count());
}

void check_no_default_group(const World& w) {
  DTR_CHECK(w.group == nullptr, ValueError,
            "init_process_group: the default group already exists ({} ranks, {}); call destroy_process_group first",
            w.group ? w.group->size() : 0, w.group ? w.group->backend_name() : "");
}

// ValueError unless 0 <= rank < world_size.
void check_rank(int rank, int world_size) {
  DTR_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, ValueError,
            "init_process_group: rank {} is not in [0, {}) for a world of {} ranks", rank, world_size, world_size);
}

Backend backend_of(const ProcessGroup& group) {
  return group.backend_name() == backend_name(Backend::kNccl) ? Backend::kNccl : Backend::kGloo;
}

}  // namespace

std::shared_ptr<ProcessGroup> make_process_group(Backend backend, std::shared_ptr<Store> store, int rank, int size,
                                                 GroupOptions options) {
  switch (backend) {
    case Backend::kGloo: return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, std::move(options));
    case Backend::kNccl: return std::make_shared<ProcessGroupNCCL>(std::move(store), rank, size, std::move(options));
  }
  DTR_INTERNAL_ASSERT(false, "unknown backend {}", static_cast<int>(backend));
}

std::shared_ptr<ProcessGroup> init_process_group(Backend backend, std::shared_ptr<Store> store, int rank,
                                                 int world_size) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  check_no_default_group(w);
  check_rank(rank, world_size);
  GroupOptions options{
      .name = "default_pg", .global_ranks = {}, .timeout = w.timeout, .device_index = device_for(backend, rank)};
  auto prefixed = std::make_shared<PrefixStore>(fmt::format("default_pg.{}", w.generation++), std::move(store));
  w.group = make_process_group(backend, prefixed, rank, world_size, std::move(options));
  w.backend = backend;
  w.next_group = 0;
  return w.group;
}

std::shared_ptr<ProcessGroup> init_process_group(Backend backend) {
  {
    World& w = world();
    std::lock_guard<std::mutex> lock(w.mutex);
    check_no_default_group(w);  // before this rank starts serving a store
  }
  const int rank = env_int("RANK");
  const int world_size = env_int("WORLD_SIZE");
  check_rank(rank, world_size);  // before waiting on a store that no rank 0 may serve
  const int port = env_int("MASTER_PORT");
  DTR_CHECK(port > 0 && port < 65536, ValueError, "init_process_group: MASTER_PORT={} is not a TCP port", port);
  const char* addr_env = std::getenv("MASTER_ADDR");
  const std::string addr = addr_env != nullptr && *addr_env != '\0' ? addr_env : "127.0.0.1";
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool launcher_serves =
      agent != nullptr && (std::string_view(agent) == "True" || std::string_view(agent) == "1");
  if (launcher_serves && std::getenv("TORCHELASTIC_RUN_ID") != nullptr) {
    // torchrun's elastic agent serves c10d's TCPStore; its workers key under
    // /worker/attempt_<restart count>, as PyTorch's env:// rendezvous does.
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    auto agent_store = std::make_shared<C10dStore>(addr, static_cast<uint16_t>(port), default_timeout());
    return init_process_group(
        backend,
        std::make_shared<PrefixStore>(fmt::format("/worker/attempt_{}", attempt != nullptr ? attempt : "0"),
                                      std::move(agent_store)),
        rank, world_size);
  }
  auto store = std::make_shared<TCPStore>(
      addr, static_cast<uint16_t>(port),
      TCPStoreOptions{.is_server = rank == 0 && !launcher_serves, .timeout = default_timeout()});
  return init_process_group(backend, std::move(store), rank, world_size);
}

bool is_initialized() {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  return w.group != nullptr;
}

std::shared_ptr<ProcessGroup> default_group() {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  DTR_CHECK(w.group != nullptr, ValueError, "default_group: call init_process_group first");
  return w.group;
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> group;
  {
    World& w = world();
    std::lock_guard<std::mutex> lock(w.mutex);
    group = std::move(w.group);
  }
  group.reset();  // outside the lock: it waits for the group's issued collectives
}

std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks) {
  std::shared_ptr<ProcessGroup> parent;
  int64_t id;
  Backend backend;
  {
    World& w = world();
    std::lock_guard<std::mutex> lock(w.mutex);
    DTR_CHECK(w.group != nullptr, ValueError, "new_group: call init_process_group first");
    parent = w.group;
    id = w.next_group++;
    backend = w.backend;
  }
  std::sort(ranks.begin(), ranks.end());
  DTR_CHECK(!ranks.empty() && std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() && ranks.front() >= 0 &&
                ranks.back() < parent->size(),
            ValueError, "new_group: ranks {} must be distinct world ranks in [0, {}) and not empty", ranks,
            parent->size());
  auto it = std::find(ranks.begin(), ranks.end(), parent->rank());
  if (it == ranks.end()) return nullptr;
  const std::string name = fmt::format("group{}", id);
  GroupOptions options{.name = name,
                       .global_ranks = ranks,
                       .timeout = default_timeout(),
                       .device_index = device_for(backend, parent->rank())};
  return make_process_group(backend, std::make_shared<PrefixStore>(name, parent->store()),
                            static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()), std::move(options));
}

std::shared_ptr<ProcessGroup> split_group(ProcessGroup& parent, int colour) {
  Store& store = *parent.store();
  // Every rank counts its own splits of this parent; they agree because splits are collective.
  const int64_t id = store.add(fmt::format("splits_by/{}", parent.rank()), 1) - 1;
  auto key_of = [&](int r) { return fmt::format("split{}/colour_of/{}", id, r); };
  store.set(key_of(parent.rank()), std::to_string(colour));
  std::vector<int> members;  // parent ranks with this rank's colour
  for (int r = 0; r < parent.size(); ++r) {
    const std::string c = r == parent.rank() ? std::to_string(colour) : store.get(key_of(r), parent.timeout());
    if (c == std::to_string(colour)) members.push_back(r);
  }
  if (colour < 0) return nullptr;
  const int rank = static_cast<int>(std::find(members.begin(), members.end(), parent.rank()) - members.begin());
  std::vector<int> global;
  for (int r : members) global.push_back(parent.global_ranks()[r]);
  const std::string suffix = fmt::format("split{}/colour{}", id, colour);
  GroupOptions options{.name = fmt::format("{}/{}", parent.name(), suffix),
                       .global_ranks = global,
                       .timeout = parent.timeout(),
                       .device_index = device_for(backend_of(parent), parent.global_ranks()[parent.rank()])};
  return make_process_group(backend_of(parent), std::make_shared<PrefixStore>(suffix, parent.store()), rank,
                            static_cast<int>(members.size()), std::move(options));
}

void set_default_timeout(std::chrono::milliseconds timeout) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.timeout = timeout;
}

std::chrono::milliseconds default_timeout() {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  return w.timeout;
}

}  // namespace dtr
