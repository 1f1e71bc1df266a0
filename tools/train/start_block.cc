#include "tools/train/start_block.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/cuda/cuda_device.h"
#include "core/units.h"
#include "tools/train/evaluate.h"
#include "tools/train/train_model.h"
#include "tools/train/train_report.h"

namespace dtr::train {

void write_run_config(const TrainConfig& c, const std::vector<std::string>& argv, int64_t world, int64_t vocab,
                      const TrainData& data) {
  nlohmann::json config = {{"command", argv}, {"world_size", world}, {"vocab", vocab}, {"config", to_json(c)}};
  std::ofstream(std::filesystem::path(c.out) / "config.json") << config.dump(2) << "\n";
  if (data.tokenizer && data.tokenizer->kind() == "bpe") {
    data.tokenizer->save((std::filesystem::path(c.out) / "tokenizer.json").string());
  }
}

void print_start_block(const TrainConfig& c, const Device& device, const DeviceMesh& mesh, nn::Transformer& net,
                       const TrainData& data, int64_t vocab, const WindowOrder& val_order, const Throughput& t,
                       const std::string& resumed_from, const RunPosition& start_at) {
  const int64_t world = t.world;
  fmt::print("world      {} ranks ({}), {} thread(s) each\n", world,
             device.is_cuda() ? "nccl, one GPU each" : "gloo over TCP", c.threads);
  if (device.is_cuda()) {
    fmt::print("device     {} (rank 0): {}\n", device.str(), cuda::device_description(device.index));
    fmt::print("mfu        {:.3g} GFLOP per token against {}\n", t.flops_per_token / 1e9,
               t.peak_tflops
                   ? fmt::format("a dense {} peak of {:.0f} TFLOP/s", dtype_name(compute_dtype(c)), *t.peak_tflops)
                   : std::string("no peak (this GPU is not in tools/train/mfu.cc's table): MFU not shown"));
  }
  fmt::print("mesh       {}\n", mesh.to_string());
  const std::string tensor_parallel = c.tp == 1 ? ""
                                                : fmt::format(", tensor parallel over {} ranks{}{}", c.tp,
                                                              c.sequence_parallel ? ", sequence parallel" : "",
                                                              c.loss_parallel ? ", loss parallel" : "");
  fmt::print("parallel   {}{}{}{}{}\n", flag_value(c.parallel), tensor_parallel,
             c.mixed_precision ? (c.deterministic ? ", bf16 parameters and reduction (--deterministic)"
                                                  : ", bf16 parameters, float32 reduction")
                               : "",
             c.cpu_offload ? ", shards, gradients and AdamW state offloaded to the host" : "",
             c.activation_checkpoint != ActivationCheckpoint::kNone
                 ? fmt::format(", {} activation checkpointing of every {} block(s)",
                               flag_value(c.activation_checkpoint), c.ac_every)
                 : "");
  fmt::print("model      {} ({} layers, dim {}, {} heads, vocab {}, seq {}): {} parameters\n", flag_value(c.arch),
             c.layers, c.dim, c.heads, vocab, c.seq_len, parameter_count(net));
  fmt::print("placements {}\n", placements_summary(net, mesh));
  fmt::print("data       {}: {} train / {} held-out tokens, {} order; tokenizer {}\n", data.source, data.train.size(),
             data.val.size(), flag_value(c.data_order), data.tokenizer ? data.tokenizer->kind() : "(ids)");
  const int64_t data_ranks = world / c.tp;
  const std::vector<MicroBatch> micros = micro_batches(c, data_ranks);
  std::string nodes;  // --deterministic's split of each micro-batch into nodes of its tree
  for (const MicroBatch& m : micros) nodes += fmt::format("{}{}", nodes.empty() ? "" : ", ", m.rows);
  const std::string split =
      rank_major_micro_batches(c, data_ranks)
          ? fmt::format("; --deterministic runs each rank's {} as {} rank-major micro-batch(es) of {}{}",
                        c.batch_size / data_ranks, micros.size(), micros.front().rows / data_ranks,
                        rank_shares_are_node_lists(c, data_ranks) ? ", reduced as lists of the tree's nodes" : "")
      : static_cast<int64_t>(micros.size()) == c.grad_accum
          ? ""
          : fmt::format("; --deterministic runs them as the canonical tree's nodes of {} sequences", nodes);
  fmt::print("batch      {} sequences x {} tokens per step ({} micro-batch(es) of {}; {} per rank){}\n", c.batch_size,
             c.seq_len, c.grad_accum, c.batch_size / c.grad_accum, c.batch_size / c.grad_accum / data_ranks, split);
  if (c.eval_every > 0) {
    const int64_t windows = eval_windows(c, val_order), wanted = c.eval_batches * c.batch_size;
    const char* unit = c.deterministic ? "batch" : "micro-batch";  // what one held-out batch is (evaluate.h)
    fmt::print(
        "eval       every {} steps: {} held-out windows{}\n", c.eval_every, windows,
        windows == wanted ? fmt::format(" (--eval-batches {} x --batch-size {})", c.eval_batches, c.batch_size)
        : windows <= val_order.num_windows()
            ? fmt::format(", all the held-out set has in whole {}es (--eval-batches {} x --batch-size {} "
                          "asked for {})",
                          unit, c.eval_batches, c.batch_size, wanted)
            : fmt::format(": one {}, but the held-out set has only {}, so they repeat", unit, val_order.num_windows()));
  }
  const double param_bytes = parameter_bytes(net.parameters());
  fmt::print("per rank   parameters {:.2f} MiB, gradients {:.2f} MiB, AdamW state {:.2f} MiB (rank 0{})\n",
             mib(param_bytes), mib(param_bytes), mib(2 * param_bytes), c.cpu_offload ? ", in host memory" : "");
  if (!resumed_from.empty()) {
    fmt::print("resumed    from {}: step {}, data window {}\n", resumed_from, start_at.step, start_at.window);
  }
  std::fflush(stdout);
}

}  // namespace dtr::train
