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
// boundary, and the summary so far is printed. The pieces: train_model.h (the model),
// lr_schedule.h, start_block.h, train_step.h (one step), evaluate.h, step_log.h,
// train_checkpoint.h and run_summary.h.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collective_counter.h"
#include "collectives/distributed_error.h"
#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/allocator.h"
#include "core/cuda/cuda_device.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/block_reduce.h"
#include "nn/comm_debug.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "tools/command_line.h"
#include "tools/launcher/free_port.h"
#include "tools/launcher/self_launch.h"
#include "tools/tool_main.h"
#include "tools/train/evaluate.h"
#include "tools/train/lr_schedule.h"
#include "tools/train/run_lock.h"
#include "tools/train/run_summary.h"
#include "tools/train/start_block.h"
#include "tools/train/state_digest.h"
#include "tools/train/step_log.h"
#include "tools/train/train_checkpoint.h"
#include "tools/train/train_config.h"
#include "tools/train/train_data.h"
#include "tools/train/train_model.h"
#include "tools/train/train_report.h"
#include "tools/train/train_step.h"
#include "tools/train/train_trace.h"

namespace {

using namespace dtr;
using namespace dtr::train;
using Clock = std::chrono::steady_clock;

std::atomic<int> g_interrupt_signal{0};  // the SIGINT or SIGTERM this rank received, or 0
std::atomic<bool> g_stepping{false};     // whether the set-up is done (the log and the steps)
// Once the set-up is done, the first SIGINT or SIGTERM stops the run at the next step
// boundary, with a checkpoint and the summary; before (nothing to save: data, model,
// optimizer and checkpoint being loaded) and at a second signal, the signal's default
// action ends the process at once.
extern "C" void on_interrupt(int signal) {
  if (g_stepping.load() && g_interrupt_signal.exchange(signal) == 0) return;
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Rank 0's lines; the others stay quiet (dtrrun prefixes every line with its rank).
bool is_rank0() { return default_group()->rank() == 0; }

// This rank's device: the CPU, or cuda:LOCAL_RANK (ValueError, before any group exists,
// when this machine has no such device).
Device training_device(const TrainConfig& c) {
  if (c.device == kCPU) return kCPU;
  const char* env = std::getenv("LOCAL_RANK");
  const int local = env != nullptr && *env != '\0' ? std::atoi(env) : 0;
  const int devices = cuda::device_count();
  const std::string fewer = devices > 0 ? fmt::format(" or at most {} ranks per node", devices) : "";
  DTR_CHECK(
      local < devices, ValueError,
      "--device cuda: local rank {} trains on cuda:{}, but this machine has {} CUDA device(s); use --device cpu{}",
      local, local, devices, fewer);
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

// This rank's run: the set-up (process group, health check, flags, data, mesh, model, AdamW,
// its schedule and a checkpoint to resume), the start block, the steps with their log,
// validation losses and checkpoints, then the summary. Returns the exit code: 0; 1 after a
// diverged step; 128 + the signal when interrupted.
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
  const RunLock lock(c, *group);
  if (c.deterministic) {
    set_deterministic_block_tokens(c.seq_len);  // a block is one sequence
    set_deterministic_feature_blocks(c.feature_blocks);
  }

  const bool rank0 = is_rank0();
  if (rank0) fmt::print("train: {} ranks, health check passed; loading data\n", world);
  warn_if_oversubscribed(c);
  std::fflush(stdout);
  TrainData data = load_train_data(c);
  check_vocab(c, data.vocab);
  const int64_t vocab = c.vocab > 0 ? c.vocab : data.vocab;
  // Before the model, so that a --seq-len the data cannot fill is one line, not an allocation
  // of its position table.
  const WindowOrder train_order(static_cast<int64_t>(data.train.size()), c.seq_len, c.data_order, c.seed, "training");
  const WindowOrder val_order(static_cast<int64_t>(data.val.size()), c.seq_len, DataOrder::kSequential, c.seed,
                              "held-out");
  const DeviceMesh mesh = training_mesh(c, device.type, world);
  Model m = build_model(c, vocab, mesh);
  optim::AdamW opt({{.params = m.net->parameters(), .lr = c.lr, .weight_decay = c.weight_decay}});
  optim::WarmupDecayLR schedule = make_lr_schedule(opt, c);

  RunPosition start_at;
  std::string resumed_from;
  if (c.use_dcp_checkpointing && !c.resume.empty()) {
    resumed_from = resume_path(c.resume, checkpoint_dir_of(c));
    if (!resumed_from.empty()) {
      start_at = load_checkpoint(resumed_from, *m.net, opt, model_flags(c, vocab));
      DTR_CHECK(start_at.step <= c.steps, ValueError,
                "--steps {}: {} is at step {}, past the run's end; give --steps {} or more to go on", c.steps,
                resumed_from, start_at.step, start_at.step);
      if (start_at.step == c.steps) {  // a finished run started again (a restart, say): nothing moves
        if (rank0) fmt::print("train: {} is at step {}, --steps: nothing to train\n", resumed_from, start_at.step);
        return 0;
      }
      for (int64_t s = 0; s < start_at.step; ++s) schedule.step();
      if (rank0) set_aside_later_checkpoints(checkpoint_dir_of(c), start_at.step);
    }
  }
  if (c.use_dcp_checkpointing && resumed_from.empty()) {
    check_no_earlier_checkpoints(checkpoint_dir_of(c), checkpoint_dir_flag(c));
  }
  // From here a signal stops the run at a step boundary: what follows rewrites metrics.jsonl
  // (a resumed run keeps its lines up to the step), which must not be cut short.
  g_stepping.store(true);
  const Throughput throughput = run_throughput(c, device, world, parameter_count(*m.net));
  const double param_bytes = parameter_bytes(m.net->parameters());
  std::optional<StepLog> log;
  if (rank0) {
    write_run_config(c, argv, world, vocab, data);
    print_start_block(c, device, mesh, *m.net, data, vocab, val_order, throughput, resumed_from, start_at);
    log.emplace(c, throughput, resumed_from, start_at.step);
  }

  std::vector<StepRecord> records;
  reset_peak_memory_stats(kCPU);
  if (device.is_cuda()) reset_peak_memory_stats(device);
  collective_counter().reset();
  const auto start = Clock::now();
  std::optional<Checkpointer> checkpoints;
  if (c.use_dcp_checkpointing) checkpoints.emplace(checkpoint_dir_of(c), c.keep_last, model_flags(c, vocab));
  int64_t step = start_at.step;
  int64_t window = start_at.window;  // the data position: the next window of the order
  bool stopped = false;
  std::optional<StepRecord> diverged;  // the step whose loss or gradient norm was not finite
  double grad_bytes = 0;               // the last step's gradients
  StepTracer tracer(*group, trace_steps(c), c.out);
  double comm_s = 0, exposed_s = 0;
  for (; step < c.steps; ++step) {
    const auto t0 = Clock::now();
    tracer.begin(step + 1);
    std::optional<nn::CommDebugMode> comm_debug;
    if (step + 1 == c.comm_debug) comm_debug.emplace(*m.net);
    const StepResult result = train_step(m, opt, schedule, c, data.train, train_order, mesh, window);
    if (comm_debug && rank0) fmt::print("comm-debug: step {}\n{}", step + 1, comm_debug->table());
    if (!result.finite()) {
      tracer.end();
      diverged = StepRecord{.step = step + 1, .loss = result.loss, .grad_norm = result.grad_norm, .val_loss = {}};
      break;
    }
    grad_bytes = result.grad_bytes;
    const StepAgreement agreed = agree_after_step(
        *group, device,
        {.interrupted = g_interrupt_signal.load() != 0, .writing_checkpoint = checkpoints && !checkpoints->written()});
    const trace::StepComm comm = tracer.end();
    comm_s += comm.time.total_us / 1e6;
    exposed_s += comm.time.exposed_us / 1e6;
    StepRecord r{.step = step + 1,
                 .loss = result.loss,
                 .grad_norm = result.grad_norm,
                 .lr = result.lr,
                 .ms = seconds_since(t0) * 1e3,
                 .val_loss = {}};
    if (c.eval_every > 0 && ((step + 1) % c.eval_every == 0 || step + 1 == c.steps)) {
      r.val_loss = evaluate(m, c, data, val_order, mesh);
    }
    records.push_back(r);
    if (log) log->write(r, agreed.peak_bytes, comm);
    // Every rank's write has ended: commit now, so a crash loses only the steps after it.
    if (checkpoints && agreed.checkpoint_written) checkpoints->commit();
    if (c.use_dcp_checkpointing &&
        (agreed.stop || step + 1 == c.steps || (c.checkpoint_every > 0 && (step + 1) % c.checkpoint_every == 0))) {
      checkpoints->save({.step = step + 1, .window = window}, *m.net, opt);
      if (rank0)
        fmt::print("checkpoint {} (writing in the background)\n", checkpoint_path(checkpoint_dir_of(c), step + 1));
    }
    if (agreed.stop) {
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
                   .tokens = throughput.tokens_per_step * static_cast<double>(steps_run) / static_cast<double>(world)};
  const std::vector<RankFigures> ranks = gather_rank_figures(mine);
  const std::string merged_trace =
      tracer.write(fmt::format("dtr train: {} on {} ranks", flag_value(c.parallel), world));
  std::optional<uint64_t> digest;
  if (c.deterministic) digest = state_digest(*m.net, opt);
  if (rank0) {
    write_summary(c, throughput, records,
                  {.steps = step,
                   .steps_run = steps_run,
                   .train_s = train_s,
                   .interrupted = stopped,
                   .diverged = diverged,
                   .resumed_from = resumed_from,
                   .merged_trace = merged_trace,
                   .state_digest = digest},
                  ranks);
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
