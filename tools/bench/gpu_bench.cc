// gpu_bench: the GPU benchmarks of the GPU check (tools/gpu_run.sh), one table each, every figure
// measured against a reference in the same run on the same GPU:
//   1. memory-bound kernels: GB/s (bytes read plus written) and the share of a
//      device-to-device cudaMemcpyAsync's bandwidth at the same bytes (goal >= 0.8), at
//      sizes far beyond L2;
//   2. matmul: TFLOP/s of dtr's matmul and the share of the fastest of cuBLASLt's ranked
//      algorithms at that shape (goal >= 0.95), and the share of the GPU's dense peak;
//   3. attention: the fused kernel's forward and backward TFLOP/s, and the composed
//      (matmul + softmax) path's time at the same shape;
//   4. a training step of a causal LM sized for one GPU: tokens/s, and model FLOP
//      utilisation against the dense bf16 peak.
// Each row's result is first compared with the CPU kernel on the same inputs (all of it,
// or for matmul a block of rows): "ok" or "WRONG"; a WRONG row exits 1. Timing: CUDA
// events on the compute stream around back-to-back calls after a warm-up.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda/copy_bytes.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/stream.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/matmul.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fill.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"
#include "kernels/optimizer_step.h"
#include "kernels/random.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"
#include "nn/init.h"
#include "nn/loss.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "tools/command_line.h"
#include "tools/tool_main.h"
#include "tools/train/mfu.h"

