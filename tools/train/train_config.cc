#include "tools/train/train_config.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <filesystem>
#include <limits>
#include <string_view>
#include <type_traits>

#include "core/error.h"
#include "kernels/block_reduce.h"
#include "tools/command_line.h"

namespace dtr::train {
namespace {

int64_t parse_count(const std::string& text) {
  int64_t n = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
  return error == std::errc() && end == text.data() + text.size() ? n : -1;
}

// Each name a flag takes, and the value it means.
template <typename T>
using Choice = std::pair<std::string_view, T>;

constexpr Choice<Arch> kArchs[] = {{"seed", Arch::kSeed}, {"gpt", Arch::kGpt}};
constexpr Choice<bool> kSwitches[] = {{"true", true}, {"false", false}};
constexpr Choice<optim::LRDecay> kLrSchedules[] = {
    {"cosine", optim::LRDecay::kCosine}, {"linear", optim::LRDecay::kLinear}, {"constant", optim::LRDecay::kConstant}};
constexpr Choice<Parallel> kParallels[] = {
    {"fsdp", Parallel::kFsdp}, {"hsdp", Parallel::kHsdp}, {"ddp", Parallel::kDdp}, {"none", Parallel::kNone}};
constexpr Choice<ActivationCheckpoint> kActivationCheckpoints[] = {{"none", ActivationCheckpoint::kNone},
                                                                   {"full", ActivationCheckpoint::kFull},
                                                                   {"selective", ActivationCheckpoint::kSelective}};
constexpr Choice<DeviceType> kDevices[] = {{"cpu", kCPU}, {"cuda", kCUDA}};
constexpr Choice<DataOrder> kDataOrders[] = {{"sequential", DataOrder::kSequential},
                                             {"shuffled", DataOrder::kShuffled}};
constexpr Choice<TokenizerKind> kTokenizers[] = {{"byte", TokenizerKind::kByte}, {"bpe", TokenizerKind::kBpe}};

template <typename T, size_t N>
std::string name_of(const Choice<T> (&choices)[N], T value) {
  for (const auto& [name, v] : choices) {
    if (v == value) return std::string(name);
  }
  DTR_INTERNAL_ASSERT(false, "value {} has no name among the flag's choices", static_cast<int>(value));
}

// A flag taking one of `choices`' names, parsed into `value` (a T, or an optional one that
// stays unset when the flag is not given). Another name is CLI11's one line, "--parallel: tp
// not in {fsdp,hsdp,ddp,none}"; --help shows the names and the default, as for a string.
template <typename T, size_t N, typename Value>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, Value& value, const Choice<T> (&choices)[N],
                        const std::string& help) {
  std::vector<std::string> names;
  for (const auto& [name, v] : choices) names.emplace_back(name);
  const auto parse = [&value, &choices](const std::string& given) {
    for (const auto& [name, v] : choices) {
      if (name == given) value = v;
    }
  };
  CLI::Option* option = app.add_option_function<std::string>(flag, parse, help)->check(CLI::IsMember(names));
  if constexpr (std::is_same_v<Value, T>) option->default_str(name_of(choices, value));
  return option;
}

// --reshard-after-forward: true, false or a rank count N >= 1; nullopt for anything else.
std::optional<ReshardAfterForward> parse_reshard_after_forward(const std::string& text) {
  if (text == "true" || text == "false") return text == "true";
  const int64_t n = parse_count(text);
  if (n < 1 || n > std::numeric_limits<int>::max()) return std::nullopt;
  return static_cast<int>(n);
}

// Its check while parsing: "got 'maybe'; legal: true, false or a rank count N >= 1".
CLI::Validator reshard_after_forward_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (parse_reshard_after_forward(text)) return "";
        return fmt::format("got '{}'; legal: true, false or a rank count N >= 1", text);
      },
      "");
}

}  // namespace

std::string flag_value(Arch arch) { return name_of(kArchs, arch); }
std::string flag_value(optim::LRDecay lr_schedule) { return name_of(kLrSchedules, lr_schedule); }
std::string flag_value(Parallel parallel) { return name_of(kParallels, parallel); }
std::string flag_value(ActivationCheckpoint activation_checkpoint) {
  return name_of(kActivationCheckpoints, activation_checkpoint);
}
std::string flag_value(DeviceType device) { return name_of(kDevices, device); }
std::string flag_value(DataOrder data_order) { return name_of(kDataOrders, data_order); }
std::string flag_value(TokenizerKind tokenizer) { return name_of(kTokenizers, tokenizer); }
std::string flag_value(const ReshardAfterForward& reshard_after_forward) {
  if (const bool* reshard = std::get_if<bool>(&reshard_after_forward)) return *reshard ? "true" : "false";
  return std::to_string(std::get<int>(reshard_after_forward));
}

