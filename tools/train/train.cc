// train: sharded training of a causal language model on CPU ranks or GPUs, the README's main job.
//
//   dtrrun --nproc-per-node 2 bazel-bin/tools/train/train [flags]    (or one process: train [flags])
//
// --device cpu: Gloo groups, tensors in host memory. --device cuda: rank r on cuda:LOCAL_RANK,
// NCCL groups (collectives on their communication streams), the step line adds MFU against
// the GPU's dense peak (tools/train/mfu.h) and the monitoring table the GPU memory per rank.
// Each rank builds the same model from --seed, shards it per --parallel (fully_shard on each
// block and the root, or replicate), reads its rows of every micro-batch (data order:
// tools/train/token_data.h) and steps AdamW. Rank 0 prints the start block, a progress line
// every --log-every steps and the monitoring table at the end, and writes under --out:
// metrics.jsonl (a line per step, every rank's memory), loss.svg (train and validation
// loss), summary.json, config.json (the command line and configuration) and, for BPE, the
// tokenizer. SIGINT (forwarded by dtrrun to every rank) stops all ranks at the same step
// boundary, and the summary so far is printed.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "checkpoint/full_state_dict.h"
#include "checkpoint/full_state_dict_file.h"
#include "checkpoint/safetensors.h"
#include "collectives/collective_counter.h"
#include "collectives/distributed_error.h"
#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/allocator.h"
#include "core/cuda/cuda_device.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/units.h"
#include "dtensor/autograd.h"
#include "dtensor/ops/pointwise.h"
#include "dtensor/ops/view_ops.h"
#include "nn/fully_shard.h"
#include "nn/init.h"
#include "nn/loss.h"
#include "nn/parameter.h"
#include "nn/replicate.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "tools/command_line.h"
#include "tools/launcher/free_port.h"
#include "tools/launcher/self_launch.h"
#include "tools/tool_main.h"
#include "tools/train/loss_plot.h"
#include "tools/train/mfu.h"
#include "tools/train/train_checkpoint.h"
#include "tools/train/train_config.h"
#include "tools/train/train_data.h"
#include "tools/train/train_report.h"
#include "tools/train/train_trace.h"

namespace {

using namespace dtr;
using namespace dtr::train;
using Clock = std::chrono::steady_clock;

std::atomic<int> g_interrupt_signal{0};  // the SIGINT or SIGTERM this rank received, or 0
extern "C" void on_interrupt(int signal) { g_interrupt_signal.store(signal); }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Rank 0's lines; the others stay quiet (dtrrun prefixes every line with its rank).
bool is_rank0() { return default_group()->rank() == 0; }

// This rank's device: the CPU, or cuda:LOCAL_RANK (ValueError, before any group exists,
// when this machine has no such device).
Device training_device(const TrainConfig& c) {
  if (c.device == "cpu") return kCPU;
  const char* env = std::getenv("LOCAL_RANK");
  const int local = env != nullptr && *env != '\0' ? std::atoi(env) : 0;
  const int devices = cuda::device_count();
  DTR_CHECK(
      local<
          devices, ValueError,
          "--device cuda: local rank {} trains on cuda:{}, but this machine has {} CUDA device(s); use --device cpu{}",
          local, local, devices, devices> 0
          ? fmt::format(" or at most {} ranks per node", devices)
          : "");
  return Device(kCUDA, local);
}

// The seed's health check: an all-reduce of ones must give the world size everywhere.
void health_check() {
  const std::shared_ptr<ProcessGroup> group = default_group();
  Tensor ones = Tensor::from_vector<float>({1.0f}).to(group->device());
  group->all_reduce(ones, ReduceOp::kSum).wait();
  const double got = ones.item();
  if (got != group->size()) {
    throw DistributedError(DistributedErrorKind::kBackend,
                           fmt::format("train: health check failed on rank {}: an all-reduce of ones gave {}, not "
                                       "the world size {}",
                                       group->rank(), got, group->size()));
  }
}

// The lr factor of step s (0-based): linear warm-up to 1, then the schedule.
double lr_factor(const TrainConfig& c, int64_t s) {
  if (s < c.warmup) return static_cast<double>(s + 1) / static_cast<double>(c.warmup + 1);
  const double span = static_cast<double>(std::max<int64_t>(1, c.steps - c.warmup));
  const double progress = std::min(1.0, static_cast<double>(s - c.warmup) / span);
  if (c.lr_schedule == "constant") return 1.0;
  if (c.lr_schedule == "linear") return 1.0 - progress;
  return 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * progress));  // cosine to 10%
}

