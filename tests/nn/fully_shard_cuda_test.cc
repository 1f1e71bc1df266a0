// fully_shard on GPUs, two ranks with NCCL (one GPU each): five AdamW steps of a causal
// Transformer sharded per block and at the root, with implicit prefetch, give the one-rank
// CPU run's losses; each block's gathered parameters are freed by its post-forward (the
// device allocator's bytes in use fall); and a traced step, timed on the device (NCCL's
// stream and the compute stream's waits: cuda::DeviceSpan), shows a block's prefetched
// all-gather running behind the compute before it. Tagged gpu and multi_gpu: it fails,
// never passes, with fewer than two GPUs. CPU offload: on one GPU, the shards, gradients
// and AdamW state stay in pinned host memory, the device holds no parameter between steps,
// the losses are the CPU run's (bf16 compute: within 2%) and loaded weights return to the
// host; on two, with gradient clipping and a full state dict (collectives on host shards
// go through the device), the CPU run's losses, norms and weights.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "checkpoint/full_state_dict.h"
#include "collectives/init.h"
#include "core/allocator.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/stream.h"
#include "core/trace.h"
#include "dtensor/autograd.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/random.h"
#include "nn/fully_shard.h"
#include "nn/init.h"
#include "nn/loss.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"
#include "tools/trace/chrome_trace.h"
#include "tools/trace/comm_accounting.h"

