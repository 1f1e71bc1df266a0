// ac_bench: activation checkpointing in the train program (tools/train/train under dtrrun,
// one thread per rank) on train_bench's reference configuration, against PyTorch 2.15's
// checkpoint_wrapper on the same model in the same run. For each rank count and sequence
// length, four policies: none, every 2nd block (--activation-checkpoint full --ac-every 2:
// blocks 0 and 2), selective (every block, keeping attention's and collectives' results and
// the products holding half their FLOPs) and full (every block); --parallel fsdp, or none on 1
// rank. One row per run: the median ms/step after the warm-up and its range, tokens/s at the
// median, peak MiB per rank, activations MiB and the rest of the peak, with the changes
// against none; then PyTorch's figures for the same policy and dtr's tokens/s over PyTorch's.
// Activations are the memory that grows with the batch: every policy also runs with 2
// sequences per rank instead of 8 (as many steps; PyTorch's too), its peak is linear in the
// sequences (the rest: parameters, gradients, optimizer state, and fully_shard's gathered
// parameters, unsharded gradients and buffers, which do not depend on the batch), so
// activations = (peak at 8 - peak at 2) x 8 / 6. The goals: full cuts activations by
// at least 60% for at most 35% more step time, selective by at least 40% for at most 15%.
// Then, per rank count and sequence length, the largest model each policy trains within
// --budget-mib per rank: every policy also runs at 2 layers (dtr only), its peak grows
// linearly in the layers (each block adds its parameters' share, their gradients and
// optimizer state, and what the policy keeps of its activations; the rest, one block's
// recompute included, is fixed), so per-layer bytes = (peak at 4 - peak at 2) / 2, fixed =
// peak at 2 - 2 x per-layer, and the largest layer count = (budget - fixed) / per-layer: a
// computation from measured bytes, not a search.
// Last, an SVG of peak MiB per rank against tokens/s, one line per implementation, rank count
// and sequence length through its policies (tools/train/loss_plot.h draws it).
//
//   bazel run //tools/bench:ac_bench [-- --ranks 1,2 --seq-lens 128,512 --steps 6 --warmup 2 --budget-mib 1024
//                                      --svg PATH]
//
// PyTorch's side is tools/bench/peers/ac_peer.py (checkpoint_wrapper on the blocks, with
// torchtitan's selective policy through create_selective_checkpoint_contexts, then
// fully_shard on more than one rank). Its CPU allocator keeps no peak, so its memory columns
// are the process's resident set (ac_peer.py says how), marked "(RSS)": compare their
// changes against none with dtr's, not their MiB. Its columns show '-' when torch is missing.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/temp_path.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/peer.h"
#include "tools/command_line.h"
#include "tools/tool_main.h"
#include "tools/train/loss_plot.h"

namespace {

using namespace dtr;
namespace fs = std::filesystem;

// Sequences per rank, and the count the activations' second point runs.
constexpr int64_t kBatchPerRank = 8, kFewerSequences = 2;
constexpr double kMiB = 1024.0 * 1024.0;
// The goals, against none: activations cut by at least this many percent for at
// most that much more step time.
struct Goal {
  const char* policy;
  double activation_cut, time_cost;
};
constexpr std::array<Goal, 2> kGoals = {{{"full", 60, 35}, {"selective", 40, 15}}};

// A checkpointing policy: its name in the table, the train flags that select it and
// ac_peer.py's name for it.
struct Policy {
  const char* label;
  const char* train_flags;
  const char* peer_name;
};
constexpr std::array<Policy, 4> kPolicies = {{
    {"none", "--activation-checkpoint none", "none"},
    {"every 2nd", "--activation-checkpoint full --ac-every 2", "every2"},
    {"selective", "--activation-checkpoint selective", "selective"},
    {"full", "--activation-checkpoint full", "full"},
}};

// The activations within `peak`: what grows with the batch, from the peak at
// kFewerSequences per rank (above).
double activations(double peak, double peak_at_fewer) {
  return (peak - peak_at_fewer) * static_cast<double>(kBatchPerRank) /
         static_cast<double>(kBatchPerRank - kFewerSequences);
}

// PyTorch's figures for one policy (ac_peer.py's line); memory from the resident set.
struct TorchFigures {
  double ms = 0, tokens_per_s = 0, peak_mib = 0, peak_at_fewer_mib = 0;
  double activation_mib() const { return activations(peak_mib, peak_at_fewer_mib); }
};

struct Row {
  int ranks = 1;
  int64_t seq = 0;
  const Policy* policy = nullptr;
  bench::TrainRun dtr;
  bench::TrainRun two_layers;       // the same at --layers 2, for the budget
  bench::TrainRun fewer_sequences;  // the same at kFewerSequences per rank, for the activations
  double tokens_per_s = 0;          // at dtr's median ms/step
  std::optional<TorchFigures> torch;

