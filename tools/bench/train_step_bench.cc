// train_step_bench: tokens/s of one training step of the reference causal LM on one rank
// and one thread, against PyTorch 2.15 eager on the same model, configuration and data
// shape, run in the same benchmark (tools/bench/peers/train_step_peer.py; skipped when torch is
// missing). The step's time is split into forward (with the loss), backward and the
// optimizer step, medians over the timed steps; then by op family (tools/bench/op_family.h),
// means over as many steps again run with tracing on (the peer's from torch.profiler).
//
//   bazel run -c opt //tools/bench:train_step_bench [-- --steps 5 --warmup 2 --python PATH]
//
// Reference configuration: vocab 4096, dim 256, 4 layers, 4 heads, sequence 128, 8
// sequences per step, AdamW, float32.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/trace.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/random.h"
#include "nn/init.h"
#include "nn/parameter.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/op_family.h"
#include "tools/bench/peer.h"
#include "tools/command_line.h"
#include "tools/tool_main.h"

namespace {

using namespace dtr;
using Clock = std::chrono::steady_clock;

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// Random token ids in [0, vocab) as an int64 DTensor on the one-rank mesh.
DTensor random_tokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  Tensor u = Tensor::empty({batch, seq}, kFloat64);
  uniform_(u, 0, static_cast<double>(vocab) - 0.5, seed);
  const Tensor ids = u.to(kInt64);
  return DTensor(ids, DTensorSpec(single_rank_mesh(), {Replicate()}, ids.shape(), kInt64));
}

// The peer's output lines, or "" when it could not run.
std::string run_peer(const std::string& python, const std::string& args) {
  return bench::command_output(python + " tools/bench/peers/train_step_peer.py " + args);
}

// The peer's split: "torch split" and one figure per family in OpFamily order.
std::optional<bench::FamilyTimes> parse_peer_split(const std::string& peer) {
  const size_t at = peer.find("torch split");
  if (at == std::string::npos) return std::nullopt;
  std::istringstream in(peer.substr(at + 11));
  bench::FamilyTimes ms{};
  for (double& v : ms) {
    if (!(in >> v)) return std::nullopt;
  }
  return ms;
}

void print_split(const bench::FamilyTimes& dtr, double dtr_step, const std::optional<bench::FamilyTimes>& torch,
                 double torch_step) {
  fmt::print("\nstep time by op family (ms per step, tracing on; PyTorch's from torch.profiler):\n");
  fmt::print("{:<22} | {:>8} | {:>6} | {:>10} | {:>6} | {:>13}\n", "family", "dtr ms", "share", "PyTorch ms", "share",
             "dtr / PyTorch");
  auto row = [&](std::string_view name, double d, double t) {
    fmt::print("{:<22} | {:>8.2f} | {:>5.1f}% | ", name, d, 100 * d / dtr_step);
    if (torch) {
      fmt::print("{:>10.2f} | {:>5.1f}% | {:>13.2f}\n", t, 100 * t / torch_step, d / t);
    } else {
      fmt::print("{:>10} | {:>6} | {:>13}\n", "-", "-", "-");
    }
  };
  for (size_t f = 0; f < bench::kNumOpFamilies; ++f) {
    row(bench::op_family_name(static_cast<bench::OpFamily>(f)), dtr[f], torch ? (*torch)[f] : 0);
  }
  row("step", dtr_step, torch_step);
}

// Per-step times of one phase of the run, in ms.
struct StepTimes {
  std::vector<double> forward, backward, optimizer, total;
};

// The PyTorch peer's figures of one run.
struct PeerRun {
  double tokens_per_s = 0, forward = 0, backward = 0, optimizer = 0;
  std::optional<bench::FamilyTimes> split;
};