namespace dtr::bench {
namespace {

const Device kGpu(kCUDA, 0);

// Mean milliseconds per call of fn over `iterations` back-to-back calls after one warm-up,
// from events on the compute stream (every kernel here runs on it).
double gpu_ms(const std::function<void()>& fn, int iterations) {
  const cuda::Stream& stream = cuda::compute_stream(0);
  fn();
  cuda::Event start(0, cuda::Event::Timing::kOn), stop(0, cuda::Event::Timing::kOn);
  start.record(stream);
  for (int i = 0; i < iterations; ++i) fn();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_ms(stop) / iterations;
}

Tensor random_on_gpu(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype, kGpu);
  normal_(t, 0.0, 1.0, seed);
  return t;
}

// "" when gpu is within tol of cpu (max |difference| over max(1, max |cpu|)), else the figure.
std::string compare(const Tensor& gpu, const Tensor& cpu, double tol) {
  const Tensor g = gpu.to(kCPU).to(kFloat64).contiguous(), c = cpu.to(kFloat64).contiguous();
  const double* pg = g.data_ptr<double>();
  const double* pc = c.data_ptr<double>();
  double worst = 0, scale = 1;
  for (int64_t i = 0; i < c.numel(); ++i) {
    worst = std::max(worst, std::abs(pg[i] - pc[i]));
    scale = std::max(scale, std::abs(pc[i]));
  }
  return worst <= tol * scale ? "" : fmt::format("max difference {:.3g} (tolerance {:.3g})", worst, tol * scale);
}

int wrong_rows = 0;

std::string verdict(const std::string& check) {
  if (check.empty()) return "ok";
  ++wrong_rows;
  return "WRONG: " + check;
}

// ---- 1. memory-bound kernels ----

struct MemoryRow {
  std::string name;
  double bytes;                        // read plus written per call
  std::function<void()> run;           // the timed call
  std::function<std::string()> check;  // "" when the result matches the CPU
};

void memory_table(int64_t n, int iterations) {
  const int64_t cols = 4096, rows = n / cols;
  const Tensor a = random_on_gpu({n}, kFloat32, 1), b = random_on_gpu({n}, kFloat32, 2);
  const Tensor a_cpu = a.to(kCPU), b_cpu = b.to(kCPU);
  Tensor out = Tensor::empty({n}, kFloat32, kGpu);
  Tensor out_bf16 = Tensor::empty({n}, kBFloat16, kGpu);
  const Tensor a2 = a.view({rows, cols}), a2_cpu = a_cpu.view({rows, cols});
  const Tensor w = random_on_gpu({cols}, kFloat32, 3), bias = random_on_gpu({cols}, kFloat32, 4);
  Tensor target = Tensor::empty({rows}, kFloat64, kCPU);
  uniform_(target, 0, cols - 0.5, 5);
  const Tensor target_cpu = target.to(kInt64), target_gpu = target_cpu.to(kGpu);
  const int64_t vocab = 32768, dim = 1024, tokens = n / dim / 2;
  const Tensor table = random_on_gpu({vocab, dim}, kFloat32, 6);
  Tensor ids = Tensor::empty({tokens}, kFloat64, kCPU);
  uniform_(ids, 0, vocab - 0.5, 7);
  const Tensor ids_cpu = ids.to(kInt64), ids_gpu = ids_cpu.to(kGpu);
  // AdamW over 8 parameters of n / 32 elements: param, grad, exp_avg, exp_avg_sq.
  std::vector<StepTensors> adam;
  for (int k = 0; k < 8; ++k) {
    adam.push_back({.param = random_on_gpu({n / 32}, kFloat32, 10 + k),
                    .grad = random_on_gpu({n / 32}, kFloat32, 20 + k),
                    .state = {zeros({n / 32}, kFloat32, kGpu), zeros({n / 32}, kFloat32, kGpu)}});
  }
  const double f32 = 4.0 * static_cast<double>(n);
  const std::vector<MemoryRow> table_rows = {
      {"copy_ float32", 2 * f32, [&] { out.copy_(a); }, [&] { return compare(out, a_cpu, 0); }},
      {"cast float32 -> bfloat16", 1.5 * f32, [&] { out_bf16.copy_(a); },
       [&] { return compare(out_bf16, a_cpu.to(kBFloat16), 0); }},
      {"add", 3 * f32, [&] { out = add(a, b); }, [&] { return compare(out, add(a_cpu, b_cpu), 0); }},
      {"mul scalar", 2 * f32, [&] { out = mul(a, 0.5); }, [&] { return compare(out, mul(a_cpu, 0.5), 0); }},
      {"gelu", 2 * f32, [&] { out = gelu(a); }, [&] { return compare(out, gelu(a_cpu), 1e-6); }},
      {"sum (all)", f32, [&] { out = sum(a); }, [&] { return compare(out, sum(a_cpu), 1e-5); }},
      {"sum over rows of 4096", f32, [&] { out = sum(a2, {1}); }, [&] { return compare(out, sum(a2_cpu, {1}), 1e-5); }},
      {"softmax rows of 4096", 2 * f32, [&] { out = softmax(a2, 1); },
       [&] { return compare(out, softmax(a2_cpu, 1), 1e-6); }},
      {"layer_norm rows of 4096", 2 * f32, [&] { out = layer_norm(a2, {cols}, w, bias).y; },
       [&] { return compare(out, layer_norm(a2_cpu, {cols}, w.to(kCPU), bias.to(kCPU)).y, 1e-5); }},
      {"cross_entropy rows of 4096", f32, [&] { out = cross_entropy(a2, target_gpu).loss; },
       [&] { return compare(out, cross_entropy(a2_cpu, target_cpu).loss, 1e-5); }},
      {"embedding rows of 1024", 2.0 * 4 * static_cast<double>(tokens * dim), [&] { out = embedding(table, ids_gpu); },
       [&] { return compare(out, embedding(table.to(kCPU), ids_cpu), 0); }},
      {"adamw, 8 tensors in one launch", 7 * f32 / 4, [&] { adamw_step_(adam, 1, {.lr = 1e-3, .weight_decay = 0.1}); },
       [&] {  // the update of a fresh parameter from zero moments, on the CPU
         const Tensor p = random_on_gpu({n / 32}, kFloat32, 10), g = random_on_gpu({n / 32}, kFloat32, 20);
         std::vector<StepTensors> on_gpu = {
             {.param = p.clone(),
              .grad = g,
              .state = {zeros({n / 32}, kFloat32, kGpu), zeros({n / 32}, kFloat32, kGpu)}}};
         std::vector<StepTensors> on_cpu = {
             {.param = p.to(kCPU), .grad = g.to(kCPU), .state = {zeros({n / 32}), zeros({n / 32})}}};
         adamw_step_(on_gpu, 1, {.lr = 1e-3, .weight_decay = 0.1});
         adamw_step_(on_cpu, 1, {.lr = 1e-3, .weight_decay = 0.1});
         return compare(on_gpu[0].param, on_cpu[0].param, 1e-6);
       }},
  };
  fmt::print("\n1. Memory-bound kernels, float32, {} elements ({} MiB per operand); goal: >= 0.8 of the copy's GB/s\n",
             n, f32 / (1 << 20));
  fmt::print("{:<32} | {:>9} | {:>9} | {:>8} | {:>8} | {}\n", "kernel", "MiB moved", "ms", "GB/s", "of copy", "check");
  // The reference: a device-to-device copy moving the same bytes (reads half, writes half).
  auto copy_gbs = [&](double bytes) {
    const Tensor src = Tensor::empty({static_cast<int64_t>(bytes / 2)}, kBFloat16, kGpu);
    Tensor dst = Tensor::empty(src.shape(), kBFloat16, kGpu);
    const double ms = gpu_ms(
        [&] {
          cuda::copy_bytes(dst.data(), src.data(), src.nbytes(), cuda::CopyKind::kDeviceToDevice,
                           cuda::compute_stream(0));
        },
        iterations);
    return static_cast<double>(2 * src.nbytes()) / ms / 1e6;
  };
  int below = 0;
  for (const MemoryRow& row : table_rows) {
    row.run();
    const std::string check = verdict(row.check());
    const double ms = gpu_ms(row.run, iterations);
    const double gbs = row.bytes / ms / 1e6, ref = copy_gbs(row.bytes);
    below += gbs / ref < 0.8;
    fmt::print("{:<32} | {:>9.0f} | {:>9.3f} | {:>8.0f} | {:>8.2f} | {}\n", row.name, row.bytes / (1 << 20), ms, gbs,
               gbs / ref, check);
  }
  fmt::print("goal (>= 0.8 of the copy): {}\n", below == 0 ? "met by every row" : fmt::format("{} rows below", below));
}

// ---- 2. matmul ----

struct MatmulShape {
  int64_t m, n, k;
  DType dtype;
  bool tf32;
};

void matmul_table(int iterations, double bf16_peak) {
  const std::vector<MatmulShape> shapes = {
      {4096, 4096, 4096, kBFloat16, false},  {8192, 8192, 8192, kBFloat16, false},
      {16384, 8192, 2048, kBFloat16, false}, {16384, 2048, 8192, kBFloat16, false},
      {16384, 6144, 2048, kBFloat16, false}, {8192, 8192, 8192, kFloat16, false},
      {8192, 8192, 8192, kFloat32, true},    {4096, 4096, 4096, kFloat32, false},
  };
  fmt::print("\n2. Matmul [M, K] x [K, N]; goal: >= 0.95 of cuBLASLt's fastest ranked algorithm\n");
  fmt::print("{:<28} | {:>9} | {:>9} | {:>11} | {:>11} | {:>8} | {}\n", "shape", "ms", "TFLOP/s", "best ms", "of best",
             "of peak", "check");
  int below = 0;
  for (const MatmulShape& s : shapes) {
    set_matmul_allow_tf32(s.tf32);
    const Tensor a = random_on_gpu({s.m, s.k}, s.dtype, 30), b = random_on_gpu({s.k, s.n}, s.dtype, 31);
    Tensor out;
    auto run = [&] { out = matmul(a, b); };
    run();
    // A block of rows against the CPU (float64 products of the same rounded inputs).
    const Tensor rows_cpu = matmul(a.narrow(0, 0, 8).to(kCPU).to(kFloat64), b.to(kCPU).to(kFloat64));
    const double tol = s.dtype == kFloat32 && !s.tf32 ? 1e-4 : 2e-2;
    const std::string check = verdict(compare(out.narrow(0, 0, 8), rows_cpu, tol));
    const double ms = gpu_ms(run, iterations);
    Tensor workspace = Tensor::empty({static_cast<int64_t>(cuda::kMatmulWorkspaceBytes)}, kBFloat16, kGpu);
    const cuda::MatrixOperand ao{.data = a.data(), .row_stride = s.k, .col_stride = 1, .batch_stride = s.m * s.k};
    const cuda::MatrixOperand bo{.data = b.data(), .row_stride = s.n, .col_stride = 1, .batch_stride = s.k * s.n};
    const std::vector<float> algos =
        cuda::time_algorithms(out.data(), ao, bo, 1, s.m, s.n, s.k, s.dtype, {.allow_tf32 = s.tf32}, workspace.data(),
                              workspace.nbytes(), cuda::compute_stream(0), 16, iterations);
    const double best = *std::min_element(algos.begin(), algos.end());
    const double tflops = 2.0 * s.m * s.n * s.k / ms / 1e9;
    below += best / ms < 0.95;
    const std::string peak =
        s.dtype == kBFloat16 || s.dtype == kFloat16 ? fmt::format("{:.2f}", tflops / bf16_peak) : "";
    fmt::print("{:<28} | {:>9.3f} | {:>9.1f} | {:>11.3f} | {:>11.2f} | {:>8} | {}\n",
               fmt::format("{} {}x{}x{}{}", dtype_name(s.dtype), s.m, s.n, s.k, s.tf32 ? " tf32" : ""), ms, tflops,
               best, best / ms, peak, check);
  }
  set_matmul_allow_tf32(false);
  fmt::print("goal (>= 0.95 of the best algorithm): {}\n",
             below == 0 ? "met by every shape" : fmt::format("{} shapes below", below));
}

// ---- 3. attention ----

void attention_table(int iterations) {
  struct Shape4 {
    int64_t batch, heads, seq, head_dim;
    Causal causal;
  };
  const std::vector<Shape4> shapes = {{4, 16, 2048, 128, Causal::kYes},
                                      {4, 16, 2048, 128, Causal::kNo},
                                      {8, 16, 1024, 64, Causal::kYes},
                                      {1, 16, 8192, 128, Causal::kYes}};
  fmt::print("\n3. Attention, bfloat16 [B, H, T, D]: the fused kernel, and the composed path (matmul, softmax)\n");
  fmt::print("{:<26} | {:>8} | {:>8} | {:>8} | {:>8} | {:>11} | {}\n", "shape", "fwd ms", "fwd TF/s", "bwd ms",
             "bwd TF/s", "composed ms", "check");
  for (const Shape4& s : shapes) {
    const Shape shape{s.batch, s.heads, s.seq, s.head_dim};
    const Tensor q = random_on_gpu(shape, kBFloat16, 40), k = random_on_gpu(shape, kBFloat16, 41),
                 v = random_on_gpu(shape, kBFloat16, 42), grad = random_on_gpu(shape, kBFloat16, 43);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    AttentionOutput fwd = attention(q, k, v, s.causal, scale);
    // The first batch and head against the CPU kernel.
    auto head0 = [](const Tensor& t) { return t.narrow(0, 0, 1).narrow(1, 0, 1).to(kCPU); };
    const std::string check =
        s.seq > 2048
            ? "unchecked (the CPU reference is slow at this length)"
            : verdict(compare(head0(fwd.out), attention(head0(q), head0(k), head0(v), s.causal, scale).out, 2e-2));
    const double fwd_ms = gpu_ms([&] { fwd = attention(q, k, v, s.causal, scale); }, iterations);
    const double bwd_ms =
        gpu_ms([&] { attention_backward(grad, q, k, v, fwd.out, fwd.lse, s.causal, scale); }, iterations);
    // softmax(q k^T * scale) v without the mask: the composed path's cost (the mask adds a
    // pass), its [B * H, T, T] scores materialised.
    const Shape rows{s.batch * s.heads, s.seq, s.head_dim};
    const Tensor q3 = q.view(rows), k3 = k.view(rows), v3 = v.view(rows);
    const double composed_ms =
        s.seq > 2048 ? 0.0 : gpu_ms([&] { bmm(softmax(mul(bmm(q3, k3.transpose(1, 2)), scale), -1), v3); }, iterations);
    const double flops = 4.0 * s.batch * s.heads * s.seq * s.seq * s.head_dim * (s.causal == Causal::kYes ? 0.5 : 1.0);
    fmt::print(
        "{:<26} | {:>8.3f} | {:>8.1f} | {:>8.3f} | {:>8.1f} | {:>11} | {}\n",
        fmt::format("{}x{}x{}x{}{}", s.batch, s.heads, s.seq, s.head_dim, s.causal == Causal::kYes ? " causal" : ""),
        fwd_ms, flops / fwd_ms / 1e9, bwd_ms, 2.5 * flops / bwd_ms / 1e9,
        composed_ms > 0 ? fmt::format("{:.3f}", composed_ms) : "-", check);
  }
}

// ---- 4. a training step ----

void train_table(int steps, double bf16_peak) {
  const int64_t vocab = 32768, dim = 1024, layers = 8, heads = 16, seq = 1024, batch = 8;
  const DeviceMesh mesh = single_rank_mesh(kCUDA);
  fmt::print(
      "\n4. Training step on one GPU: causal LM vocab {}, dim {}, {} layers, {} heads, seq {}, batch {}, AdamW\n",
      vocab, dim, layers, heads, seq, batch);
  fmt::print("{:<10} | {:>10} | {:>9} | {:>10} | {:>8} | {:>10}\n", "dtype", "params", "ms/step", "tokens/s", "MFU",
             "loss");
  for (DType dtype : {kFloat32, kBFloat16}) {
    nn::manual_seed(0);
    nn::Transformer model({.vocab_size = vocab,
                           .dim = dim,
                           .n_layers = layers,
                           .n_heads = heads,
                           .causal = true,
                           .max_seq_len = seq,
                           .final_norm = true},
                          {.dtype = dtype, .mesh = mesh});
    optim::AdamW opt({{.params = model.parameters(), .lr = 3e-4, .weight_decay = 0.1}});
    Tensor u = Tensor::empty({batch, seq + 1}, kFloat64);
    uniform_(u, 0, static_cast<double>(vocab) - 0.5, 1);
    const Tensor ids = u.to(kInt64).to(kGpu);
    const DTensor x = distribute_tensor(ids.narrow(1, 0, seq).contiguous(), mesh, {Replicate()});
    const DTensor y =
        reshape(distribute_tensor(ids.narrow(1, 1, seq).contiguous(), mesh, {Replicate()}), {batch * seq});
    double loss = 0;
    auto step = [&] {
      opt.zero_grad();
      const DTensor l = nn::cross_entropy(reshape(model(x), {batch * seq, vocab}), y);
      l.backward();
      opt.step();
      return l;
    };
    step();
    cuda::compute_stream(0).synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) loss = step().item();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
    const double params = static_cast<double>(model.num_parameters());
    // MFU as the train program reports it (tools/train/mfu.h: 6N + 12 L d T per token).
    const double flops_per_token = train::model_flops_per_token(model.num_parameters(), layers, dim, seq);
    const double tokens_per_s = batch * seq / (ms / 1e3);
    fmt::print("{:<10} | {:>9.1f}M | {:>9.1f} | {:>10.0f} | {:>8.3f} | {:>10.4f}\n", dtype_name(dtype), params / 1e6,
               ms, tokens_per_s, train::mfu(tokens_per_s, flops_per_token, bf16_peak), loss);
  }
}

