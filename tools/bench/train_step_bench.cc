// train_step_bench: tokens/s of one training step of the reference causal LM on one rank
// and one thread, against PyTorch 2.15 eager on the same model, configuration and data
// shape, run in the same benchmark (tools/bench/train_step_peer.py; skipped when torch is
// missing). The step's time is split into forward (with the loss), backward and the
// optimizer step, medians over the timed steps.
//
//   bazel run -c opt //tools/bench:train_step_bench [-- --steps 5 --warmup 2 --python PATH]
//
// Reference configuration: vocab 4096, dim 256, 4 layers, 4 heads, sequence 128, 8
// sequences per step, AdamW, float32.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/ops/loss.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/error.h"
#include "kernels/parallel.h"
#include "kernels/random.h"
#include "nn/init.h"
#include "nn/parameter.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "tools/tool_main.h"

namespace {

using namespace dtr;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// Random token ids in [0, vocab) as an int64 DTensor on the one-rank mesh.
DTensor random_tokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  Tensor u = Tensor::empty({batch, seq}, kFloat64);
  uniform_(u, 0, static_cast<double>(vocab) - 0.5, seed);
  const Tensor ids = u.to(kInt64);
  return DTensor(ids, DTensorSpec(nn::single_rank_mesh(), {Replicate()}, ids.shape(), kInt64));
}

// The peer's output line, or "" when it could not run.
std::string run_peer(const std::string& python, const std::string& args) {
  const std::string command = python + " tools/bench/train_step_peer.py " + args + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) return "";
  std::string out;
  std::array<char, 512> buffer;
  while (std::fgets(buffer.data(), buffer.size(), pipe.get())) out += buffer.data();
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokens/s of one training step of the reference causal LM, against PyTorch on one thread."};
  int64_t vocab = 4096, dim = 256, layers = 4, heads = 4, seq = 128, batch = 8, steps = 5, warmup = 2;
  const char* home = std::getenv("HOME");
  std::string python = home != nullptr ? std::string(home) + "/torch-venv/bin/python3" : "python3";
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--python", python, "the Python that runs the PyTorch peer");
  CLI11_PARSE(app, argc, argv);
  return tool_main("train_step_bench", [&] {
    // bazel run starts in the runfiles tree; the peer script is read from the workspace.
    if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
      if (::chdir(ws) != 0) throw OSError(errno, fmt::format("chdir('{}')", ws));
    }
    set_num_threads(1);
    nn::manual_seed(0);
    nn::Transformer model({.vocab_size = vocab,
                           .dim = dim,
                           .n_layers = layers,
                           .n_heads = heads,
                           .causal = true,
                           .max_seq_len = seq,
                           .final_norm = true});
    optim::AdamW opt({{.params = model.parameters(), .lr = 3e-4, .weight_decay = 0.1}});
    const DTensor tokens = random_tokens(batch, seq, vocab, 1);
    const DTensor targets = reshape(random_tokens(batch, seq, vocab, 2), {batch * seq});
    std::vector<double> fwd, bwd, upd, total;
    double loss_value = 0;
    for (int64_t step = 0; step < warmup + steps; ++step) {
      const auto t0 = Clock::now();
      opt.zero_grad();
      const DTensor loss = cross_entropy(reshape(model(tokens), {batch * seq, vocab}), targets);
      const auto t1 = Clock::now();
      loss.backward();
      const auto t2 = Clock::now();
      opt.step();
      const auto t3 = Clock::now();
      loss_value = loss.item();
      DTR_CHECK(std::isfinite(loss_value), ValueError, "train_step_bench: the loss is {} at step {}", loss_value, step);
      if (step >= warmup) {
        fwd.push_back(ms(t0, t1));
        bwd.push_back(ms(t1, t2));
        upd.push_back(ms(t2, t3));
        total.push_back(ms(t0, t3));
      }
    }
    const double tokens_per_s = static_cast<double>(batch * seq) / (median(total) / 1e3);
    fmt::print(
        "causal LM: vocab {}, dim {}, {} layers, {} heads, seq {}, batch {}, AdamW, float32, 1 thread, "
        "{} parameters; medians of {} steps after {} warm-up steps (last loss {:.4f})\n",
        vocab, dim, layers, heads, seq, batch, model.num_parameters(), steps, warmup, loss_value);
    fmt::print("{:<8} | {:>9} | {:>10} | {:>11} | {:>12}\n", "", "tokens/s", "forward ms", "backward ms",
               "optimizer ms");
    fmt::print("{:<8} | {:>9.1f} | {:>10.2f} | {:>11.2f} | {:>12.2f}\n", "dtr", tokens_per_s, median(fwd), median(bwd),
               median(upd));
    const std::string peer =
        run_peer(python, fmt::format("{} {} {} {} {} {} {} {}", vocab, dim, layers, heads, seq, batch, steps, warmup));
    double torch_tps = 0, tf = 0, tb = 0, to = 0;
    if (std::sscanf(peer.c_str(), "torch tokens/s %lf forward %lf backward %lf optimizer %lf", &torch_tps, &tf, &tb,
                    &to) == 4) {
      fmt::print("{:<8} | {:>9.1f} | {:>10.2f} | {:>11.2f} | {:>12.2f}\n", "PyTorch", torch_tps, tf, tb, to);
      fmt::print("dtr / PyTorch tokens/s: {:.2f}\n", tokens_per_s / torch_tps);
    } else {
      fmt::print("PyTorch peer not run ({}): pip install torch==2.15.0, or pass --python\n",
                 peer.empty() ? "no output" : peer);
    }
    return 0;
  });
}