std::optional<PeerRun> parse_peer(const std::string& peer) {
  PeerRun r;
  if (std::sscanf(peer.c_str(), "torch tokens/s %lf forward %lf backward %lf optimizer %lf", &r.tokens_per_s,
                  &r.forward, &r.backward, &r.optimizer) != 4) {
    return std::nullopt;
  }
  r.split = parse_peer_split(peer);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokens/s of one training step of the reference causal LM, against PyTorch on one thread."};
  int64_t vocab = 4096, dim = 256, layers = 4, heads = 4, seq = 128, batch = 8, steps = 5, warmup = 2, rounds = 3;
  std::string python = bench::default_peer_python();
  app.add_option("--steps", steps, "timed steps per round")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", rounds, "rounds of dtr's steps then the peer's, alternating")->check(CLI::PositiveNumber);
  app.add_option("--python", python, "the Python that runs the PyTorch peer");
  if (const std::optional<int> exit_code = dtr::parse_command_line("train_step_bench", app, argc, argv))
    return *exit_code;
  return tool_main("train_step_bench", [&] {
    bench::enter_workspace();  // the peer script is read from the workspace
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
    int64_t step_index = 0;
    double loss_value = 0;
    // One training step; returns its phases' times.
    auto train_step = [&] {
      const auto t0 = Clock::now();
      opt.zero_grad();
      const DTensor loss = cross_entropy(reshape(model(tokens), {batch * seq, vocab}), targets);
      const auto t1 = Clock::now();
      loss.backward();
      const auto t2 = Clock::now();
      opt.step();
      const auto t3 = Clock::now();
      loss_value = loss.item();
      DTR_CHECK(std::isfinite(loss_value), ValueError, "train_step_bench: the loss is {} at step {}", loss_value,
                step_index);
      ++step_index;
      return std::array<double, 4>{ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t0, t3)};
    };
    for (int64_t i = 0; i < warmup; ++i) train_step();
    const std::string peer_args =
        fmt::format("{} {} {} {} {} {} {} {}", vocab, dim, layers, heads, seq, batch, steps, warmup);
    // Rounds alternate dtr and the peer, so both see the host's drifts alike.
    StepTimes dtr;
    std::vector<double> dtr_tps, torch_tps, ratios;
    std::vector<PeerRun> peers;
    std::string peer_failure;
    for (int64_t r = 0; r < rounds; ++r) {
      std::vector<double> round_total;
      for (int64_t i = 0; i < steps; ++i) {
        const std::array<double, 4> t = train_step();
        dtr.forward.push_back(t[0]);
        dtr.backward.push_back(t[1]);
        dtr.optimizer.push_back(t[2]);
        dtr.total.push_back(t[3]);
        round_total.push_back(t[3]);
      }
      dtr_tps.push_back(static_cast<double>(batch * seq) / (bench::median(round_total) / 1e3));
      const std::string out = run_peer(python, peer_args);
      if (const std::optional<PeerRun> p = parse_peer(out)) {
        peers.push_back(*p);
        torch_tps.push_back(p->tokens_per_s);
        ratios.push_back(dtr_tps.back() / p->tokens_per_s);
      } else {
        peer_failure = out.empty() ? "no output" : out;
        break;  // the peer cannot run here: dtr's rounds would only repeat
      }
    }
    // The split: as many steps again, traced.
    bench::FamilyTimes split{};
    double traced_ms = 0;
    for (int64_t i = 0; i < steps; ++i) {
      trace::start();
      const double step_ms = train_step()[3];
      const bench::FamilyTimes s = bench::split_by_family(trace::stop(), step_ms);
      for (size_t f = 0; f < s.size(); ++f) split[f] += s[f] / static_cast<double>(steps);
      traced_ms += step_ms / static_cast<double>(steps);
    }
    fmt::print(
        "causal LM: vocab {}, dim {}, {} layers, {} heads, seq {}, batch {}, AdamW, float32, 1 thread, "
        "{} parameters; {} round(s) of {} steps each side after {} warm-up steps (last loss {:.4f})\n",
        vocab, dim, layers, heads, seq, batch, model.num_parameters(), dtr_tps.size(), steps, warmup, loss_value);
    fmt::print("{:<8} | {:>9} | {:>10} | {:>11} | {:>12}   (medians)\n", "", "tokens/s", "forward ms", "backward ms",
               "optimizer ms");
    fmt::print("{:<8} | {:>9.1f} | {:>10.2f} | {:>11.2f} | {:>12.2f}\n", "dtr", bench::median(dtr_tps),
               bench::median(dtr.forward), bench::median(dtr.backward), bench::median(dtr.optimizer));
    if (peers.empty()) {
      fmt::print("PyTorch peer not run ({}): pip install torch==2.15.0, or pass --python\n", peer_failure);
      print_split(split, traced_ms, std::nullopt, 0);
      return 0;
    }
    auto peer_median = [&](double PeerRun::*field) {
      std::vector<double> v;
      for (const PeerRun& p : peers) v.push_back(p.*field);
      return bench::median(v);
    };
    fmt::print("{:<8} | {:>9.1f} | {:>10.2f} | {:>11.2f} | {:>12.2f}\n", "PyTorch", bench::median(torch_tps),
               peer_median(&PeerRun::forward), peer_median(&PeerRun::backward), peer_median(&PeerRun::optimizer));
    fmt::print("dtr / PyTorch tokens/s: {:.2f} (the median of the rounds' ratios {:.2f})\n", bench::median(ratios),
               fmt::join(ratios, ", "));
    const std::optional<bench::FamilyTimes>& torch_split = peers.back().split;
    double torch_step = 0;
    if (torch_split) {
      for (double v : *torch_split) torch_step += v;
    }
    print_split(split, traced_ms, torch_split, torch_step);
    return 0;
  });
}
