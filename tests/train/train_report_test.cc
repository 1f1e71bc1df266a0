// The train program's monitoring table: its columns on CPU ranks, and the GPU memory columns
// (allocated, reserved, host peak) it adds when the ranks trained on GPUs.
#include <catch2/catch.hpp>

#include <string>

#include "tools/train/train_report.h"

namespace dtr::train {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

TEST_CASE("the monitoring table: memory by kind, communication shares and tokens/s per rank", "[train]") {
  const RankFigures f{.param_bytes = 2 * kMiB,
                      .grad_bytes = 2 * kMiB,
                      .optim_bytes = 4 * kMiB,
                      .peak_bytes = 10 * kMiB,
                      .host_peak_bytes = 10 * kMiB,
                      .comm_s = 1.0,
                      .exposed_s = 0.25,
                      .train_s = 5.0,
                      .tokens = 5000};
  const std::string table = monitoring_table({f, f});
  CHECK(table.find("params MiB") != std::string::npos);
  CHECK(table.find("peak MiB") != std::string::npos);
  CHECK(table.find("GPU") == std::string::npos);
  // rank 1: 2 + 2 + 4 MiB of state, 2 of activations, 10 at the peak; 5% exposed
  // communication, 75% of it hidden; 1000 tokens/s.
  CHECK(table.find("   1 |       2.00 |      2.00 |      4.00 |        2.00 |    10.00 |    5.0 |      95.0 |     75.0 "
                   "|      1000") != std::string::npos);
}

TEST_CASE("on GPUs the monitoring table adds allocated, reserved and host memory", "[train]") {
  const RankFigures f{.param_bytes = 1 * kMiB,
                      .grad_bytes = 1 * kMiB,
                      .optim_bytes = 2 * kMiB,
                      .peak_bytes = 8 * kMiB,
                      .host_peak_bytes = 3 * kMiB,
                      .device_in_use_bytes = 4 * kMiB,
                      .device_reserved_bytes = 12 * kMiB,
                      .comm_s = 0,
                      .exposed_s = 0,
                      .train_s = 1.0,
                      .tokens = 100};
  const std::string table = monitoring_table({f});
  CHECK(table.find("GPU peak") != std::string::npos);
  CHECK(table.find("GPU alloc | GPU resv. | host peak") != std::string::npos);
  CHECK(table.find("|      4.00 |     12.00 |      3.00\n") != std::string::npos);
  CHECK(table.find("|        4.00 |     8.00 |") != std::string::npos);  // activations 8 - 4, peak 8
}

}  // namespace
}  // namespace dtr::train