namespace dtr::nn {
namespace {

using checkpoint::full_state_dict;
using checkpoint::load_full_state_dict;

constexpr int64_t kVocab = 128, kSeq = 16, kBatch = 4, kSteps = 5;

// Parameters dominate a block's memory at this size (12 * 256^2 floats against a few KiB
// of activations per block), so releasing the gathered ones shows in the allocator.
TransformerConfig config() {
  return {.vocab_size = kVocab, .dim = 256, .n_layers = 3, .n_heads = 4, .causal = true, .max_seq_len = kSeq};
}

// The case fails (never passes) on a machine with fewer GPUs than it needs.
void require_gpus(int needed) {
  INFO("this machine has " << cuda::device_count() << " CUDA device(s)");
  REQUIRE(cuda::device_count() >= needed);
}

// The step's tokens, the same on every rank and device (drawn on the host).
Tensor batch_ids() {
  Tensor u = Tensor::empty({kBatch, kSeq + 1}, kFloat64);
  uniform_(u, 0, kVocab - 0.5, 11);
  return u.to(kInt64);
}

// What kSteps of training give: each step's loss and, when clipping, total gradient norm.
struct Run {
  std::vector<double> losses, norms;
};

// One step on `mesh`, the batch sharded over it (gradients clipped to max_norm when given).
void step(Run& run, Transformer& model, optim::AdamW& opt, const DeviceMesh& mesh, const Tensor& ids,
          std::optional<double> max_norm = std::nullopt) {
  const Tensor on_device = ids.to(mesh.device());
  const DTensor x = distribute_tensor(on_device.narrow(1, 0, kSeq).contiguous(), mesh, {Shard(0)});
  const DTensor y =
      reshape(distribute_tensor(on_device.narrow(1, 1, kSeq).contiguous(), mesh, {Shard(0)}), {kBatch * kSeq});
  opt.zero_grad();
  const DTensor loss = cross_entropy(reshape(model(x), {kBatch * kSeq, kVocab}), y);
  loss.backward();
  if (max_norm) run.norms.push_back(optim::clip_grad_norm_(model.parameters(), *max_norm));
  opt.step();
  run.losses.push_back(loss.item());
}

// kSteps of the unsharded model on this rank's CPU, on the whole batch; its final weights
// in `weights` when given.
Run cpu_reference(const Tensor& ids, std::optional<double> max_norm = std::nullopt, TensorMap* weights = nullptr) {
  const DeviceMesh cpu = single_rank_mesh();
  manual_seed(3);
  Transformer model(config());
  optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
  Run run;
  for (int64_t s = 0; s < kSteps; ++s) step(run, model, opt, cpu, ids, max_norm);
  if (weights != nullptr) *weights = full_state_dict(model);
  return run;
}

// The model sharded per block and at the root on `mesh` with CPU offload.
void shard_offloaded(Transformer& model, const DeviceMesh& mesh, const MixedPrecisionPolicy& mp = {}) {
  const FullyShardOptions options{.mp_policy = mp, .offload_policy = CPUOffloadPolicy{}};
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers().at<TransformerBlock>(i), mesh, options);
  fully_shard(model, mesh, options);
}

// Every parameter, its gradient (when it has one) and its AdamW state on pinned host memory.
void check_on_host(Transformer& model, const optim::AdamW& opt) {
  for (auto& [name, p] : model.named_parameters()) {
    INFO(name);
    CHECK(p->to_local().is_pinned());
    if (p->grad().defined()) CHECK(p->grad().to_local().device() == Device(kCPU));
  }
  for (const auto& [index, state] : opt.state_dict().state) {
    for (const auto& [key, t] : state.tensors) {
      INFO("state " << index << " " << key);
      CHECK(t.to_local().device() == Device(kCPU));
    }
  }
}

// Step by step within a relative `tolerance`: float32 on both devices sums in other orders,
// a relative 1e-4 over five steps.
void check_same(const Run& got, const Run& reference, double tolerance = 1e-4) {
  REQUIRE(got.losses.size() == reference.losses.size());
  REQUIRE(got.norms.size() == reference.norms.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(got.losses[s] == Approx(reference.losses[s]).epsilon(tolerance));
    if (!got.norms.empty()) CHECK(got.norms[s] == Approx(reference.norms[s]).epsilon(tolerance));
  }
}

TEST_CASE("fully_shard on two GPUs trains like one CPU rank, frees gathered parameters and prefetches behind compute",
          "[nn][fully_shard][gpu][multi_gpu]") {
  // CUDA is first touched in the ranks: a process that initialised it cannot fork ranks
  // that use it.
  testing::run_ranks(2, [](int rank, int) {
    require_gpus(2);
    const Tensor ids = batch_ids();
    const Run reference = cpu_reference(ids);

    const DeviceMesh mesh = init_device_mesh(kCUDA, {2}, {"dp"});
    const Device gpu = mesh.device();
    CHECK(gpu == Device(kCUDA, rank));
    manual_seed(3);
    Transformer model(config());
    std::vector<FSDPModule*> blocks;
    for (size_t i = 0; i < model.layers().size(); ++i) {
      blocks.push_back(&fully_shard(model.layers().at<TransformerBlock>(i), mesh));
    }
    fully_shard(model, mesh);
    for (DTensor* p : model.parameters()) CHECK(p->to_local().device() == gpu);
    optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});

    // In use while each block runs (after its unshard) and after it (after its reshard).
    std::vector<int64_t> during(blocks.size()), after(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      Module& block = model.layers().at<TransformerBlock>(i);
      block.register_forward_pre_hook([&during, i, gpu](Module&, const Values&) -> std::optional<Values> {
        cuda::compute_stream(gpu.index).synchronize();
        during[i] = memory_stats(gpu).bytes_in_use;
        return std::nullopt;
      });
      block.register_forward_hook([&after, i, gpu](Module&, const Values&, const Values&) -> std::optional<Values> {
        cuda::compute_stream(gpu.index).synchronize();
        after[i] = memory_stats(gpu).bytes_in_use;
        return std::nullopt;
      });
    }

    Run run;
    for (int64_t s = 0; s < kSteps; ++s) {
      const bool traced = s == 2;  // implicit prefetch knows the order from step 1 on
      if (traced) trace::start(trace::kCommCategories);
      {
        const trace::Span span("step", trace::kStepCategory);
        step(run, model, opt, mesh, ids);
        cuda::compute_stream(gpu.index).synchronize();
      }
      if (!traced) continue;
      const std::vector<trace::ThreadEvents> lanes = trace::stop();
      const std::vector<trace::StepComm> comm =
          trace::account_communication(trace::chrome_trace(trace::chrome_events(lanes, rank, 0, 0)));
      REQUIRE(comm.size() == 1);
      bool prefetched_behind_compute = false;
      for (const trace::CollectiveTiming& c : comm[0].collectives) {
        if (c.phase == "forward all_gather" && c.owner == "layers.1" && c.time.hidden_us > 0) {
          prefetched_behind_compute = true;
        }
      }
      INFO(trace::to_json(comm[0]).dump(2));
      CHECK(prefetched_behind_compute);
    }
    check_same(run, reference);
    // The root keeps its parameters; every block frees what its forward gathered.
    for (size_t i = 0; i < blocks.size(); ++i) {
      INFO("block " << i);
      CHECK(after[i] < during[i]);
    }
  });
}

