#include "tools/train/train_config.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>

#include "core/error.h"
#include "tools/command_line.h"

namespace dtr::train {
namespace {

// A tri-state switch: unset, or "true" / "false".
bool switch_or(const std::string& value, bool fallback) { return value.empty() ? fallback : value == "true"; }

int64_t parse_count(const std::string& text) {
  int64_t n = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
  return error == std::errc() && end == text.data() + text.size() ? n : -1;
}

}  // namespace

void add_train_flags(CLI::App& app, TrainConfig& c) {
  const CLI::Validator positive = whole_number(1), non_negative = whole_number(0);
  const auto boolean = CLI::IsMember({"true", "false"});
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
      ->group("Model");
  app.add_option("--seq-len", c.seq_len, "tokens per sequence")->check(positive)->capture_default_str()->group("Model");
  app.add_option("--arch", c.arch,
                 "seed: the seed's model (causal, no position embedding, no final norm, untied output); gpt: causal, "
                 "learned positions, final LayerNorm, output tied to the embedding (initialised N(0, 0.02), GPT-2's)")
      ->check(CLI::IsMember({"seed", "gpt"}))
      ->capture_default_str()
      ->group("Model");
  app.add_option("--causal", c.causal, "override --arch: causal attention")->check(boolean)->group("Model");
  app.add_option("--pos-embed", c.pos_embed, "override --arch: a learned position embedding")
      ->check(boolean)
      ->group("Model");
  app.add_option("--final-norm", c.final_norm, "override --arch: a LayerNorm before the output")
      ->check(boolean)
      ->group("Model");
  app.add_option("--tie-embeddings", c.tie_embeddings, "override --arch: output weight = embedding")
      ->check(boolean)
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
  app.add_option("--lr-schedule", c.lr_schedule, "after warm-up: cosine (to 10% of --lr), linear (to 0) or constant")
      ->check(CLI::IsMember({"cosine", "linear", "constant"}))
      ->capture_default_str()
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
      ->capture_default_str()
      ->group("Training");
  app.add_option("--init-from", c.init_from,
                 "a full state dict to start from: a .safetensors file (PyTorch's names, e.g. saved by PyTorch or "
                 "checkpoint_tool export) or Hugging Face's sharded layout (a directory with "
                 "model.safetensors.index.json)")
      ->check(CLI::ExistingPath)
      ->group("Training");

  app.add_option("--parallel", c.parallel,
                 "fsdp (fully_shard each block and the root), hsdp (the same on a 2-D replicate x shard mesh), ddp "
                 "(replicate), none (one process)")
      ->check(CLI::IsMember({"fsdp", "hsdp", "ddp", "none"}))
      ->capture_default_str()
      ->group("Parallelism");
  app.add_option("--mesh", c.mesh,
                 "mesh dims as name=size, comma-separated: dp=4 (fsdp, ddp) or replicate=2,shard=2 (hsdp); the sizes' "
                 "product must be the world size (default: dp=WORLD; hsdp: replicate=2,shard=WORLD/2)")
      ->group("Parallelism");
  app.add_flag("--mixed-precision", c.mixed_precision, "bf16 parameters and compute, float32 reduction and state")
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
  app.add_option("--reshard-after-forward", c.reshard_after_forward,
                 "fsdp/hsdp blocks: true (free after forward), false (keep through backward) or N (keep 1/N of them, "
                 "sharded within groups of N ranks)")
      ->capture_default_str()
      ->group("Parallelism");
  app.add_option("--threads", c.threads, "compute threads per rank")
      ->check(positive)
      ->capture_default_str()
      ->group("Parallelism");
  app.add_option("--device", c.device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str()
      ->group("Parallelism");
  app.add_option("--timeout", c.timeout_s, "seconds a collective may wait for a peer before every rank fails")
      ->check(positive)
      ->capture_default_str()
      ->group("Parallelism");

  app.add_option("--data", c.data,
                 "a text file (tokenised by --tokenizer) or a nanoGPT token file (.bin: little-endian uint16); "
                 "default: the built-in corpus")
      ->check(CLI::ExistingFile)
      ->group("Data and output");
  app.add_option("--data-order", c.data_order, "sequential or shuffled (docs/train.md gives the exact order)")
      ->check(CLI::IsMember({"sequential", "shuffled"}))
      ->capture_default_str()
      ->group("Data and output");
  app.add_option("--tokenizer", c.tokenizer, "byte (256 tokens) or bpe (trained on the data, saved under --out)")
      ->check(CLI::IsMember({"byte", "bpe"}))
      ->capture_default_str()
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
      ->group("Checkpoints");
  app.add_option("--trace", c.trace,
                 "FIRST:LAST: trace those steps (1-based, inclusive): OUT/trace/rank<R>.json per rank, "
                 "OUT/trace/merged.json (clocks aligned; open in ui.perfetto.dev) and OUT/step_timeline.svg (the first "
                 "traced step)")
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
  const bool gpt = c.arch == "gpt";
  return {.causal = switch_or(c.causal, true),
          .pos_embed = switch_or(c.pos_embed, gpt),
          .final_norm = switch_or(c.final_norm, gpt),
          .tie_embeddings = switch_or(c.tie_embeddings, gpt)};
}

Parallel parallel_of(const TrainConfig& c) {
  if (c.parallel == "hsdp") return Parallel::kHsdp;
  if (c.parallel == "ddp") return Parallel::kDdp;
  if (c.parallel == "none") return Parallel::kNone;
  return Parallel::kFsdp;
}

DataOrder data_order_of(const TrainConfig& c) {
  return c.data_order == "shuffled" ? DataOrder::kShuffled : DataOrder::kSequential;
}

std::vector<std::pair<std::string, int64_t>> mesh_dims(const TrainConfig& c, int64_t world_size) {
  const Parallel parallel = parallel_of(c);
  if (c.mesh.empty()) {
    if (parallel == Parallel::kHsdp) return {{"replicate", 2}, {"shard", world_size / 2}};
    return {{"dp", world_size}};
  }
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

std::string checkpoint_dir_of(const TrainConfig& c) {
  return c.checkpoint_dir.empty() ? c.out + "/checkpoints" : c.checkpoint_dir;
}

void prepare_output_dirs(const TrainConfig& c) {
  std::vector<std::pair<std::string, std::string>> dirs = {{"--out", c.out}};
  if (c.use_dcp_checkpointing)
    dirs.emplace_back(c.checkpoint_dir.empty() ? "--out" : "--checkpoint-dir", checkpoint_dir_of(c));
  for (const auto& [flag, dir] : dirs) {
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

void validate(const TrainConfig& c, int64_t world_size) {
  if (const auto steps = trace_steps(c)) {
    DTR_CHECK(steps->second <= c.steps, ValueError, "--trace {}: the run has {} steps (--steps)", c.trace, c.steps);
  }
  DTR_CHECK(c.resume.empty() || c.use_dcp_checkpointing, ValueError,
            "--resume {}: resuming reads distributed checkpoints; add --use-dcp-checkpointing", c.resume);
  DTR_CHECK(c.dim % c.heads == 0, ValueError, "--heads {} does not divide --dim {}; pick heads dividing the width",
            c.heads, c.dim);
  DTR_CHECK(c.vocab <= 65536, ValueError, "--vocab {}: tokens are uint16, so at most 65536", c.vocab);
  const Parallel parallel = parallel_of(c);
  DTR_CHECK(parallel != Parallel::kNone || world_size == 1, ValueError,
            "--parallel none runs one process, but the world has {} ranks; use fsdp, hsdp or ddp", world_size);
  DTR_CHECK(parallel != Parallel::kHsdp || !c.mesh.empty() || (world_size >= 2 && world_size % 2 == 0), ValueError,
            "--parallel hsdp on {} rank(s): its default mesh, replicate=2,shard=WORLD/2, needs an even world of 2 or "
            "more; give --mesh replicate=R,shard=S with R x S = {} (e.g. replicate={},shard=1), or use --parallel fsdp",
            world_size, world_size, world_size);
  const auto dims = mesh_dims(c, world_size);
  int64_t mesh_size = 1;
  for (const auto& [name, size] : dims) mesh_size *= size;
  const std::string mesh_text = c.mesh.empty() ? "(default)" : c.mesh;
  DTR_CHECK(mesh_size == world_size, ValueError, "--mesh {}: its dims hold {} ranks but the world has {}", mesh_text,
            mesh_size, world_size);
  if (parallel == Parallel::kHsdp) {
    DTR_CHECK(dims.size() == 2, ValueError,
              "--mesh {}: --parallel hsdp takes a 2-D mesh, e.g. {} (the world of {} ranks split in two dims)",
              mesh_text,
              world_size % 2 == 0 ? fmt::format("replicate=2,shard={}", world_size / 2)
                                  : fmt::format("replicate={},shard=1", world_size),
              world_size);
  } else {
    DTR_CHECK(dims.size() == 1, ValueError, "--mesh {}: --parallel {} takes a 1-D mesh, e.g. dp={}", mesh_text,
              c.parallel, world_size);
  }
  DTR_CHECK(c.batch_size % c.grad_accum == 0, ValueError,
            "--batch-size {} (global sequences per step) does not split into --grad-accum {} micro-batches",
            c.batch_size, c.grad_accum);
  const int64_t micro = c.batch_size / c.grad_accum;
  DTR_CHECK(micro % world_size == 0, ValueError,
            "--batch-size {} (global sequences per step): each of its {} micro-batches of {} sequences must split "
            "evenly over the {} ranks; use a multiple of {}",
            c.batch_size, c.grad_accum, micro, world_size, c.grad_accum * world_size);
  const std::string& raf = c.reshard_after_forward;
  const int64_t k = parse_count(raf);
  DTR_CHECK(raf == "true" || raf == "false" || k >= 1, ValueError,
            "--reshard-after-forward {}: legal are true, false or a rank count N", raf);
  if (k >= 1) {
    DTR_CHECK(parallel == Parallel::kFsdp && world_size % k == 0, ValueError,
              "--reshard-after-forward {}: a rank count needs --parallel fsdp and must divide the world size {}", raf,
              world_size);
  }
  DTR_CHECK(!c.cpu_offload || parallel == Parallel::kFsdp || parallel == Parallel::kHsdp, ValueError,
            "--cpu-offload: offloading keeps FSDP's shards on the host; use it with --parallel fsdp or hsdp (got {})",
            c.parallel);
  DTR_CHECK(c.prefetch == 0 || parallel == Parallel::kFsdp || parallel == Parallel::kHsdp, ValueError,
            "--prefetch {}: explicit prefetch is FSDP's; use it with --parallel fsdp or hsdp", c.prefetch);
}

nlohmann::json to_json(const TrainConfig& c) {
  const ArchSwitches a = arch_switches(c);
  return {{"dim", c.dim},
          {"layers", c.layers},
          {"heads", c.heads},
          {"vocab", c.vocab},
          {"seq_len", c.seq_len},
          {"arch", c.arch},
          {"causal", a.causal},
          {"pos_embed", a.pos_embed},
          {"final_norm", a.final_norm},
          {"tie_embeddings", a.tie_embeddings},
          {"dropout", c.dropout},
          {"steps", c.steps},
          {"batch_size", c.batch_size},
          {"grad_accum", c.grad_accum},
          {"lr", c.lr},
          {"warmup", c.warmup},
          {"lr_schedule", c.lr_schedule},
          {"weight_decay", c.weight_decay},
          {"grad_clip", c.grad_clip},
          {"seed", c.seed},
          {"init_from", c.init_from},
          {"parallel", c.parallel},
          {"mesh", c.mesh},
          {"mixed_precision", c.mixed_precision},
          {"cpu_offload", c.cpu_offload},
          {"prefetch", c.prefetch},
          {"reshard_after_forward", c.reshard_after_forward},
          {"threads", c.threads},
          {"device", c.device},
          {"timeout_s", c.timeout_s},
          {"data", c.data},
          {"data_order", c.data_order},
          {"tokenizer", c.tokenizer},
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
