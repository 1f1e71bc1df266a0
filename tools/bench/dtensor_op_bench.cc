// dtensor_op_bench: what a DTensor op costs beyond its local kernel (choosing placements
// by the sharding rule, recording autograd), in microseconds beside the kernel's own time,
// at a small shape and at transformer shapes. `bazel run //tools/bench:dtensor_op_bench`.
//
// Inputs are placed as data parallelism places them (activations Shard(0), weights
// Replicate; cross_entropy's Replicate, since its mean's global count is a collective) on
// rank 0's view of a 2-rank mesh, so no op moves data and the time beyond the kernel is
// pure dispatch. Every input requires grad, so each call records its autograd node too.
// Each row checks the op's local result against the kernel's. Goal: overhead < 5% of the
// kernel at transformer shapes.
#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>
#include <optional>

#include "core/parallel.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/layer_norm.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/softmax.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"
#include "kernels/softmax.h"
#include "tools/bench/bench_util.h"
#include "tools/command_line.h"
#include "tools/tool_main.h"

namespace dtr::bench {
namespace {

// Rank 0's view of a 2-rank data-parallel mesh (a topology: nothing here communicates).
const DeviceMesh& dp_mesh() {
  static const DeviceMesh mesh = DeviceMesh::row_major(kCPU, {2}, {"dp"}, 0, 2);
  return mesh;
}

// A DTensor of global `shape` under `placement`, requiring grad, with values in [0, 1).
DTensor input(const Shape& shape, Placement placement, uint64_t seed, DType dtype = kFloat32) {
  DTensorSpec spec(dp_mesh(), {placement}, shape, dtype);
  Tensor local = Tensor::empty(spec.local_shape(), kFloat64);
  double* d = local.data_ptr<double>();
  for (int64_t i = 0; i < local.numel(); ++i) {
    d[i] = static_cast<double>((static_cast<uint64_t>(i) * 2654435761u + seed) % 1000) / 1000.0;
  }
  DTensor t(local.to(dtype), spec);
  if (is_floating(dtype)) t.requires_grad_();
  return t;
}

std::vector<double> values(const Tensor& t) {
  Tensor c = t.to(kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

struct OpRow {
  std::string op;
  std::string shape;
  std::function<Tensor()> kernel;    // the local kernel alone, on this rank's inputs
  std::function<DTensor()> dtensor;  // the DTensor op: rule + kernel + autograd record
};

std::vector<OpRow> rows(int64_t tokens, int64_t hidden, int64_t ffn, int64_t vocab) {
  const std::string tag = fmt::format("T={} H={} F={}", tokens, hidden, ffn);
  std::vector<OpRow> out;
  {
    DTensor a = input({tokens, hidden}, Shard(0), 1), b = input({tokens, hidden}, Shard(0), 2);
    out.push_back({"add", tag, [=] { return add(a.to_local(), b.to_local()); }, [=] { return add(a, b); }});
  }
  {
    DTensor x = input({tokens, hidden}, Shard(0), 3), w = input({ffn, hidden}, Replicate(), 4);
    out.push_back(
        {"linear (x W^T)", tag, [=] { return matmul(x.to_local(), w.to_local().t()); }, [=] { return linear(x, w); }});
  }
  {
    DTensor x = input({tokens, ffn}, Shard(0), 5);
    out.push_back({"softmax", tag, [=] { return softmax(x.to_local(), -1); }, [=] { return softmax(x, -1); }});
  }
  {
    DTensor x = input({tokens, hidden}, Shard(0), 6), w = input({hidden}, Replicate(), 7),
            b = input({hidden}, Replicate(), 8);
    out.push_back({"layer_norm", tag, [=] { return layer_norm(x.to_local(), {hidden}, w.to_local(), b.to_local()).y; },
                   [=] { return layer_norm(x, {hidden}, w, b); }});
  }
  {
    DTensor logits = input({tokens, vocab}, Replicate(), 9), target = input({tokens}, Replicate(), 10, kInt64);
    out.push_back({"cross_entropy", fmt::format("T={} V={}", tokens, vocab),
                   [=] { return cross_entropy(logits.to_local(), target.to_local()).loss; },
                   [=] { return cross_entropy(logits, target); }});
  }
  return out;
}

int run_main(int argc, char** argv) {
  CLI::App app{"DTensor dispatch overhead (sharding rule + autograd record) beside the local kernel"};
  int threads = 1;
  app.add_option("--threads", threads, "CPU kernel threads")->check(CLI::PositiveNumber);
  if (const std::optional<int> exit_code = dtr::parse_command_line("dtensor_op_bench", app, argc, argv))
    return *exit_code;
  set_num_threads(threads);
  std::cout << fmt::format("{:<16} {:<22} {:>6} {:>12} {:>13} {:>14} {:>9}\n", "op", "global shape (dp=2)", "check",
                           "kernel (us)", "DTensor (us)", "overhead (us)", "overhead");
  int wrong = 0;
  for (const auto& [tokens, hidden, ffn, vocab] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{16, 32, 64, 100}, {2048, 1024, 4096, 50000}}) {
    for (const OpRow& r : rows(tokens, hidden, ffn, vocab)) {
      const std::vector<double> expected = values(r.kernel()), actual = values(r.dtensor().to_local());
      const bool ok = expected == actual;
      wrong += !ok;
      const Timing k = time_it(r.kernel), d = time_it([&] { r.dtensor(); });
      const double over = d.median_us - k.median_us;
      std::cout << fmt::format("{:<16} {:<22} {:>6} {:>12.1f} {:>13.1f} {:>14.1f} {:>8.2f}%\n", r.op, r.shape,
                               ok ? "ok" : "WRONG", k.median_us, d.median_us, over, 100.0 * over / k.median_us);
    }
  }
  return wrong > 0 ? 1 : 0;
}

}  // namespace
}  // namespace dtr::bench

int main(int argc, char** argv) {
  return dtr::tool_main("dtensor_op_bench", [&] { return dtr::bench::run_main(argc, argv); });
}