// The model and its parallelism, as --parallel and the rest say.
struct Model {
  std::unique_ptr<nn::Transformer> net;
  std::vector<nn::FSDPModule*> blocks;  // fsdp/hsdp
  nn::FSDPModule* root = nullptr;
  nn::DDPModule* ddp = nullptr;

  void set_gradient_sync(bool sync) {
    if (root != nullptr) root->set_requires_gradient_sync(sync);
    if (ddp != nullptr) ddp->set_requires_gradient_sync(sync);
  }
};

// --init-from: a full state dict (a safetensors file, or Hugging Face's sharded layout in a
// directory) loaded strictly. Names that do not match are counted in one line, with the
// first few, and listed whole in OUT/init_from_mismatch.txt (rank 0 writes it).
void init_from(nn::Module& net, const TrainConfig& c) {
  const bool hf = std::filesystem::is_directory(c.init_from);
  const nn::LoadResult r = hf ? checkpoint::load_hf_checkpoint(net, c.init_from, nn::Strict::kNo)
                              : checkpoint::load_full_state_dict_file(net, c.init_from, nn::Strict::kNo);
  if (r.missing_keys.empty() && r.unexpected_keys.empty()) return;
  const std::filesystem::path list = std::filesystem::path(c.out) / "init_from_mismatch.txt";
  if (is_rank0()) {
    std::ofstream out(list);
    out << "missing keys (the model's, not in " << c.init_from << "):\n";
    for (const std::string& name : r.missing_keys) out << "  " << name << "\n";
    out << "unexpected keys (in " << c.init_from << ", not the model's):\n";
    for (const std::string& name : r.unexpected_keys) out << "  " << name << "\n";
  }
  throw ValueError(fmt::format(
      "--init-from {}: does not match the model (--arch {}, --layers {}): missing keys: {}; unexpected keys: {}; "
      "every name in {}",
      c.init_from, c.arch, c.layers, list_summary(r.missing_keys), list_summary(r.unexpected_keys), list.string()));
}