TEST_CASE("CPU offload on one GPU keeps shards, gradients and AdamW state on the host and trains like the CPU",
          "[nn][fully_shard][gpu]") {
  testing::run_ranks(1, [](int, int) {
    require_gpus(1);
    const Tensor ids = batch_ids();
    const Run reference = cpu_reference(ids);
    const DeviceMesh mesh = init_device_mesh(kCUDA, {1}, {"dp"});
    const Device gpu = mesh.device();
    manual_seed(3);
    Transformer model(config());
    shard_offloaded(model, mesh);
    optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
    int64_t parameter_bytes = 0;
    for (DTensor* p : model.parameters()) parameter_bytes += static_cast<int64_t>(p->to_local().nbytes());
    Run run;
    for (int64_t s = 0; s < kSteps; ++s) {
      step(run, model, opt, mesh, ids);
      cuda::compute_stream(gpu.index).synchronize();
      // Between steps the device holds no parameter, gradient or optimizer state: what is
      // in use is the root's gathered parameters at most (kept for backward, dropped after
      // it) plus buffers, well under one copy of the parameters.
      INFO("step " << s + 1 << ": " << memory_stats(gpu).bytes_in_use << " bytes in use on the device, parameters "
                   << parameter_bytes);
      CHECK(memory_stats(gpu).bytes_in_use < parameter_bytes / 2);
      check_on_host(model, opt);
    }
    check_same(run, reference);
    // Weights loaded onto the device (load_full_state_dict puts them on the mesh's device)
    // go back to pinned host memory at the next forward.
    load_full_state_dict(model, full_state_dict(model));
    {
      const NoGradGuard no_grad;
      model(distribute_tensor(ids.narrow(1, 0, kSeq).contiguous().to(gpu), mesh, {Shard(0)}));
    }
    check_on_host(model, opt);
  });
}

TEST_CASE("CPU offload on one GPU with bf16 compute stays within the mixed-precision bound", "[nn][fully_shard][gpu]") {
  testing::run_ranks(1, [](int, int) {
    require_gpus(1);
    const Tensor ids = batch_ids();
    const DeviceMesh mesh = init_device_mesh(kCUDA, {1}, {"dp"});
    manual_seed(3);
    Transformer model(config());
    shard_offloaded(model, mesh, {.param_dtype = kBFloat16, .reduce_dtype = kFloat32, .output_dtype = kFloat32});
    optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
    Run run;
    for (int64_t s = 0; s < kSteps; ++s) step(run, model, opt, mesh, ids);
    check_on_host(model, opt);
    for (DTensor* p : model.parameters()) CHECK(p->dtype() == kFloat32);  // the shards keep their dtype
    // bf16 rounds weights and activations to 8 significant bits: within 2%, as on CPU ranks.
    check_same(run, cpu_reference(ids), 2e-2);
  });
}

TEST_CASE("CPU offload on two GPUs with gradient clipping and a full state dict trains like the CPU",
          "[nn][fully_shard][gpu][multi_gpu]") {
  testing::run_ranks(2, [](int, int) {
    require_gpus(2);
    const Tensor ids = batch_ids();
    constexpr double kMaxNorm = 0.5;
    TensorMap expected;
    const Run reference = cpu_reference(ids, kMaxNorm, &expected);
    REQUIRE(reference.norms.front() > kMaxNorm);  // so the clip scales the host gradients
    const DeviceMesh mesh = init_device_mesh(kCUDA, {2}, {"dp"});
    manual_seed(3);
    Transformer model(config());
    shard_offloaded(model, mesh);
    optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
    Run run;
    for (int64_t s = 0; s < kSteps; ++s) step(run, model, opt, mesh, ids, kMaxNorm);
    check_same(run, reference);
    check_on_host(model, opt);
    // Gathering host shards (an all-gather on NCCL, through the device) gives the CPU run's
    // weights on the host.
    const TensorMap weights = full_state_dict(model);
    for (const auto& [name, w] : expected) {
      INFO(name);
      REQUIRE(weights.count(name) == 1);
      CHECK(weights.at(name).device() == Device(kCPU));
      testing::check_close(weights.at(name), w, {1e-3, 1e-3}, name);
    }
  });
}

}  // namespace
}  // namespace dtr::nn