int run_main(int argc, char** argv) {
  CLI::App app{
      "GPU benchmarks: memory-bound kernels vs a device copy, matmul vs cuBLASLt's best, attention, a "
      "training step"};
  int64_t elements = int64_t{64} << 20;
  int iterations = 20, steps = 5;
  double bf16_peak = 989;
  std::string only;
  app.add_option("--elements", elements, "float32 elements per operand of the memory-bound rows")
      ->check(CLI::Range(int64_t{1} << 16, int64_t{1} << 32));
  app.add_option("--iterations", iterations, "timed calls per row")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed training steps")->check(CLI::PositiveNumber);
  app.add_option("--bf16-peak", bf16_peak, "the GPU's dense bf16 TFLOP/s (H100/H200 SXM: 989)")
      ->check(CLI::PositiveNumber);
  app.add_option("--only", only, "one table: memory, matmul, attention or train")
      ->check(CLI::IsMember({"memory", "matmul", "attention", "train"}));
  if (const std::optional<int> exit_code = dtr::parse_command_line("gpu_bench", app, argc, argv)) return *exit_code;
  DTR_CHECK(cuda::device_count() > 0, ValueError, "gpu_bench: no CUDA device visible; it benchmarks cuda:0");
  elements -= elements % 4096;
  fmt::print("gpu_bench on {}\n", cuda::device_description(0));
  if (only.empty() || only == "memory") memory_table(elements, iterations);
  if (only.empty() || only == "matmul") matmul_table(iterations, bf16_peak);
  if (only.empty() || only == "attention") attention_table(iterations);
  if (only.empty() || only == "train") train_table(steps, bf16_peak);
  if (wrong_rows > 0) fmt::print("{} rows WRONG\n", wrong_rows);
  return wrong_rows > 0 ? 1 : 0;
}

}  // namespace
}  // namespace dtr::bench

int main(int argc, char** argv) {
  return dtr::tool_main("gpu_bench", [&] { return dtr::bench::run_main(argc, argv); });
}
