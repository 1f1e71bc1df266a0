// The train program's configuration: every flag, its default, and the checks that turn a
// bad or contradictory combination into one ValueError line naming the flag and what is
// legal (tool_main prints it and exits 1). A flag that takes one of a few names (--parallel,
// --lr-schedule, --device, ...) is parsed once, into an enum; a value outside them is
// rejected while parsing, in one line naming the flag and the legal names
// ("train: --parallel: tp not in {fsdp,hsdp,ddp,none}").
#pragma once

#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "optim/lr_scheduler.h"
#include "tools/train/token_data.h"

namespace dtr::train {

// The flags that take one of a few names are parsed once, into these types; flag_value()
// gives the name back (config.json and the start block print it).
enum class Arch : uint8_t { kSeed, kGpt };
enum class Parallel : uint8_t { kFsdp, kHsdp, kDdp, kNone };
// Which blocks' activations are recomputed in backward instead of kept (nn/checkpoint.h).
enum class ActivationCheckpoint : uint8_t { kNone, kFull, kSelective };
enum class TokenizerKind : uint8_t { kByte, kBpe };
// --reshard-after-forward: true, false or a rank count N (FullyShardOptions' own type).
using ReshardAfterForward = std::variant<bool, int>;

struct TrainConfig {
  // Model.
  int64_t dim = 128, layers = 4, heads = 4;
  int64_t vocab = 0;  // 0: the tokenizer's
  int64_t seq_len = 128;
  Arch arch = Arch::kGpt;  // the four below override it one by one when given
  std::optional<bool> causal, pos_embed, final_norm, tie_embeddings;
  double dropout = 0;
  // Training.
  int64_t steps = 1000, batch_size = 16, grad_accum = 1;
  double lr = 2e-3;
  int64_t warmup = 50;
  optim::LRDecay lr_schedule = optim::LRDecay::kCosine;  // after the warm-up (tools/train/lr_schedule.h)
  double weight_decay = 0.1, grad_clip = 1.0;
  uint64_t seed = 1234;
  std::string init_from;
  // Parallelism.
  Parallel parallel = Parallel::kFsdp;
  ActivationCheckpoint activation_checkpoint = ActivationCheckpoint::kNone;
  int64_t ac_every = 1;  // with kFull or kSelective: blocks 0, K, 2K, ... are checkpointed
  std::string mesh;
  bool mixed_precision = false;
  bool deterministic = false;  // layout-invariant reductions (kernels/block_reduce.h)
  int64_t feature_blocks = 1;  // with --deterministic: the feature contractions' fixed blocks
  bool cpu_offload = false;
  int64_t prefetch = 0;
  ReshardAfterForward reshard_after_forward = true;
  // Tensor parallelism over --tp ranks (nn::transformer_tp_plan), with its sequence- and
  // loss-parallel variants, on the mesh dim kTensorParallelDim (the last): on its own
  // (--parallel none, the whole world), or under fsdp (dp x tp) or hsdp
  // (replicate x shard x tp), which shard each rank's tensor-parallel piece, or ddp (dp x tp).
  int64_t tp = 1;
  bool sequence_parallel = false, loss_parallel = false;
  int64_t threads = 1;
  DeviceType device = kCPU;
  int64_t timeout_s = 60;
  // Data and output.
  std::string data;
  DataOrder data_order = DataOrder::kSequential;
  TokenizerKind tokenizer = TokenizerKind::kByte;
  int64_t bpe_vocab = 512;
  int64_t eval_every = 100, eval_batches = 4, log_every = 10;
  std::string out = "train_out";
  // Checkpoints.
  bool use_dcp_checkpointing = false;
  std::string checkpoint_dir;  // "": <out>/checkpoints
  int64_t checkpoint_every = 100, keep_last = 2;
  std::string resume;  // "", "latest" or a checkpoint's path
  // Tracing: "" (off) or "FIRST:LAST", the steps (1-based, inclusive) to trace.
  std::string trace;
  // The step (1-based) whose collectives rank 0 prints by module and phase (0: none).
  int64_t comm_debug = 0;
};

// The name of the tensor-parallel mesh dim: its ranks share their batch.
inline constexpr std::string_view kTensorParallelDim = "tp";

// Whether --deterministic runs the micro-batches rank-major (docs/deterministic.md): on a
// number of data-parallel ranks that is not a power of two, or with --mixed-precision (whose
// micro-batches' tree must add in bfloat16, before the reduction), when a step has more than
// one micro-batch or a rank's share is not one node of the canonical tree. Each rank then
// holds one range of the step's batch, run in micro-batches of the largest power of two of
// sequences dividing its share of one --grad-accum micro-batch.
bool rank_major_micro_batches(const TrainConfig& c, int64_t data_ranks);

// Whether rank-major micro-batches leave the ranks' shares of the step as lists of nodes (a
// share that is not a power of two of sequences, or hsdp shard groups of a number of ranks
// that is not a power of two, which are no nodes), which fully_shard and replicate reduce
// over the whole data-parallel group in the tree (reduce_node_lists, dtensor/node_lists.h;
// BatchWindow::node_lists).
bool rank_shares_are_node_lists(const TrainConfig& c, int64_t data_ranks);

// One micro-batch of a step: sequences [first, first + rows) of the step's batch (rank-major:
// `first` is rank 0's first sequence, and each rank's rows / ranks start a share of the step
// after the previous rank's).
struct MicroBatch {
  int64_t first = 0, rows = 0;
};

// The step's micro-batches in order: --grad-accum equal ranges. Under --deterministic on a
// power of two of data-parallel ranks (without --mixed-precision), when there is more than
// one rank or micro-batch, each range is split into the nodes of the canonical tree that
// cover it (covering_nodes, kernels/block_reduce.h), so that every rank's share of each is
// one node whatever the batch size: 12 sequences on 2 ranks run as 8 and 4; rank-major ones
// (rank_major_micro_batches) are equal nodes of each rank's share (docs/deterministic.md).
std::vector<MicroBatch> micro_batches(const TrainConfig& c, int64_t data_ranks);

// The name each value has on the command line: flag_value(Parallel::kHsdp) is "hsdp",
// flag_value(ReshardAfterForward(2)) "2".
std::string flag_value(Arch arch);
std::string flag_value(optim::LRDecay lr_schedule);
std::string flag_value(Parallel parallel);
std::string flag_value(ActivationCheckpoint activation_checkpoint);
std::string flag_value(const ReshardAfterForward& reshard_after_forward);
std::string flag_value(DeviceType device);
std::string flag_value(DataOrder data_order);
std::string flag_value(TokenizerKind tokenizer);

// The dtype of the matrix products: bfloat16 under --mixed-precision, else float32.
DType compute_dtype(const TrainConfig& config);

// --checkpoint-dir, or <out>/checkpoints; and the flag that names it in messages.
std::string checkpoint_dir_of(const TrainConfig& config);
std::string checkpoint_dir_flag(const TrainConfig& config);
// The directories the run writes, each with the flag that names it: --out, and the
// checkpoint directory when checkpointing.
std::vector<std::pair<std::string, std::string>> output_dirs(const TrainConfig& config);

// The steps --trace names, [first, last] (1-based); nullopt when it is off. ValueError for
// a malformed range.
std::optional<std::pair<int64_t, int64_t>> trace_steps(const TrainConfig& config);

// Registers every flag on `app`, writing into `config`.
void add_train_flags(CLI::App& app, TrainConfig& config);

// The model switches after --arch and the four overrides.
struct ArchSwitches {
  bool causal = true, pos_embed = true, final_norm = true, tie_embeddings = true;
};
ArchSwitches arch_switches(const TrainConfig& config);

// The mesh's dims as (name, size): --mesh parsed ("dp=4", "replicate=2,shard=2"), or the
// default for --parallel over `world_size` ranks.
std::vector<std::pair<std::string, int64_t>> mesh_dims(const TrainConfig& config, int64_t world_size);

// ValueError (one line: the flag, the value, what is legal) for a bad or contradictory
// configuration on `world_size` ranks (before any data is read).
void validate(const TrainConfig& config, int64_t world_size);
// Creates --out and, when checkpointing, the checkpoint directory; ValueError naming the flag
// when one is a file or cannot be created or written, so the run fails before step 1
// instead of at its first save.
void prepare_output_dirs(const TrainConfig& config);
// ValueError when --vocab is given and smaller than the tokenizer's vocabulary.
void check_vocab(const TrainConfig& config, int64_t tokenizer_vocab);

nlohmann::json to_json(const TrainConfig& config);

// The flags that fix what a checkpoint's tensors mean, as {"--heads": "4", ...} (the
// vocabulary as built: `vocab`): the shapes, the switches of --arch, the tokenizer. A run
// resuming a checkpoint must give the same ones; the others (learning rate, batch, layout,
// dropout, precision) may change.
nlohmann::json model_flags(const TrainConfig& config, int64_t vocab);

}  // namespace dtr::train
