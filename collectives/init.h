// init: the default process group and its sub-groups (torch.distributed's
// init_process_group, new_group and split_group).
//
// Every function here is collective over the group it starts from: every rank calls it,
// in the same order (a rank that does not come makes the others fail with a
// DistributedError naming it). Each group gets its own prefix of the store (the world's is
// renewed by every init), so groups never see each other's keys. Every new group takes the
// default timeout (10 minutes, as in PyTorch) unless set_default_timeout changed it.
#pragma once

#include <chrono>
#include <memory>
#include <string_view>
#include <vector>

#include "collectives/process_group.h"
#include "collectives/store.h"

namespace dtr {

enum class Backend : uint8_t { kGloo, kNccl };

constexpr std::string_view backend_name(Backend b) { return b == Backend::kGloo ? "gloo" : "nccl"; }

// A group of the backend over `store`, which every rank of the group shares (and which
// no other group uses). Collective over the group.
std::shared_ptr<ProcessGroup> make_process_group(Backend backend, std::shared_ptr<Store> store, int rank, int size,
                                                 GroupOptions options);

// The default group of every rank, through a store they share.
std::shared_ptr<ProcessGroup> init_process_group(Backend backend, std::shared_ptr<Store> store, int rank,
                                                 int world_size);
// The default group from torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR (default
// 127.0.0.1) and MASTER_PORT. Rank 0 serves the TCP store at MASTER_ADDR:MASTER_PORT unless
// TORCHELASTIC_USE_AGENT_STORE=True says the launcher serves it: torchrun's agent (which also
// sets TORCHELASTIC_RUN_ID) serves c10d's TCPStore, reached through C10dStore under the
// prefix /worker/attempt_<TORCHELASTIC_RESTART_COUNT>; any other launcher, dtr's.
std::shared_ptr<ProcessGroup> init_process_group(Backend backend);
bool is_initialized();
// The default group; throws ValueError before init_process_group.
std::shared_ptr<ProcessGroup> default_group();
// Destroys the default group (after its issued collectives finish) and the store's client.
void destroy_process_group();

// The group of the given world ranks (sorted, like PyTorch); ranks outside it get nullptr.
// Collective over the default group.
std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks);
// Splits parent: ranks passing the same colour form one group, ordered by parent rank;
// a negative colour joins no group (nullptr). Collective over parent. A mesh dimension's
// groups are split_group(world, coordinate on the other dimensions).
std::shared_ptr<ProcessGroup> split_group(ProcessGroup& parent, int colour);

// The timeout new groups take.
void set_default_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds default_timeout();

}  // namespace dtr