void add_train_flags(CLI::App& app, TrainConfig& c) {
  const CLI::Validator positive = whole_number(1), non_negative = whole_number(0);
  app.add_option("--dim", c.dim, "model width")->check(positive)->capture_default_str()->group("Model");
  app.add_option("--layers", c.layers, "transformer blocks")
      ->check(non_negative)
      ->capture_default_str()
      ->group("Model");
  app.add_option("--heads", c.heads, "attention heads (must divide --dim)")
      ->check(positive)
      ->capture_default_str()
      ->group("Model");
  app.add_option("--vocab", c.vocab, "vocabulary size (default: the tokenizer's; at least the tokenizer's)")
      ->check(non_negative)
      ->group("Model");
  app.add_option("--seq-len", c.seq_len, "tokens per sequence")->check(positive)->capture_default_str()->group("Model");
  add_choice(app, "--arch", c.arch, kArchs,
             "seed: the seed's model (causal, no position embedding, no final norm, untied output); gpt: causal, "
             "learned positions, final LayerNorm, output tied to the embedding (initialised N(0, 0.02), GPT-2's)")
      ->group("Model");
  add_choice(app, "--causal", c.causal, kSwitches, "override --arch: causal attention")->group("Model");
  add_choice(app, "--pos-embed", c.pos_embed, kSwitches, "override --arch: a learned position embedding")
      ->group("Model");
  add_choice(app, "--final-norm", c.final_norm, kSwitches, "override --arch: a LayerNorm before the output")
      ->group("Model");
  add_choice(app, "--tie-embeddings", c.tie_embeddings, kSwitches, "override --arch: output weight = embedding")
      ->group("Model");
  app.add_option("--dropout", c.dropout, "dropout on attention weights and residual branches")
      ->check(finite_number(0, Bound::kClosed, 0.95))
      ->capture_default_str()
      ->group("Model");

  app.add_option("--steps", c.steps, "optimizer steps")->check(positive)->capture_default_str()->group("Training");
  app.add_option("--batch-size", c.batch_size,
                 "GLOBAL batch in sequences per optimizer step (all ranks and micro-batches together); it must split "
                 "evenly over --grad-accum micro-batches and then over the data-parallel ranks")
      ->check(positive)
      ->capture_default_str()
      ->group("Training");
  app.add_option("--grad-accum", c.grad_accum, "micro-batches per step (gradient sync on the last only)")
      ->check(positive)
      ->capture_default_str()
      ->group("Training");
  app.add_option("--lr", c.lr, "peak learning rate (AdamW)")
      ->check(finite_number(0, Bound::kOpen))
      ->capture_default_str()
      ->group("Training");
  app.add_option("--warmup", c.warmup, "linear warm-up steps")
      ->check(non_negative)
      ->capture_default_str()
      ->group("Training");
  add_choice(app, "--lr-schedule", c.lr_schedule, kLrSchedules,
             "after warm-up: cosine (to 10% of --lr), linear (to 0) or constant")
      ->group("Training");
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay")
      ->check(finite_number(0, Bound::kClosed))
      ->capture_default_str()
      ->group("Training");
  app.add_option("--grad-clip", c.grad_clip, "max global gradient norm (0: no clipping)")
      ->check(finite_number(0, Bound::kClosed))
      ->capture_default_str()
      ->group("Training");
  app.add_option("--seed", c.seed, "initialisation, dropout and data-order seed")
      ->check(unsigned_whole_number())
      ->capture_default_str()
      ->group("Training");
  app.add_option("--init-from", c.init_from,
                 "a full state dict to start from: a .safetensors file (PyTorch's names, e.g. saved by PyTorch or "
                 "checkpoint_tool export) or Hugging Face's sharded layout (a directory with "
                 "model.safetensors.index.json)")
      ->check(CLI::ExistingPath)
      ->group("Training");

  add_choice(app, "--parallel", c.parallel, kParallels,
             "fsdp (fully_shard each block and the root), hsdp (the same on a 2-D replicate x shard mesh), ddp "
             "(replicate), none (one process)")
      ->group("Parallelism");
  app.add_option("--mesh", c.mesh,
                 "mesh dims as name=size, comma-separated: dp=4 (fsdp, ddp) or replicate=2,shard=2 (hsdp), with --tp N "
                 "a last dim tp=N; the sizes' product must be the world size (default: dp=WORLD; hsdp: "
                 "replicate=2,shard=WORLD/2)")
      ->group("Parallelism");
  add_choice(app, "--activation-checkpoint", c.activation_checkpoint, kActivationCheckpoints,
             "none (keep every block's activations for backward), full (keep only the checkpointed blocks' inputs "
             "and recompute their forward in backward), selective (keep their inputs and the results of "
             "attention, collectives and the matrix products holding a quarter of their FLOPs at the fewest bytes, "
             "recompute the rest; "
             "docs/activation_checkpointing.md)")
      ->group("Parallelism");
  app.add_option("--ac-every", c.ac_every,
                 "with --activation-checkpoint full or selective: checkpoint every K-th block (0, K, 2K, ...)")
      ->check(positive)
      ->capture_default_str()
      ->group("Parallelism");
  app.add_flag("--mixed-precision", c.mixed_precision,
               "fsdp, hsdp: bf16 parameters and compute, float32 reduction (bf16 under --deterministic) and state")
      ->group("Parallelism");
  app.add_flag("--deterministic", c.deterministic,
               "layout-invariant training: the same losses, gradient norms, weights and AdamW state, bit for bit, "
               "for the same global batch and seed on any number of ranks under none, ddp, fsdp and hsdp, and "
               "under --tp with --feature-blocks; prints a digest of the whole state at the end "
               "(docs/deterministic.md)")
      ->group("Parallelism");
  app.add_option("--feature-blocks", c.feature_blocks,
                 "F: with --deterministic, every product over features (the layers' widths) sums F fixed blocks "
                 "in a canonical tree, so that --tp N (N dividing F, F/N a power of two) gives the bits of one rank "
                 "with the same F; 1: no blocks, no --tp (part of the result, like the seed: compare runs of one F)")
      ->check(positive)
      ->capture_default_str()
      ->group("Parallelism");
  app.add_flag("--cpu-offload", c.cpu_offload,
               "fsdp/hsdp: keep the sharded parameters, gradients and AdamW state in host memory (pinned under "
               "--device cuda) and step the optimizer on the CPU; the device holds parameters only while gathered")
      ->group("Parallelism");
  app.add_option("--prefetch", c.prefetch,
                 "explicit prefetch depth: each block's forward issues the all-gathers of the next N blocks (and "
                 "backward the previous N); 0: implicit (the last iteration's order)")
      ->check(non_negative)
      ->capture_default_str()
      ->group("Parallelism");
  app.add_option_function<std::string>(
         "--reshard-after-forward",
         [&c](const std::string& text) { c.reshard_after_forward = *parse_reshard_after_forward(text); },
         "fsdp/hsdp blocks: true (free after forward), false (keep through backward) or N (keep 1/N of them, "
         "sharded within groups of N ranks)")
      ->check(reshard_after_forward_check())
      ->default_str(flag_value(c.reshard_after_forward))
      ->group("Parallelism");
  app.add_option("--threads", c.threads, "compute threads per rank")
      ->check(positive)
      ->capture_default_str()
      ->group("Parallelism");
  add_choice(app, "--device", c.device, kDevices, "cpu or cuda")->group("Parallelism");
  app.add_option("--timeout", c.timeout_s, "seconds a collective may wait for a peer before every rank fails")
      ->check(positive)
      ->capture_default_str()
      ->group("Parallelism");

  app.add_option("--data", c.data,
                 "a text file (tokenised by --tokenizer) or a nanoGPT token file (.bin: little-endian uint16); "
                 "default: the built-in corpus")
      ->check(CLI::ExistingFile)
      ->group("Data and output");
  add_choice(app, "--data-order", c.data_order, kDataOrders,
             "sequential or shuffled (docs/train.md gives the exact order)")
      ->group("Data and output");
  add_choice(app, "--tokenizer", c.tokenizer, kTokenizers,
             "byte (256 tokens) or bpe (trained on the data, saved under --out)")
      ->group("Data and output");
  app.add_option("--bpe-vocab", c.bpe_vocab, "vocabulary size of the trained BPE")
      ->check(whole_number(257, 65535))
      ->capture_default_str()
      ->group("Data and output");
  app.add_option("--eval-every", c.eval_every, "steps between validation losses (0: none)")
      ->check(non_negative)
      ->capture_default_str()
      ->group("Data and output");
  app.add_option("--eval-batches", c.eval_batches, "global batches of held-out data per validation")
      ->check(positive)
      ->capture_default_str()
      ->group("Data and output");
  app.add_option("--log-every", c.log_every, "steps between progress lines")
      ->check(positive)
      ->capture_default_str()
      ->group("Data and output");
  app.add_option("--out", c.out, "directory for metrics, plots, summary and configuration")
      ->capture_default_str()
      ->group("Data and output");
  app.add_flag("--use-dcp-checkpointing", c.use_dcp_checkpointing,
               "save distributed checkpoints (each rank its shards) every --checkpoint-every steps and at the end")
      ->group("Checkpoints");
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "where checkpoints go (default: OUT/checkpoints)")
      ->group("Checkpoints");
  app.add_option("--checkpoint-every", c.checkpoint_every, "steps between checkpoints (0: only at the end)")
      ->check(non_negative)
      ->capture_default_str()
      ->group("Checkpoints");
  app.add_option("--keep-last", c.keep_last, "checkpoints kept (older ones deleted after a newer one committed)")
      ->check(positive)
      ->capture_default_str()
      ->group("Checkpoints");
  app.add_option("--resume", c.resume,
                 "latest (the newest checkpoint under --checkpoint-dir; none yet: start fresh) or a checkpoint's "
                 "directory; any world size and mesh")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return text.empty() ? "got ''; legal: latest or a checkpoint's directory" : "";
          },
          ""))
      ->group("Checkpoints");
  app.add_option("--trace", c.trace,
                 "FIRST:LAST: trace those steps (1-based, inclusive): OUT/trace/rank<R>.json per rank, "
                 "OUT/trace/merged.json (clocks aligned; open in ui.perfetto.dev) and OUT/step_timeline.svg (the first "
                 "traced step)")
      ->group("Data and output");
  app.add_option("--tp", c.tp,
                 "N: tensor parallelism over N ranks (attention heads, FFN features and the vocabulary split, "
                 "Megatron's layout): alone with --parallel none on N ranks, or under fsdp, hsdp or ddp over the "
                 "other WORLD/N (mesh dp=WORLD/N,tp=N)")
      ->check(positive)
      ->group("Parallelism");
  app.add_flag("--sequence-parallel", c.sequence_parallel,
               "with --tp: norms and dropout on activations split along the sequence (reduce-scatter and "
               "all-gather instead of all-reduce)")
      ->group("Parallelism");
  app.add_flag("--loss-parallel", c.loss_parallel,
               "with --tp: cross-entropy on the logits split over the vocabulary, never gathered")
      ->group("Parallelism");
  app.add_option("--comm-debug", c.comm_debug,
                 "STEP: print that step's collectives (1-based) by module and phase, with any implicit "
                 "redistribute and the op that caused it (nn::CommDebugMode)")
      ->check(positive)
      ->group("Data and output");
}