  double activation_bytes() const { return activations(dtr.peak_bytes, fewer_sequences.peak_bytes); }
};

// The reference configuration's layers, and the count the budget's second point runs.
constexpr int64_t kLayers = 4, kFewerLayers = 2;

// Trains one row's runs (the reference model, and at kFewerLayers) and fills in dtr's figures.
void train_row(Row& row, const std::string& dtrrun, const std::string& program, int64_t steps, int64_t warmup,
               const fs::path& dir) {
  std::string reference = bench::kReferenceTrainFlags;
  const std::string layers = fmt::format("--layers {}", kLayers);
  const size_t at = reference.find(layers);
  DTR_INTERNAL_ASSERT(at != std::string::npos, "the reference flags name no {}", layers);
  auto flags = [&](int64_t batch_per_rank) {
    return fmt::format("--seq-len {} --parallel {} {} --batch-size {}", row.seq, row.ranks == 1 ? "none" : "fsdp",
                       row.policy->train_flags, batch_per_rank * row.ranks);
  };
  const std::string what = fmt::format("{} ranks, seq {}, {}", row.ranks, row.seq, row.policy->label);
  row.dtr =
      bench::run_train(dtrrun, program, row.ranks, reference + " " + flags(kBatchPerRank), steps, warmup, dir, what);
  row.tokens_per_s = static_cast<double>(kBatchPerRank * row.ranks * row.seq) / (row.dtr.median_ms / 1e3);
  std::string fewer = reference;
  fewer.replace(at, layers.size(), fmt::format("--layers {}", kFewerLayers));
  row.two_layers = bench::run_train(dtrrun, program, row.ranks, fewer + " " + flags(kBatchPerRank), 2, 1,
                                    dir / "two_layers", what + fmt::format(", {} layers", kFewerLayers));
  row.fewer_sequences =
      bench::run_train(dtrrun, program, row.ranks, reference + " " + flags(kFewerSequences), steps, warmup,
                       dir / "fewer_sequences", what + fmt::format(", {} sequences per rank", kFewerSequences));
}

// The budget line of one rank count and sequence length: the largest layer count each
// policy trains within `budget` bytes per rank (above).
std::string budget_line(const std::vector<Row>& rows, double budget) {
  std::string out =
      fmt::format("{} ranks, seq {}, {:.0f} MiB per rank:", rows.front().ranks, rows.front().seq, budget / kMiB);
  for (const Row& r : rows) {
    const double per_layer = (r.dtr.peak_bytes - r.two_layers.peak_bytes) / (kLayers - kFewerLayers);
    const double fixed = r.two_layers.peak_bytes - kFewerLayers * per_layer;
    const double layers = per_layer > 0 ? std::floor((budget - fixed) / per_layer) : 0;
    out += fmt::format(" {} {:.0f} layers ({:.1f} MiB per layer + {:.1f} fixed);", r.policy->label,
                       std::max(0.0, layers), per_layer / kMiB, fixed / kMiB);
  }
  out.pop_back();
  return out;
}

// PyTorch's figures by ac_peer.py's policy name at `ranks` ranks and sequence `seq`; empty,
// with `note` saying why, when the peer gave not all of them.
std::map<std::string, TorchFigures> torch_figures(const std::string& python, int ranks, int64_t seq, int64_t steps,
                                                  int64_t warmup, std::string& note) {
  const std::string peer = bench::command_output(fmt::format(
      "{} -m torch.distributed.run --standalone --nproc_per_node {} tools/bench/peers/ac_peer.py {} {} {} {}",
      bench::shell_quote(python), ranks, steps, warmup, seq, kFewerSequences));
  std::map<std::string, TorchFigures> figures;
  std::istringstream lines(peer);
  for (std::string line; std::getline(lines, line);) {
    char name[16];
    TorchFigures f;
    if (std::sscanf(line.c_str(), "torch ac %15s %lf %lf %lf %lf", name, &f.ms, &f.tokens_per_s, &f.peak_mib,
                    &f.peak_at_fewer_mib) == 5) {
      figures[name] = f;
    }
  }
  if (figures.size() == kPolicies.size()) return figures;
  note = fmt::format("the PyTorch peer gave figures of {} of {} policies; its output ends\n{}", figures.size(),
                     kPolicies.size(), bench::last_lines(peer, 8));
  return {};
}

// "+12%" / "-71%": the change from `base` to `value`; "" for the base row itself.
std::string change(double value, double base, bool is_base) {
  return is_base ? "" : fmt::format("{:+.0f}%", 100 * (value / base - 1));
}

// Prints the rows of one rank count and sequence length; rows[0] is none.
void print_rows(const std::vector<Row>& rows) {
  const Row& none = rows.front();
  for (const Row& r : rows) {
    const bool base = &r == &none;
    // PyTorch's columns: ms/step, tokens/s, peak, activations, their changes, dtr over PyTorch.
    std::array<std::string, 7> torch;
    torch.fill("-");
    if (const std::optional<TorchFigures>& t = r.torch) {
      torch = {fmt::format("{:.1f}", t->ms),
               fmt::format("{:.0f}", t->tokens_per_s),
               fmt::format("{:.1f}", t->peak_mib),
               fmt::format("{:.1f}", t->activation_mib()),
               change(t->activation_mib(), none.torch->activation_mib(), base),
               change(t->ms, none.torch->ms, base),
               fmt::format("{:.2f}", r.tokens_per_s / t->tokens_per_s)};
    }
    fmt::print(
        "{:>5} | {:>4} | {:<9} | {:>8.1f} | {:>9} | {:>8.0f} | {:>8.1f} | {:>10.1f} | {:>8.1f} | {:>7} | {:>7} || "
        "{:>8} | {:>8} | {:>8} | {:>10} | {:>7} | {:>7} | {:>9}\n",
        r.ranks, r.seq, r.policy->label, r.dtr.median_ms, fmt::format("{:.0f}-{:.0f}", r.dtr.min_ms, r.dtr.max_ms),
        r.tokens_per_s, r.dtr.peak_bytes / kMiB, r.activation_bytes() / kMiB,
        (r.dtr.peak_bytes - r.activation_bytes()) / kMiB, change(r.activation_bytes(), none.activation_bytes(), base),
        change(r.dtr.median_ms, none.dtr.median_ms, base), torch[0], torch[1], torch[2], torch[3], torch[4], torch[5],
        torch[6]);
  }
  std::fflush(stdout);
}

// The goal lines of full and selective checkpointing at one rank count and sequence length;
// rows[0] is none.
std::vector<std::string> goal_lines(const std::vector<Row>& rows) {
  const Row& none = rows.front();
  std::vector<std::string> lines;
  for (const Goal& goal : kGoals) {
    for (const Row& r : rows) {
      if (std::string(r.policy->label) != goal.policy) continue;
      const double cut = 100 * (1 - r.activation_bytes() / none.activation_bytes());
      const double cost = 100 * (r.dtr.median_ms / none.dtr.median_ms - 1);
      const std::string torch =
          r.torch ? fmt::format("; PyTorch's {}: {:+.0f}% activations (RSS), {:+.0f}% step time", goal.policy,
                                100 * (r.torch->activation_mib() / none.torch->activation_mib() - 1),
                                100 * (r.torch->ms / none.torch->ms - 1))
                  : "";
      lines.push_back(fmt::format("{} ranks, seq {}: {} cuts activations {:.0f}% ({}) for {:+.0f}% step time ({}){}",
                                  r.ranks, r.seq, goal.policy, cut, cut >= goal.activation_cut ? "met" : "missed", cost,
                                  cost <= goal.time_cost ? "met" : "missed", torch));
    }
  }
  return lines;
}

// The SVG: peak MiB per rank against tokens/s, one line per implementation, rank count and
// sequence length through its policies. PyTorch's peak is its resident set's.
void write_svg(const std::string& path, const std::vector<std::vector<Row>>& groups) {
  // dtr in blues and greens, PyTorch in oranges and reds.
  static constexpr std::array<const char*, 4> kDtrColors = {"#1f77b4", "#17becf", "#2ca02c", "#9467bd"};
  static constexpr std::array<const char*, 4> kTorchColors = {"#ff7f0e", "#d62728", "#8c564b", "#e377c2"};
  std::vector<train::Series> series;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Row& first = groups[g].front();
    const std::string what = fmt::format("{} rank{}, seq {}", first.ranks, first.ranks == 1 ? "" : "s", first.seq);
    train::Series dtr{.label = "dtr " + what, .color = kDtrColors[g % kDtrColors.size()], .points = {}};
    train::Series torch{
        .label = "PyTorch " + what + " (RSS)", .color = kTorchColors[g % kTorchColors.size()], .points = {}};
    for (const Row& r : groups[g]) {
      dtr.points.emplace_back(r.tokens_per_s, r.dtr.peak_bytes / kMiB);
      if (r.torch) torch.points.emplace_back(r.torch->tokens_per_s, r.torch->peak_mib);
    }
    series.push_back(std::move(dtr));
    if (!torch.points.empty()) series.push_back(std::move(torch));
  }
  train::write_loss_plot(path, series,
                         {.title = "activation checkpointing: none, every 2nd block, selective, full (along each line)",
                          .x_label = "tokens/s",
                          .y_label = "peak MiB per rank",
                          .width = 900,
                          .height = 560});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Activation checkpointing in the train program (none, every 2nd block, selective, full) against PyTorch's."};
  std::vector<int> ranks = {1, 2};
  std::vector<int64_t> seq_lens = {128, 512};
  std::string python = bench::default_peer_python();
  std::string svg = "docs/ac_bench.svg";
  int64_t steps = 6, warmup = 2;
  double budget_mib = 1024;
  app.add_option("--ranks", ranks, "rank counts, comma-separated (each run its own launch)")
      ->delimiter(',')
      ->check(whole_number(1, 64));
  app.add_option("--seq-lens", seq_lens, "sequence lengths, comma-separated")
      ->delimiter(',')
      ->check(whole_number(1, 8192));
  app.add_option("--steps", steps, "steps per run, warm-up included")->check(whole_number(1));
  app.add_option("--warmup", warmup, "first steps left out of ms/step")->check(whole_number(0));
  app.add_option("--budget-mib", budget_mib, "the memory per rank the largest-model lines fill")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--python", python, "the Python that runs the PyTorch peer");
  app.add_option("--svg", svg, "where the SVG goes (relative to the workspace)");
  if (const std::optional<int> exit_code = dtr::parse_command_line("ac_bench", app, argc, argv)) return *exit_code;
  return tool_main("ac_bench", [&] {
    DTR_CHECK(steps > warmup, ValueError, "--steps {} must exceed --warmup {}", steps, warmup);
    const std::string dtrrun = bench::find_built_program("tools/launcher/dtrrun", "//tools/bench:ac_bench");
    const std::string program = bench::find_built_program("tools/train/train", "//tools/bench:ac_bench");
    bench::enter_workspace();  // the peer script is read from the workspace, the SVG written there
    const fs::path svg_dir = fs::absolute(svg).parent_path();
    DTR_CHECK(fs::is_directory(svg_dir), ValueError, "--svg {}: no directory {} to write it in", svg, svg_dir.string());
    const std::string torch_at = bench::torch_version(python);
    // Removed, with every run's output, however this ends.
    const TempPath scratch(fs::temp_directory_path() / fmt::format("ac_bench.{}", ::getpid()));

    fmt::print("the train program under dtrrun, 1 thread per rank ({} hardware threads), against {} (ac_peer.py)\n",
               std::thread::hardware_concurrency(), torch_at.empty() ? "PyTorch (missing)" : "PyTorch " + torch_at);
    fmt::print(
        "causal LM: vocab 4096, dim 256, 4 layers, 4 heads, learned positions, final norm, untied output; {} "
        "sequences per rank, AdamW, float32; --parallel fsdp (none on 1 rank)\n",
        kBatchPerRank);
    fmt::print(
        "ms/step: median of steps {}..{} (range: their min-max); peak: the largest of any rank; activ. = what "
        "grows with the batch, (peak - peak at {} sequences per rank) x {} / {}; rest = peak - activ. (parameters, "
        "gradients, optimizer state, fully_shard's gathered parameters and unsharded gradients); 'vs none': the "
        "change against none\n",
        warmup + 1, steps, kFewerSequences, kBatchPerRank, kBatchPerRank - kFewerSequences);
    fmt::print(
        "PyTorch: checkpoint_wrapper (non-reentrant; selective: torchtitan's policy through "
        "create_selective_checkpoint_contexts, attention saved and every second product of a block recomputed) on "
        "the same blocks, fully_shard on > 1 rank; its peak and activations "
        "are resident-set figures (ac_peer.py), not an allocator's\n");
    fmt::print(
        "{:>5} | {:>4} | {:<9} | {:>8} | {:>9} | {:>8} | {:>8} | {:>10} | {:>8} | {:>7} | {:>7} || {:>8} | {:>8} | "
        "{:>8} | {:>10} | {:>7} | {:>7} | {:>9}\n",
        "ranks", "seq", "policy", "ms/step", "range ms", "tokens/s", "peak MiB", "activ. MiB", "rest MiB", "activ.",
        "ms", "torch ms", "tok/s", "peak*", "activ.*", "activ.", "ms", "dtr/torch");
    fmt::print(
        "{:>5} | {:>4} | {:<9} | {:>8} | {:>9} | {:>8} | {:>8} | {:>10} | {:>8} | {:>7} | {:>7} || {:>8} | {:>8} | "
        "{:>8} | {:>10} | {:>7} | {:>7} | {:>9}\n",
        "", "", "", "", "", "", "", "", "", "vs none", "vs none", "", "", "(RSS)", "(RSS)", "vs none", "vs none",
        "tok/s");
    std::fflush(stdout);
    std::vector<std::string> notes, goals, budgets;
    if (torch_at.empty()) {
      notes.push_back(
          fmt::format("torch missing ({} cannot import it): pip install torch==2.15.0, or pass --python", python));
    }
    std::vector<std::vector<Row>> groups;
    for (int n : ranks) {
      for (int64_t seq : seq_lens) {
        std::vector<Row> rows;
        for (const Policy& p : kPolicies) {
          rows.push_back(Row{.ranks = n, .seq = seq, .policy = &p, .dtr = {}, .tokens_per_s = 0, .torch = {}});
          train_row(rows.back(), dtrrun, program, steps, warmup,
                    scratch.path() / fmt::format("{}_{}_{}", n, seq, p.peer_name));
        }
        // PyTorch's figures, after dtr's, on the same machine.
        if (!torch_at.empty()) {
          std::string note;
          const std::map<std::string, TorchFigures> torch = torch_figures(python, n, seq, steps - warmup, warmup, note);
          if (!note.empty()) notes.push_back(fmt::format("{} ranks, seq {}: {}", n, seq, note));
          for (Row& r : rows) {
            if (auto it = torch.find(r.policy->peer_name); it != torch.end()) r.torch = it->second;
          }
        }
        print_rows(rows);
        for (std::string& line : goal_lines(rows)) goals.push_back(std::move(line));
        budgets.push_back(budget_line(rows, budget_mib * kMiB));
        groups.push_back(std::move(rows));
      }
    }
    for (const Goal& goal : kGoals) {
      fmt::print("goal: {} cuts activations by >= {:.0f}% for <= {:.0f}% more step time\n", goal.policy,
                 goal.activation_cut, goal.time_cost);
    }
    for (const std::string& goal : goals) fmt::print("  {}\n", goal);
    fmt::print("the largest model each policy trains within the budget (from the peaks at {} and {} layers):\n",
               kLayers, kFewerLayers);
    for (const std::string& budget : budgets) fmt::print("  {}\n", budget);
    for (const std::string& note : notes) fmt::print("{}\n", note);
    write_svg(svg, groups);
    fmt::print("wrote {}\n", svg);
    return 0;
  });
}
