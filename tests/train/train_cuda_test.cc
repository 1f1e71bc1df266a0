// The train program on GPUs, started as users start it: `train --device cuda` on one GPU
// (--parallel none, fsdp, and fsdp with --cpu-offload) gives the CPU run's losses, its step
// line shows MFU and its monitoring table the GPU memory; an offloaded run resumes a
// checkpoint saved without offload; on two GPUs (multi_gpu), fsdp
// (also offloaded) and ddp with NCCL give two CPU ranks' losses. Tagged gpu (and multi_gpu): a case that finds fewer
// GPUs than it needs fails, never passes.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/cuda/cuda_device.h"
#include "tests/train/train_runner.h"

namespace dtr {
namespace {

using testing::check_same_losses;
using testing::kTinyTrainFlags;
using testing::read_file;
using testing::train_losses;

// float32 on both devices: the GPU's reductions and GEMMs sum in other orders than the
// CPU's (cuBLASLt without TF32), a relative 1e-6 per op; over 10 steps of AdamW on 192
// tokens the losses stay within 1e-4.
constexpr double kFloat32Tolerance = 1e-4;

void require_gpus(int needed) {
  INFO("this machine has " << cuda::device_count() << " CUDA device(s)");
  REQUIRE(cuda::device_count() >= needed);
}

TEST_CASE("train --device cuda on one GPU gives the CPU run's losses, with MFU and GPU memory", "[train][gpu]") {
  require_gpus(1);
  const std::vector<double> cpu = train_losses("cuda_none_cpu", 0, kTinyTrainFlags + " --parallel none");
  check_same_losses(train_losses("cuda_none", 0, kTinyTrainFlags + " --parallel none --device cuda"), cpu,
                    kFloat32Tolerance);
  // fsdp on a one-rank world: the same program path as more ranks, NCCL included.
  const testing::TrainRun fsdp = testing::run_train("cuda_fsdp", 1, kTinyTrainFlags + " --device cuda");
  check_same_losses(testing::losses_in(fsdp.out / "metrics.jsonl", 1), cpu, kFloat32Tolerance);
  const std::string& output = fsdp.result.output;
  CHECK(output.find("nccl, one GPU each") != std::string::npos);
  CHECK(output.find("GPU alloc | GPU resv. | host peak") != std::string::npos);
  const nlohmann::json summary = nlohmann::json::parse(read_file(fsdp.out / "summary.json"));
  const std::string gpu = cuda::device_description(0);
  if (gpu.find("H100") != std::string::npos || gpu.find("H200") != std::string::npos) {
    CHECK(output.find("| MFU ") != std::string::npos);
    CHECK(summary.at("mfu").get<double>() > 0);
  }
  CHECK(summary.at("ranks").at(0).at("device_reserved_bytes").get<double>() > 0);
  // bf16 compute with float32 reduction stays within the CPU's mixed-precision bound.
  check_same_losses(train_losses("cuda_mixed", 1, kTinyTrainFlags + " --device cuda --mixed-precision"), cpu, 1e-2);
  // The shards, gradients and AdamW state on the host, the optimizer stepping there.
  const testing::TrainRun offload =
      testing::run_train("cuda_offload", 1, kTinyTrainFlags + " --device cuda --cpu-offload");
  check_same_losses(testing::losses_in(offload.out / "metrics.jsonl", 1), cpu, kFloat32Tolerance);
  CHECK(offload.result.output.find("offloaded to the host") != std::string::npos);
}

TEST_CASE("train --device cuda --cpu-offload resumes a checkpoint saved without offload", "[train][gpu]") {
  require_gpus(1);
  // The optimizer state saved from the device is read onto the host, beside the shards.
  const std::string flags = kTinyTrainFlags + " --device cuda --use-dcp-checkpointing --checkpoint-every 5";
  const testing::TrainRun whole = testing::run_train("cuda_ckpt", 1, flags);
  const std::vector<double> expected = testing::losses_in(whole.out / "metrics.jsonl", 1);
  REQUIRE(expected.size() == 10);
  const std::string step5 = (whole.out / "checkpoints" / "step_00000005").string();
  const testing::TrainRun resumed =
      testing::run_train("cuda_ckpt_offload", 1, flags + " --cpu-offload --resume " + step5);
  check_same_losses(testing::losses_in(resumed.out / "metrics.jsonl", 1),
                    std::vector<double>(expected.begin() + 5, expected.end()), kFloat32Tolerance);
}

TEST_CASE("train --device cuda under fsdp on two GPUs gives two CPU ranks' losses", "[train][gpu][multi_gpu]") {
  require_gpus(2);
  const std::vector<double> cpu = train_losses("cuda2_cpu", 2, kTinyTrainFlags);
  check_same_losses(train_losses("cuda2_fsdp", 2, kTinyTrainFlags + " --device cuda --prefetch 1"), cpu,
                    kFloat32Tolerance);
  check_same_losses(train_losses("cuda2_ddp", 2, kTinyTrainFlags + " --device cuda --parallel ddp"), cpu,
                    kFloat32Tolerance);
  check_same_losses(train_losses("cuda2_offload", 2, kTinyTrainFlags + " --device cuda --cpu-offload"), cpu,
                    kFloat32Tolerance);
}

}  // namespace
}  // namespace dtr