Model build_model(const TrainConfig& c, int64_t vocab, const DeviceMesh& mesh) {
  const ArchSwitches a = arch_switches(c);
  nn::manual_seed(c.seed);
  Model m;
  const Parallel parallel = parallel_of(c);
  // --parallel none trains on its one-rank mesh directly; the others build on the CPU's and
  // fully_shard / replicate move the parameters to the mesh and its device.
  const nn::ParameterOptions where{.mesh =
                                       parallel == Parallel::kNone ? std::optional<DeviceMesh>(mesh) : std::nullopt};
  m.net = std::make_unique<nn::Transformer>(nn::TransformerConfig{.vocab_size = vocab,
                                                                  .dim = c.dim,
                                                                  .n_layers = c.layers,
                                                                  .n_heads = c.heads,
                                                                  .causal = a.causal,
                                                                  .max_seq_len = a.pos_embed ? c.seq_len : 0,
                                                                  .final_norm = a.final_norm,
                                                                  .tie_embeddings = a.tie_embeddings,
                                                                  .dropout = c.dropout},
                                            where);
  if (c.arch == "gpt") {
    // GPT-2's embedding init: with the output tied to it, PyTorch's N(0, 1) would start
    // from logits of standard deviation sqrt(dim).
    for (auto& [name, p] : m.net->named_parameters()) {
      if (name == "embed.weight" || name == "pos_embed.weight") nn::normal_(*p, 0.0, 0.02);
    }
  }
  if (parallel == Parallel::kDdp) {
    m.ddp = &nn::replicate(*m.net, mesh);
  } else if (parallel == Parallel::kFsdp || parallel == Parallel::kHsdp) {
    nn::FullyShardOptions options;
    if (c.mixed_precision) {
      options.mp_policy.param_dtype = kBFloat16;
      options.mp_policy.reduce_dtype = kFloat32;
    }
    if (c.cpu_offload) options.offload_policy = nn::CPUOffloadPolicy{};
    if (c.reshard_after_forward == "false") options.reshard_after_forward = false;
    if (c.reshard_after_forward != "true" && c.reshard_after_forward != "false") {
      options.reshard_after_forward = std::stoi(c.reshard_after_forward);
    }
    if (parallel == Parallel::kHsdp) options.shard_mesh_dim = mesh.dim_names().back();
    for (size_t i = 0; i < m.net->layers().size(); ++i) {
      m.blocks.push_back(&nn::fully_shard(m.net->layers().at<nn::TransformerBlock>(i), mesh, options));
    }
    options.reshard_after_forward.reset();      // the root keeps its parameters for backward
    options.mp_policy.output_dtype = kFloat32;  // float32 logits for the loss
    m.root = &nn::fully_shard(*m.net, mesh, options);
    if (c.prefetch > 0) nn::set_prefetch_depth(*m.root, m.blocks, c.prefetch);
  }
  if (!c.init_from.empty()) init_from(*m.net, c);
  return m;
}

std::string placements_summary(nn::Transformer& net) {
  std::map<std::string, int64_t> counts;
  for (auto& [name, p] : net.named_parameters()) ++counts[placements_str(p->placements())];
  std::string out;
  for (const auto& [placements, n] : counts) out += fmt::format("{}{} x {}", out.empty() ? "" : ", ", n, placements);
  return out;
}

// The held-out windows each evaluation reads: the first --eval-batches x --batch-size of
// the held-out order, fewer when the held-out set is smaller (each window once), in whole
// micro-batches of the training's size; at least one micro-batch (whose windows then repeat).
int64_t eval_windows(const TrainConfig& c, const WindowOrder& val_order) {
  const int64_t rows = c.batch_size / c.grad_accum;
  const int64_t available = val_order.num_windows() / rows * rows;
  return std::max(rows, std::min(c.eval_batches * c.batch_size, available));
}

// The mean loss over eval_windows() held-out windows, in micro-batches of the training's
// size: the same windows, so the same value (up to rounding), for any --grad-accum.
double evaluate(Model& m, const TrainConfig& c, const TrainData& data, const WindowOrder& val_order,
                const DeviceMesh& mesh, int64_t vocab) {
  const NoGradGuard no_grad;
  m.net->eval();
  const int64_t rows = c.batch_size / c.grad_accum;
  const int64_t batches = eval_windows(c, val_order) / rows;
  double total = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const Batch batch = make_batch(data.val, val_order, b * rows, rows, c.seq_len, mesh);
    total += nn::cross_entropy(reshape((*m.net)(batch.tokens), {rows * c.seq_len, vocab}), batch.targets).item();
  }
  m.net->train();
  return total / static_cast<double>(batches);
}

// Keeps the lines of a metrics file up to `step` (a resumed run redoes the steps after its
// checkpoint; a rank killed mid-write may have left half a line).
void keep_metrics_up_to(const std::filesystem::path& path, int64_t step) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].get<int64_t>() <= step) kept.push_back(line);
  }
  std::ofstream out(path, std::ios::trunc);
  for (const std::string& line : kept) out << line << "\n";
}