std::optional<std::pair<int64_t, int64_t>> trace_steps(const TrainConfig& c) {
  if (c.trace.empty()) return std::nullopt;
  const size_t colon = c.trace.find(':');
  const int64_t first = colon == std::string::npos ? -1 : parse_count(c.trace.substr(0, colon));
  const int64_t last = colon == std::string::npos ? -1 : parse_count(c.trace.substr(colon + 1));
  DTR_CHECK(first >= 1 && last >= first, ValueError,
            "--trace {}: expected FIRST:LAST, steps with 1 <= FIRST <= LAST (e.g. --trace 10:12)", c.trace);
  return std::pair{first, last};
}

ArchSwitches arch_switches(const TrainConfig& c) {
  const bool gpt = c.arch == Arch::kGpt;
  return {.causal = c.causal.value_or(true),
          .pos_embed = c.pos_embed.value_or(gpt),
          .final_norm = c.final_norm.value_or(gpt),
          .tie_embeddings = c.tie_embeddings.value_or(gpt)};
}

namespace {

// --parallel's mesh without --mesh: its dims' names are the ones --mesh must give too.
std::vector<std::pair<std::string, int64_t>> default_mesh_dims(const TrainConfig& c, int64_t world_size) {
  const std::pair<std::string, int64_t> tp{std::string(kTensorParallelDim), c.tp};
  const int64_t data = world_size / c.tp;  // the data-parallel ranks
  if (c.tp > 1 && c.parallel == Parallel::kNone) return {tp};
  std::vector<std::pair<std::string, int64_t>> dims = {{"dp", data}};
  if (c.parallel == Parallel::kHsdp) dims = {{"replicate", 2}, {"shard", data / 2}};
  if (c.tp > 1) dims.push_back(tp);
  return dims;
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> mesh_dims(const TrainConfig& c, int64_t world_size) {
  if (c.mesh.empty()) return default_mesh_dims(c, world_size);
  std::vector<std::pair<std::string, int64_t>> dims;
  size_t at = 0;
  while (at <= c.mesh.size()) {
    const size_t comma = std::min(c.mesh.find(',', at), c.mesh.size());
    const std::string item = c.mesh.substr(at, comma - at);
    const size_t eq = item.find('=');
    const int64_t size = eq == std::string::npos ? -1 : parse_count(item.substr(eq + 1));
    DTR_CHECK(eq != std::string::npos && eq > 0 && size >= 1, ValueError,
              "--mesh '{}': each dim is name=size with a positive size, e.g. dp=4 or replicate=2,shard=2", c.mesh);
    dims.emplace_back(item.substr(0, eq), size);
    at = comma + 1;
  }
  return dims;
}

DType compute_dtype(const TrainConfig& c) { return c.mixed_precision ? kBFloat16 : kFloat32; }

std::string checkpoint_dir_of(const TrainConfig& c) {
  return c.checkpoint_dir.empty() ? c.out + "/checkpoints" : c.checkpoint_dir;
}

std::string checkpoint_dir_flag(const TrainConfig& c) {
  return c.checkpoint_dir.empty() ? "--out" : "--checkpoint-dir";
}

std::vector<std::pair<std::string, std::string>> output_dirs(const TrainConfig& c) {
  std::vector<std::pair<std::string, std::string>> dirs = {{"--out", c.out}};
  if (c.use_dcp_checkpointing) dirs.emplace_back(checkpoint_dir_flag(c), checkpoint_dir_of(c));
  return dirs;
}

void prepare_output_dirs(const TrainConfig& c) {
  for (const auto& [flag, dir] : output_dirs(c)) {
    std::error_code ec;
    DTR_CHECK(!std::filesystem::exists(dir, ec) || std::filesystem::is_directory(dir, ec), ValueError,
              "{} {}: a file is there; it names a directory (give a new path or an existing directory)", flag, dir);
    std::filesystem::create_directories(dir, ec);
    DTR_CHECK(!ec, ValueError, "{} {}: cannot create the directory: {}", flag, dir, ec.message());
    DTR_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, ValueError, "{} {}: this user cannot write there", flag, dir);
  }
}

void check_vocab(const TrainConfig& c, int64_t tokenizer_vocab) {
  DTR_CHECK(c.vocab == 0 || c.vocab >= tokenizer_vocab, ValueError,
            "--vocab {} is smaller than the tokenizer's {} tokens; give at least {} (or leave it out)", c.vocab,
            tokenizer_vocab, tokenizer_vocab);
}

namespace {

// Whether micro_batches splits the step's micro-batches into nodes of the canonical tree.
bool splits_into_nodes(const TrainConfig& c, int64_t data_ranks) {
  return c.deterministic && !c.mixed_precision && std::has_single_bit(static_cast<uint64_t>(data_ranks)) &&
         data_ranks * c.grad_accum > 1;
}

// What --deterministic refuses (docs/deterministic.md): GPU ranks, tensor parallelism whose
// ranks would not each sum a power of two of whole feature blocks, and the tp variants that
// split a reduction block. Any batch, rank count and --grad-accum is covered: on a power of
// two of data-parallel ranks micro_batches splits a share into nodes, elsewhere the shares
// run rank-major and are reduced as lists of nodes where they are not one.
void validate_deterministic(const TrainConfig& c) {
  DTR_CHECK(c.device == kCPU, ValueError,
            "--deterministic: CPU ranks only (--device {}); the GPU kernels keep their "
            "own summation orders",
            flag_value(c.device));
  const int64_t f = c.feature_blocks;
  DTR_CHECK(c.tp == 1 || (f % c.tp == 0 && std::has_single_bit(static_cast<uint64_t>(f / c.tp))), ValueError,
            "--deterministic with --tp {} and --feature-blocks {}: each tp rank must sum a power of two of whole "
            "blocks of every contraction it splits; use --feature-blocks {} (and the same in the runs you compare)",
            c.tp, f, c.tp * std::bit_floor(static_cast<uint64_t>(std::max<int64_t>(1, f / c.tp))));
  DTR_CHECK(c.dim % f == 0, ValueError,
            "--deterministic with --feature-blocks {}: the contractions over --dim {} and the FFN's {} features must "
            "split into {} equal blocks; use a block count dividing --dim",
            f, c.dim, 4 * c.dim, f);
  DTR_CHECK(!c.sequence_parallel && !c.loss_parallel, ValueError,
            "--deterministic with --{}: it splits a reduction block (a sequence's tokens, or the vocabulary's sum "
            "of exponentials) over the tp ranks; drop it (--tp alone keeps the vocabulary whole under the mode)",
            c.sequence_parallel ? "sequence-parallel" : "loss-parallel");
}

// Whether the ranks' shares of a step may be no nodes of the canonical tree: a share that is
// not a power of two of sequences, or hsdp shard groups (reduced first) of a number of ranks
// that is not a power of two.
bool shares_may_be_no_nodes(const TrainConfig& c, int64_t data_ranks) {
  if (!std::has_single_bit(static_cast<uint64_t>(c.batch_size / data_ranks))) return true;
  if (c.parallel != Parallel::kHsdp) return false;
  for (const auto& [name, size] : mesh_dims(c, data_ranks * c.tp)) {
    if (name == "shard") return !std::has_single_bit(static_cast<uint64_t>(size));
  }
  return false;
}

}  // namespace

bool rank_major_micro_batches(const TrainConfig& c, int64_t data_ranks) {
  return c.deterministic && data_ranks * c.grad_accum > 1 &&
         (c.mixed_precision || !std::has_single_bit(static_cast<uint64_t>(data_ranks))) &&
         (c.grad_accum > 1 || shares_may_be_no_nodes(c, data_ranks));
}

bool rank_shares_are_node_lists(const TrainConfig& c, int64_t data_ranks) {
  return rank_major_micro_batches(c, data_ranks) && data_ranks > 1 && shares_may_be_no_nodes(c, data_ranks);
}

std::vector<MicroBatch> micro_batches(const TrainConfig& c, int64_t data_ranks) {
  const int64_t rows = c.batch_size / c.grad_accum;
  std::vector<MicroBatch> out;
  if (rank_major_micro_batches(c, data_ranks)) {
    // Each rank's share of a micro-batch in nodes of the largest power of two dividing it.
    const int64_t node = int64_t{1} << std::countr_zero(static_cast<uint64_t>(rows / data_ranks));
    for (int64_t first = 0; first < c.batch_size / data_ranks; first += node) {
      out.push_back({.first = first, .rows = node * data_ranks});
    }
    return out;
  }
  for (int64_t first = 0; first < c.batch_size; first += rows) {
    if (!splits_into_nodes(c, data_ranks)) {
      out.push_back({.first = first, .rows = rows});
      continue;
    }
    for (const TreeNode& node : covering_nodes(first, first + rows)) {
      out.push_back({.first = node.first(), .rows = node.size()});
    }
  }
  return out;
}

void validate(const TrainConfig& c, int64_t world_size) {
  if (const auto steps = trace_steps(c)) {
    DTR_CHECK(steps->second <= c.steps, ValueError, "--trace {}: the run has {} steps (--steps)", c.trace, c.steps);
  }
  DTR_CHECK(c.comm_debug <= c.steps, ValueError, "--comm-debug {}: the run has {} steps (--steps)", c.comm_debug,
            c.steps);
  DTR_CHECK(c.resume.empty() || c.use_dcp_checkpointing, ValueError,
            "--resume {}: resuming reads distributed checkpoints; add --use-dcp-checkpointing", c.resume);
  // Flags that only tune another, set off their defaults while it is off: they would do
  // nothing, silently.
  const TrainConfig defaults;
  const std::pair<bool, std::string> idle[] = {
      {!c.use_dcp_checkpointing && !c.checkpoint_dir.empty(),
       fmt::format("--checkpoint-dir {}: checkpoints are off; add --use-dcp-checkpointing", c.checkpoint_dir)},
      {!c.use_dcp_checkpointing && c.checkpoint_every != defaults.checkpoint_every,
       fmt::format("--checkpoint-every {}: checkpoints are off; add --use-dcp-checkpointing", c.checkpoint_every)},
      {!c.use_dcp_checkpointing && c.keep_last != defaults.keep_last,
       fmt::format("--keep-last {}: checkpoints are off; add --use-dcp-checkpointing", c.keep_last)},
      {c.activation_checkpoint == ActivationCheckpoint::kNone && c.ac_every != defaults.ac_every,
       fmt::format("--ac-every {}: no block is checkpointed; add --activation-checkpoint full or selective",
                   c.ac_every)},
      {c.tokenizer != TokenizerKind::kBpe && c.bpe_vocab != defaults.bpe_vocab,
       fmt::format("--bpe-vocab {}: it sizes the BPE tokenizer; add --tokenizer bpe", c.bpe_vocab)},
  };
  for (const auto& [off, message] : idle) DTR_CHECK(!off, ValueError, "{}", message);
  DTR_CHECK(c.dim % c.heads == 0, ValueError, "--heads {} does not divide --dim {}; pick heads dividing the width",
            c.heads, c.dim);
  DTR_CHECK(c.vocab <= 65536, ValueError, "--vocab {}: tokens are uint16, so at most 65536", c.vocab);
  const Parallel parallel = c.parallel;
  DTR_CHECK(world_size % c.tp == 0, ValueError,
            "--tp {} on {} ranks: the tensor-parallel size must divide the world size", c.tp, world_size);
  DTR_CHECK(c.tp > 1 || (!c.sequence_parallel && !c.loss_parallel), ValueError,
            "--{}: it is a variant of tensor parallelism; add --tp N (N > 1)",
            c.sequence_parallel ? "sequence-parallel" : "loss-parallel");
  DTR_CHECK(c.heads % c.tp == 0, ValueError,
            "--tp {}: the {} attention heads (--heads) do not split over {} ranks; use a tp size dividing the heads",
            c.tp, c.heads, c.tp);
  DTR_CHECK(parallel != Parallel::kNone || world_size == c.tp, ValueError,
            "--parallel none runs one process (or --tp N on N ranks), but the world has {} ranks; use fsdp, hsdp or "
            "ddp, or --tp {}",
            world_size, world_size);
  const int64_t data_ranks = world_size / c.tp;  // tensor-parallel ranks share their batch
  const std::string tp_dim = c.tp > 1 ? fmt::format(",{}={}", kTensorParallelDim, c.tp) : "";
  DTR_CHECK(parallel != Parallel::kHsdp || !c.mesh.empty() || (data_ranks >= 2 && data_ranks % 2 == 0), ValueError,
            "--parallel hsdp on {} data-parallel rank(s): its default mesh, replicate=2,shard=N/2{}, needs an even "
            "number of 2 or more; give --mesh replicate=R,shard=S{} with R x S = {} (e.g. replicate={},shard=1{}), or "
            "use --parallel fsdp",
            data_ranks, tp_dim, tp_dim, data_ranks, data_ranks, tp_dim);
  const auto dims = mesh_dims(c, world_size);
  int64_t mesh_size = 1;
  for (const auto& [name, size] : dims) mesh_size *= size;
  const std::string mesh_text = c.mesh.empty() ? "(default)" : c.mesh;
  DTR_CHECK(mesh_size == world_size, ValueError, "--mesh {}: its dims hold {} ranks but the world has {}", mesh_text,
            mesh_size, world_size);
  // The default mesh's dims by name (the model reads them so: hsdp's first is the replicate
  // dim), the tensor-parallel one of --tp ranks.
  std::vector<std::string> expected, names;
  for (const auto& [name, size] : default_mesh_dims(c, world_size)) expected.push_back(name);
  for (const auto& [name, size] : dims) names.push_back(name);
  const bool tp_sized = c.tp == 1 || (!dims.empty() && dims.back().second == c.tp);
  DTR_CHECK(names == expected && tp_sized, ValueError, "--mesh {}: --parallel {}{} takes {}", mesh_text,
            flag_value(parallel), c.tp > 1 ? fmt::format(" with --tp {}", c.tp) : "",
            parallel == Parallel::kHsdp
                ? fmt::format("replicate=R,shard=S{} (R x S = {}, e.g. {})", tp_dim, data_ranks,
                              data_ranks % 2 == 0 ? fmt::format("replicate=2,shard={}{}", data_ranks / 2, tp_dim)
                                                  : fmt::format("replicate={},shard=1{}", data_ranks, tp_dim))
            : parallel == Parallel::kNone && c.tp > 1
                ? fmt::format("{}={} (or leave --mesh out)", kTensorParallelDim, c.tp)
                : fmt::format("dp={}{} (or leave --mesh out)", data_ranks, tp_dim));
  DTR_CHECK(c.batch_size % c.grad_accum == 0, ValueError,
            "--batch-size {} (global sequences per step) does not split into --grad-accum {} micro-batches",
            c.batch_size, c.grad_accum);
  const int64_t micro = c.batch_size / c.grad_accum;
  DTR_CHECK(micro % data_ranks == 0, ValueError,
            "--batch-size {} (global sequences per step): each of its {} micro-batches of {} sequences must split "
            "evenly over the {} data-parallel ranks; use a multiple of {}",
            c.batch_size, c.grad_accum, micro, data_ranks, c.grad_accum * data_ranks);
  if (const int* k = std::get_if<int>(&c.reshard_after_forward)) {
    DTR_CHECK(parallel == Parallel::kFsdp && c.tp == 1 && world_size % *k == 0, ValueError,
              "--reshard-after-forward {}: a rank count needs --parallel fsdp without --tp and must divide the world "
              "size {}",
              *k, world_size);
  }
  DTR_CHECK(!c.cpu_offload || parallel == Parallel::kFsdp || parallel == Parallel::kHsdp, ValueError,
            "--cpu-offload: offloading keeps FSDP's shards on the host; use it with --parallel fsdp or hsdp (got {})",
            flag_value(c.parallel));
  DTR_CHECK(c.prefetch == 0 || parallel == Parallel::kFsdp || parallel == Parallel::kHsdp, ValueError,
            "--prefetch {}: explicit prefetch is FSDP's; use it with --parallel fsdp or hsdp", c.prefetch);
  DTR_CHECK(!c.mixed_precision || parallel == Parallel::kFsdp || parallel == Parallel::kHsdp, ValueError,
            "--mixed-precision is fully_shard's bf16 policy: --parallel {} would train in float32; use --parallel "
            "fsdp or hsdp",
            flag_value(parallel));
  DTR_CHECK(c.deterministic || c.feature_blocks == 1, ValueError,
            "--feature-blocks {}: it fixes the blocks --deterministic sums in; add --deterministic", c.feature_blocks);
  if (c.deterministic) validate_deterministic(c);
}

nlohmann::json model_flags(const TrainConfig& c, int64_t vocab) {
  const ArchSwitches a = arch_switches(c);
  auto text = [](bool on) { return on ? "true" : "false"; };
  nlohmann::json flags = {{"--dim", std::to_string(c.dim)},
                          {"--layers", std::to_string(c.layers)},
                          {"--heads", std::to_string(c.heads)},
                          {"--vocab", std::to_string(vocab)},
                          {"--causal", text(a.causal)},
                          {"--pos-embed", text(a.pos_embed)},
                          {"--final-norm", text(a.final_norm)},
                          {"--tie-embeddings", text(a.tie_embeddings)},
                          {"--tokenizer", flag_value(c.tokenizer)}};
  if (a.pos_embed) flags["--seq-len"] = std::to_string(c.seq_len);  // the position table's rows
  if (c.tokenizer == TokenizerKind::kBpe) flags["--bpe-vocab"] = std::to_string(c.bpe_vocab);
  return flags;
}

nlohmann::json to_json(const TrainConfig& c) {
  const ArchSwitches a = arch_switches(c);
  return {{"dim", c.dim},
          {"layers", c.layers},
          {"heads", c.heads},
          {"vocab", c.vocab},
          {"seq_len", c.seq_len},
          {"arch", flag_value(c.arch)},
          {"causal", a.causal},
          {"pos_embed", a.pos_embed},
          {"final_norm", a.final_norm},
          {"tie_embeddings", a.tie_embeddings},
          {"dropout", c.dropout},
          {"steps", c.steps},
          {"batch_size", c.batch_size},
          {"grad_accum", c.grad_accum},
          {"deterministic", c.deterministic},
          {"feature_blocks", c.feature_blocks},
          {"lr", c.lr},
          {"warmup", c.warmup},
          {"lr_schedule", flag_value(c.lr_schedule)},
          {"weight_decay", c.weight_decay},
          {"grad_clip", c.grad_clip},
          {"seed", c.seed},
          {"init_from", c.init_from},
          {"parallel", flag_value(c.parallel)},
          {"tp", c.tp},
          {"sequence_parallel", c.sequence_parallel},
          {"loss_parallel", c.loss_parallel},
          {"activation_checkpoint", flag_value(c.activation_checkpoint)},
          {"ac_every", c.ac_every},
          {"mesh", c.mesh},
          {"mixed_precision", c.mixed_precision},
          {"cpu_offload", c.cpu_offload},
          {"prefetch", c.prefetch},
          {"reshard_after_forward", flag_value(c.reshard_after_forward)},
          {"threads", c.threads},
          {"device", flag_value(c.device)},
          {"timeout_s", c.timeout_s},
          {"data", c.data},
          {"data_order", flag_value(c.data_order)},
          {"tokenizer", flag_value(c.tokenizer)},
          {"bpe_vocab", c.bpe_vocab},
          {"eval_every", c.eval_every},
          {"eval_batches", c.eval_batches},
          {"log_every", c.log_every},
          {"out", c.out},
          {"use_dcp_checkpointing", c.use_dcp_checkpointing},
          {"checkpoint_dir", checkpoint_dir_of(c)},
          {"checkpoint_every", c.checkpoint_every},
          {"keep_last", c.keep_last},
          {"resume", c.resume},
          {"trace", c.trace}};
}

}  // namespace dtr::train
