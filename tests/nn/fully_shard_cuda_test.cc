// fully_shard on GPUs, two ranks with NCCL (one GPU each): five AdamW steps of a causal
// Transformer sharded per block and at the root, with implicit prefetch, give the one-rank
// CPU run's losses; each block's gathered parameters are freed by its post-forward (the
// device allocator's bytes in use fall); and a traced step, timed on the device (NCCL's
// stream and the compute stream's waits: cuda::DeviceSpan), shows a block's prefetched
// all-gather running behind the compute before it. Tagged gpu and multi_gpu: it fails,
// never passes, with fewer than two GPUs.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "collectives/init.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/allocator.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/stream.h"
#include "kernels/random.h"
#include "kernels/trace.h"
#include "nn/fully_shard.h"
#include "nn/init.h"
#include "nn/loss.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "tests/testing/multi_rank.h"
#include "tools/trace/chrome_trace.h"
#include "tools/trace/comm_accounting.h"

namespace dtr::nn {
namespace {

constexpr int64_t kVocab = 128, kSeq = 16, kBatch = 4, kSteps = 5;

// Parameters dominate a block's memory at this size (12 * 256^2 floats against a few KiB
// of activations per block), so releasing the gathered ones shows in the allocator.
TransformerConfig config() {
  return {.vocab_size = kVocab, .dim = 256, .n_layers = 3, .n_heads = 4, .causal = true, .max_seq_len = kSeq};
}

// The step's tokens, the same on every rank and device (drawn on the host).
Tensor batch_ids() {
  Tensor u = Tensor::empty({kBatch, kSeq + 1}, kFloat64);
  uniform_(u, 0, kVocab - 0.5, 11);
  return u.to(kInt64);
}

// One step on `mesh`, the batch sharded over it; returns the loss.
double step(Transformer& model, optim::AdamW& opt, const DeviceMesh& mesh, const Tensor& ids) {
  const Tensor on_device = ids.to(mesh.device());
  const DTensor x = distribute_tensor(on_device.narrow(1, 0, kSeq).contiguous(), mesh, {Shard(0)});
  const DTensor y =
      reshape(distribute_tensor(on_device.narrow(1, 1, kSeq).contiguous(), mesh, {Shard(0)}), {kBatch * kSeq});
  opt.zero_grad();
  const DTensor loss = cross_entropy(reshape(model(x), {kBatch * kSeq, kVocab}), y);
  loss.backward();
  opt.step();
  return loss.item();
}

TEST_CASE("fully_shard on two GPUs trains like one CPU rank, frees gathered parameters and prefetches behind compute",
          "[nn][fully_shard][gpu][multi_gpu]") {
  // CUDA is first touched in the ranks: a process that initialised it cannot fork ranks
  // that use it.
  testing::run_ranks(2, [](int rank, int) {
    INFO("this machine has " << cuda::device_count() << " CUDA device(s)");
    REQUIRE(cuda::device_count() >= 2);
    const Tensor ids = batch_ids();
    // The reference: the same model unsharded on this rank's CPU, the whole batch.
    std::vector<double> reference;
    {
      const DeviceMesh cpu = DeviceMesh::row_major(kCPU, {1}, {}, 0, 1);
      manual_seed(3);
      Transformer model(config());
      optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2, .weight_decay = 0.1}});
      for (int64_t s = 0; s < kSteps; ++s) reference.push_back(step(model, opt, cpu, ids));
    }

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

    std::vector<double> losses;
    for (int64_t s = 0; s < kSteps; ++s) {
      const bool traced = s == 2;  // implicit prefetch knows the order from step 1 on
      if (traced) trace::start(trace::kCommCategories);
      {
        const trace::Span span("step", trace::Category::kStep);
        losses.push_back(step(model, opt, mesh, ids));
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
    // float32 on both devices: sums in other orders, a relative 1e-4 over five steps.
    REQUIRE(losses.size() == reference.size());
    for (size_t s = 0; s < losses.size(); ++s) {
      INFO("step " << s + 1);
      CHECK(losses[s] == Approx(reference[s]).epsilon(1e-4));
    }
    // The root keeps its parameters; every block frees what its forward gathered.
    for (size_t i = 0; i < blocks.size(); ++i) {
      INFO("block " << i);
      CHECK(after[i] < during[i]);
    }
  });
}

}  // namespace
}  // namespace dtr::nn