// A number as JSON: "nan", "inf" or "-inf" as strings (JSON has no such numbers).
nlohmann::json json_value(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(fmt::format("{}", x));
}

// Ranks x --threads beyond this host's cores make every rank wait on the others' time
// slices at each collective: up to hundreds of times slower, with no error. Rank 0 warns.
void warn_if_oversubscribed(const TrainConfig& c) {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int64_t local_ranks = local != nullptr ? std::max<int64_t>(1, std::atoll(local)) : 1;
  const int64_t cores = std::thread::hardware_concurrency();
  if (!is_rank0() || cores == 0 || c.threads * local_ranks <= cores) return;
  fmt::print(
      "train: warning: --threads {} x {} rank(s) on this host = {} threads on {} cores; oversubscribed ranks run many "
      "times slower (--threads {} fits)\n",
      c.threads, local_ranks, c.threads * local_ranks, cores, std::max<int64_t>(1, cores / local_ranks));
}

struct Record {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0, ms = 0;
  std::optional<double> val_loss;
};

int run(const TrainConfig& c, const std::vector<std::string>& argv) {
  set_default_timeout(std::chrono::seconds(c.timeout_s));
  const Device device = training_device(c);
  init_process_group(device.is_cuda() ? Backend::kNccl : Backend::kGloo);
  set_num_threads(static_cast<int>(c.threads));
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  const std::shared_ptr<ProcessGroup> group = default_group();
  const int64_t world = group->size();
  health_check();
  validate(c, world);
  prepare_output_dirs(c);

  const bool rank0 = is_rank0();
  if (rank0) fmt::print("train: {} ranks, health check passed; loading data\n", world);
  warn_if_oversubscribed(c);
  std::fflush(stdout);
  TrainData data = load_train_data(c);
  check_vocab(c, data.vocab);
  const int64_t vocab = c.vocab > 0 ? c.vocab : data.vocab;

  std::vector<int64_t> shape;
  std::vector<std::string> names;
  for (const auto& [name, size] : mesh_dims(c, world)) {
    names.push_back(name);
    shape.push_back(size);
  }
  // --parallel none: a one-rank mesh of its own.
  const DeviceMesh mesh = parallel_of(c) == Parallel::kNone ? DeviceMesh::row_major(device.type, {1}, {}, 0, 1)
                                                            : init_device_mesh(device.type, shape, names);
  Model m = build_model(c, vocab, mesh);
  optim::AdamW opt({{.params = m.net->parameters(), .lr = c.lr, .weight_decay = c.weight_decay}});
  optim::LambdaLR schedule(opt, [&c](int64_t s) { return lr_factor(c, s); });

  RunPosition start_at;
  std::string resumed_from;
  if (c.use_dcp_checkpointing && !c.resume.empty()) {
    resumed_from = resume_path(c.resume, checkpoint_dir_of(c));
    if (!resumed_from.empty()) {
      start_at = load_checkpoint(resumed_from, *m.net, opt);
      for (int64_t s = 0; s < start_at.step; ++s) schedule.step();
    }
  }
  const WindowOrder train_order(static_cast<int64_t>(data.train.size()), c.seq_len, data_order_of(c), c.seed);
  const WindowOrder val_order(static_cast<int64_t>(data.val.size()), c.seq_len, DataOrder::kSequential, c.seed);
  const double param_bytes = parameter_bytes(m.net->parameters());
  int64_t n_params = 0;
  for (auto& [name, p] : m.net->named_parameters()) n_params += p->numel();
  const double flops_per_token = model_flops_per_token(n_params, c.layers, c.dim, c.seq_len);
  const std::string gpu = device.is_cuda() ? cuda::device_description(device.index) : "";
  const DType compute = c.mixed_precision ? kBFloat16 : kFloat32;
  const std::optional<double> peak = device.is_cuda() ? dense_peak_tflops(gpu, compute) : std::nullopt;

  if (rank0) {
    nlohmann::json config = {{"command", argv}, {"world_size", world}, {"vocab", vocab}, {"config", to_json(c)}};
    std::ofstream(std::filesystem::path(c.out) / "config.json") << config.dump(2) << "\n";
    if (data.tokenizer && data.tokenizer->kind() == "bpe") {
      data.tokenizer->save((std::filesystem::path(c.out) / "tokenizer.json").string());
    }
    fmt::print("world      {} ranks ({}), {} thread(s) each\n", world,
               device.is_cuda() ? "nccl, one GPU each" : "gloo over TCP", c.threads);
    if (device.is_cuda()) {
      fmt::print("device     {} (rank 0): {}\n", device.str(), gpu);
      fmt::print("mfu        {:.3g} GFLOP per token against {}\n", flops_per_token / 1e9,
                 peak ? fmt::format("a dense {} peak of {:.0f} TFLOP/s", dtype_name(compute), *peak)
                      : std::string("no peak (this GPU is not in tools/train/mfu.cc's table): MFU not shown"));
    }
    fmt::print("mesh       {}\n", mesh.to_string());
    fmt::print("parallel   {}{}{}\n", c.parallel, c.mixed_precision ? ", bf16 parameters, float32 reduction" : "",
               c.cpu_offload ? ", shards, gradients and AdamW state offloaded to the host" : "");
    fmt::print("model      {} ({} layers, dim {}, {} heads, vocab {}, seq {}): {} parameters\n", c.arch, c.layers,
               c.dim, c.heads, vocab, c.seq_len, n_params);
    fmt::print("placements {}\n", placements_summary(*m.net));
    fmt::print("data       {}: {} train / {} held-out tokens, {} order; tokenizer {}\n", data.source, data.train.size(),
               data.val.size(), c.data_order, data.tokenizer ? data.tokenizer->kind() : "(ids)");
    fmt::print("batch      {} sequences x {} tokens per step ({} micro-batch(es) of {}; {} per rank)\n", c.batch_size,
               c.seq_len, c.grad_accum, c.batch_size / c.grad_accum, c.batch_size / c.grad_accum / world);
    if (c.eval_every > 0) {
      const int64_t windows = eval_windows(c, val_order), wanted = c.eval_batches * c.batch_size;
      fmt::print("eval       every {} steps: {} held-out windows{}\n", c.eval_every, windows,
                 windows == wanted ? fmt::format(" (--eval-batches {} x --batch-size {})", c.eval_batches, c.batch_size)
                 : windows <= val_order.num_windows()
                     ? fmt::format(", all the held-out set has in whole micro-batches (--eval-batches {} x "
                                   "--batch-size {} asked for {})",
                                   c.eval_batches, c.batch_size, wanted)
                     : fmt::format(": one micro-batch, but the held-out set has only {}, so they repeat",
                                   val_order.num_windows()));
    }
    fmt::print("per rank   parameters {:.2f} MiB, gradients {:.2f} MiB, AdamW state {:.2f} MiB (rank 0{})\n",
               mib(param_bytes), mib(param_bytes), mib(2 * param_bytes), c.cpu_offload ? ", in host memory" : "");
    if (!resumed_from.empty()) {
      fmt::print("resumed    from {}: step {}, data window {}\n", resumed_from, start_at.step, start_at.window);
    }
    std::fflush(stdout);
  }

  std::ofstream metrics;
  // A resumed run goes on writing the run's metrics (lines carry their step).
  if (rank0) {
    const std::filesystem::path path = std::filesystem::path(c.out) / "metrics.jsonl";
    if (!resumed_from.empty()) keep_metrics_up_to(path, start_at.step);
    metrics.open(path, resumed_from.empty() ? std::ios::trunc : std::ios::app);
  }
  std::vector<Record> records;
  const int64_t micro_rows = c.batch_size / c.grad_accum;
  const double tokens_per_step = static_cast<double>(c.batch_size * c.seq_len);
  reset_peak_memory_stats(kCPU);
  if (device.is_cuda()) reset_peak_memory_stats(device);
  collective_counter().reset();
  const auto start = Clock::now();
  auto last_line = start;
  std::optional<Checkpointer> checkpoints;
  if (c.use_dcp_checkpointing) checkpoints.emplace(checkpoint_dir_of(c), c.keep_last);
  int64_t step = start_at.step;
  int64_t window = start_at.window;  // the data position: the next window of the order
  bool stopped = false;
  std::optional<Record> diverged;  // the step whose loss or gradient norm was not finite
  double grad_bytes = 0;           // the last step's gradients
  StepTracer tracer(*group, trace_steps(c), c.out);
  double comm_s = 0, exposed_s = 0;
  for (; step < c.steps; ++step) {
    const auto t0 = Clock::now();
    tracer.begin(step + 1);
    double loss_sum = 0;
    for (int64_t micro = 0; micro < c.grad_accum; ++micro) {
      m.set_gradient_sync(micro + 1 == c.grad_accum);
      const Batch batch = [&] {
        const trace::Span span("batch", trace::Category::kData);
        return make_batch(data.train, train_order, window, micro_rows, c.seq_len, mesh);
      }();
      window += micro_rows;
      DTensor loss = nn::cross_entropy(reshape((*m.net)(batch.tokens), {micro_rows * c.seq_len, vocab}), batch.targets);
      if (c.grad_accum > 1) loss = div(loss, static_cast<double>(c.grad_accum));
      loss.backward();
      loss_sum += loss.item();
    }
    const double norm = c.grad_clip > 0 ? optim::clip_grad_norm_(m.net->parameters(), c.grad_clip)
                                        : optim::clip_grad_norm_(m.net->parameters(), INFINITY);
    // Both are global reductions, the same on every rank, so every rank stops here together,
    // before the optimizer step and any checkpoint of this state.
    if (!std::isfinite(loss_sum) || !std::isfinite(norm)) {
      tracer.end();
      diverged = {.step = step + 1, .loss = loss_sum, .grad_norm = norm};
      break;
    }
    const double lr = opt.param_groups()[0].lr;
    grad_bytes = gradient_bytes(m.net->parameters());
    opt.step();
    schedule.step();
    opt.zero_grad();
    // Every rank's peak memory, whether any was interrupted and whether any is still writing
    // its part of the checkpoint in flight, in one small all-reduce.
    std::vector<double> shared(static_cast<size_t>(world + 2), 0.0);
    shared[static_cast<size_t>(group->rank())] = static_cast<double>(memory_stats(device).peak_bytes);
    shared[static_cast<size_t>(world)] = g_interrupt_signal.load() != 0 ? 1 : 0;
    shared[static_cast<size_t>(world + 1)] = checkpoints && !checkpoints->written() ? 1 : 0;
    Tensor t = Tensor::from_vector<double>(shared).to(group->device());
    group->all_reduce(t, ReduceOp::kSum).wait();
    t = t.to(kCPU);
    const double* v = t.data_ptr<double>();
    const trace::StepComm comm = tracer.end();
    comm_s += comm.time.total_us / 1e6;
    exposed_s += comm.time.exposed_us / 1e6;
    Record r{
        .step = step + 1, .loss = loss_sum, .grad_norm = norm, .lr = lr, .ms = seconds_since(t0) * 1e3, .val_loss = {}};
    if (c.eval_every > 0 && ((step + 1) % c.eval_every == 0 || step + 1 == c.steps)) {
      r.val_loss = evaluate(m, c, data, val_order, mesh, vocab);
    }
    records.push_back(r);
    if (rank0) {
      nlohmann::json line = {
          {"step", r.step},
          {"loss", r.loss},
          {"grad_norm", r.grad_norm},
          {"lr", r.lr},
          {"ms", r.ms},
          {"tokens_per_s", tokens_per_step / (r.ms / 1e3)},
          {"mfu", peak ? nlohmann::json(mfu(tokens_per_step / world / (r.ms / 1e3), flops_per_token, *peak))
                       : nlohmann::json(nullptr)},
          {"peak_bytes", std::vector<double>(v, v + world)},
          {"comm", trace::to_json(comm)}};
      if (r.val_loss) line["val_loss"] = *r.val_loss;
      metrics << line.dump() << std::endl;  // flushed: a killed run keeps its lines
      const double elapsed = seconds_since(start);
      if ((step + 1) % c.log_every == 0 || step == start_at.step || step + 1 == c.steps || r.val_loss ||
          seconds_since(last_line) > 5) {
        const double per_step = elapsed / static_cast<double>(step + 1 - start_at.step);
        double peak_bytes = 0;
        for (int64_t k = 0; k < world; ++k) peak_bytes = std::max(peak_bytes, v[k]);
        fmt::print(
            "step {:>{}}/{} | loss {:.4f}{} | grad norm {:.3f} | lr {:.2e} | {:.0f} ms/step | {:.0f} tokens/s{} "
            "| comm {:.0f}% | peak {:.1f} MiB/rank | ETA {}\n",
            step + 1, std::to_string(c.steps).size(), c.steps, r.loss,
            r.val_loss ? fmt::format(" | val {:.4f}", *r.val_loss) : "", r.grad_norm, r.lr, r.ms,
            tokens_per_step / (r.ms / 1e3),
            peak ? fmt::format(" | MFU {:.1f}%",
                               100 * mfu(tokens_per_step / world / (r.ms / 1e3), flops_per_token, *peak))
                 : "",
            100 * comm.exposed_share(), mib(peak_bytes), format_seconds(per_step * (c.steps - step - 1)));
        std::fflush(stdout);
        last_line = Clock::now();
      }
    }
    // Every rank's write has ended: commit now, so a crash loses only the steps after it.
    if (checkpoints && v[world + 1] == 0) checkpoints->commit();
    const bool stop = v[world] > 0;
    if (c.use_dcp_checkpointing &&
        (stop || step + 1 == c.steps || (c.checkpoint_every > 0 && (step + 1) % c.checkpoint_every == 0))) {
      checkpoints->save({.step = step + 1, .window = window}, *m.net, opt);
      if (rank0)
        fmt::print("checkpoint {} (writing in the background)\n", checkpoint_path(checkpoint_dir_of(c), step + 1));
    }
    if (stop) {
      stopped = true;
      ++step;
      break;
    }
  }
  const int64_t steps_run = step - start_at.step;
  if (checkpoints) checkpoints->commit();  // the last save committed before the run ends
  const double train_s = seconds_since(start);

  RankFigures mine{.param_bytes = param_bytes,
                   .grad_bytes = grad_bytes,
                   .optim_bytes = optimizer_state_bytes(opt),
                   .peak_bytes = static_cast<double>(memory_stats(device).peak_bytes),
                   .host_peak_bytes = static_cast<double>(memory_stats(kCPU).peak_bytes),
                   .device_in_use_bytes = device.is_cuda() ? static_cast<double>(memory_stats(device).bytes_in_use) : 0,
                   .device_reserved_bytes = device.is_cuda() ? static_cast<double>(memory_stats(device).bytes_in_use +
                                                                                   memory_stats(device).bytes_cached)
                                                             : 0,
                   .comm_s = comm_s,
                   .exposed_s = exposed_s,
                   .train_s = train_s,
                   .tokens = tokens_per_step * static_cast<double>(steps_run) / static_cast<double>(world)};
  const std::vector<RankFigures> ranks = gather_rank_figures(mine);
  const std::string merged_trace = tracer.write(fmt::format("dtr train: {} on {} ranks", c.parallel, world));
  if (!merged_trace.empty()) {
    fmt::print("\nwrote the trace of steps {}: {} (every rank; open in ui.perfetto.dev) and {}/trace/rank<R>.json\n",
               c.trace, merged_trace, c.out);
  }
  if (rank0) {
    if (stopped) fmt::print("train: interrupted; stopped after step {} on every rank\n", step);
    if (diverged) {
      fmt::print(
          "train: step {}: the {} is not finite (loss {}, gradient norm {}); stopped on every rank before the "
          "optimizer step, and no checkpoint holds this step (try a lower --lr, --grad-clip or a longer "
          "--warmup)\n",
          diverged->step, std::isfinite(diverged->loss) ? "gradient norm" : "loss", diverged->loss,
          diverged->grad_norm);
    }
    fmt::print("\n{}", monitoring_table(ranks));
    std::vector<std::pair<double, double>> train_curve, val_curve;
    for (const Record& r : records) {
      train_curve.emplace_back(static_cast<double>(r.step), r.loss);
      if (r.val_loss) val_curve.emplace_back(static_cast<double>(r.step), *r.val_loss);
    }
    const std::filesystem::path out(c.out);
    write_loss_plot(
        (out / "loss.svg").string(),
        {{.label = "train", .color = "#1f77b4", .points = train_curve},
         {.label = "validation", .color = "#d62728", .points = val_curve}},
        {.title = fmt::format("dtr train: {} on {} ranks", c.parallel, world), .x_label = "step", .y_label = "loss"});
    nlohmann::json summary = {
        {"steps", step},
        {"interrupted", stopped},
        {"diverged", diverged ? nlohmann::json{{"step", diverged->step},
                                               {"loss", json_value(diverged->loss)},
                                               {"grad_norm", json_value(diverged->grad_norm)}}
                              : nlohmann::json(nullptr)},
        {"train_s", train_s},
        {"tokens_per_s", tokens_per_step * static_cast<double>(steps_run) / train_s},
        {"mfu", peak ? nlohmann::json(mfu(tokens_per_step * static_cast<double>(steps_run) / train_s / world,
                                          flops_per_token, *peak))
                     : nlohmann::json(nullptr)},
        {"resumed_from", resumed_from},
        {"first_loss", records.empty() ? 0.0 : records.front().loss},
        {"final_loss", records.empty() ? 0.0 : records.back().loss},
        {"ranks", nlohmann::json::array()}};
    for (const Record& r : records) {
      if (r.val_loss) summary["final_val_loss"] = *r.val_loss;
    }
    for (const RankFigures& f : ranks) summary["ranks"].push_back(to_json(f));
    std::ofstream(out / "summary.json") << summary.dump(2) << "\n";
    fmt::print("\nwrote {}/metrics.jsonl, {}/loss.svg, {}/summary.json, {}/config.json\n", c.out, c.out, c.out, c.out);
  }
  destroy_process_group();
  if (diverged) return 1;
  if (!stopped) return 0;
  // 128 + the signal, as dtrrun and shells report it (a rank stopped by another's: SIGINT's).
  const int signal = g_interrupt_signal.load();
  return 128 + (signal != 0 ? signal : SIGINT);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dtr train: sharded training of a causal language model on CPU ranks or GPUs.\n"
      "Run N ranks with: dtrrun --nproc-per-node N train [flags]; without dtrrun it runs as one process."};
  TrainConfig config;
  add_train_flags(app, config);
  if (const std::optional<int> exit_code = parse_command_line("train", app, argc, argv)) return *exit_code;
  const std::vector<std::string> args(argv, argv + argc);
  return tool_main("train", [&] {
    if (!launcher::is_rank_process()) {  // one process: a world of one on a free local port
      setenv("RANK", "0", 1);
      setenv("LOCAL_RANK", "0", 1);
      setenv("WORLD_SIZE", "1", 1);
      setenv("LOCAL_WORLD_SIZE", "1", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(launcher::find_free_port("127.0.0.1")).c_str(), 1);
    }
    return run(config, args);
  });
}
