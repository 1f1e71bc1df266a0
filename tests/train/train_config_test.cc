// The train program's flags that take one of a few names: each name parses into its enum
// (config.json writes the same name back), the defaults are the documented ones, and any
// other value is one line naming the flag, the value and the legal names. (train_test runs
// the program itself with bad flags.)
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/train/train_config.h"

namespace dtr::train {
namespace {

// `command_line` parsed into a fresh configuration.
TrainConfig parsed(const std::string& command_line) {
  CLI::App app;
  TrainConfig config;
  add_train_flags(app, config);
  app.parse(command_line, /*program_name_included=*/false);
  return config;
}

// The one line CLI11 has for `command_line` ("" when it parses).
std::string parse_error(const std::string& command_line) {
  try {
    parsed(command_line);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("train's flags default to the documented names", "[train][flags]") {
  const TrainConfig c = parsed("");
  CHECK(c.arch == Arch::kGpt);
  CHECK_FALSE(c.causal.has_value());
  CHECK(c.lr_schedule == optim::LRDecay::kCosine);
  CHECK(c.parallel == Parallel::kFsdp);
  CHECK(c.reshard_after_forward == ReshardAfterForward(true));
  CHECK(c.device == kCPU);
  CHECK(c.data_order == DataOrder::kSequential);
  CHECK(c.tokenizer == TokenizerKind::kByte);
  const nlohmann::json j = to_json(c);
  CHECK(j.at("arch") == "gpt");
  CHECK(j.at("causal") == true);
  CHECK(j.at("pos_embed") == true);
  CHECK(j.at("lr_schedule") == "cosine");
  CHECK(j.at("parallel") == "fsdp");
  CHECK(j.at("reshard_after_forward") == "true");
  CHECK(j.at("device") == "cpu");
  CHECK(j.at("data_order") == "sequential");
  CHECK(j.at("tokenizer") == "byte");
}

TEST_CASE("every name of every enum flag parses, and config.json writes it back", "[train][flags]") {
  struct Flag {
    std::string flag, key;  // key: config.json's
    std::vector<std::string> names;
  };
  const std::vector<Flag> flags = {
      {"--arch", "arch", {"seed", "gpt"}},
      {"--lr-schedule", "lr_schedule", {"cosine", "linear", "constant"}},
      {"--parallel", "parallel", {"fsdp", "hsdp", "ddp", "none"}},
      {"--reshard-after-forward", "reshard_after_forward", {"true", "false", "1", "2", "8"}},
      {"--device", "device", {"cpu", "cuda"}},
      {"--data-order", "data_order", {"sequential", "shuffled"}},
      {"--tokenizer", "tokenizer", {"byte", "bpe"}},
  };
  for (const Flag& f : flags) {
    for (const std::string& name : f.names) {
      INFO(f.flag << " " << name);
      CHECK(to_json(parsed(f.flag + " " + name)).at(f.key) == name);
    }
  }
  CHECK(parsed("--parallel ddp").parallel == Parallel::kDdp);
  CHECK(parsed("--lr-schedule linear").lr_schedule == optim::LRDecay::kLinear);
  CHECK(parsed("--device cuda").device == kCUDA);
  CHECK(parsed("--tokenizer bpe").tokenizer == TokenizerKind::kBpe);
  CHECK(parsed("--data-order shuffled").data_order == DataOrder::kShuffled);
  CHECK(parsed("--reshard-after-forward false").reshard_after_forward == ReshardAfterForward(false));
  CHECK(parsed("--reshard-after-forward 4").reshard_after_forward == ReshardAfterForward(4));
}

TEST_CASE("--arch and its four overrides", "[train][flags]") {
  const ArchSwitches seed = arch_switches(parsed("--arch seed"));
  CHECK(seed.causal);
  CHECK_FALSE(seed.pos_embed);
  CHECK_FALSE(seed.final_norm);
  CHECK_FALSE(seed.tie_embeddings);
  const TrainConfig c = parsed("--arch seed --causal false --pos-embed true --final-norm true --tie-embeddings true");
  CHECK(c.causal == false);
  const ArchSwitches overridden = arch_switches(c);
  CHECK_FALSE(overridden.causal);
  CHECK(overridden.pos_embed);
  CHECK(overridden.final_norm);
  CHECK(overridden.tie_embeddings);
  CHECK(to_json(c).at("arch") == "seed");
  CHECK(to_json(c).at("causal") == false);
  const ArchSwitches gpt = arch_switches(parsed("--final-norm false"));
  CHECK(gpt.causal);
  CHECK(gpt.pos_embed);
  CHECK_FALSE(gpt.final_norm);
  CHECK(gpt.tie_embeddings);
}

TEST_CASE("a bad value of an enum flag is one line naming the flag, the value and the legal names", "[train][flags]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--arch llama", "--arch: llama not in {seed,gpt}"},
      {"--causal yes", "--causal: yes not in {true,false}"},
      {"--pos-embed 1", "--pos-embed: 1 not in {true,false}"},
      {"--final-norm TRUE", "--final-norm: TRUE not in {true,false}"},
      {"--tie-embeddings no", "--tie-embeddings: no not in {true,false}"},
      {"--lr-schedule exp", "--lr-schedule: exp not in {cosine,linear,constant}"},
      {"--parallel tp", "--parallel: tp not in {fsdp,hsdp,ddp,none}"},
      {"--device tpu", "--device: tpu not in {cpu,cuda}"},
      {"--data-order random", "--data-order: random not in {sequential,shuffled}"},
      {"--tokenizer wordpiece", "--tokenizer: wordpiece not in {byte,bpe}"},
      {"--reshard-after-forward maybe",
       "--reshard-after-forward: got 'maybe'; legal: true, false or a rank count N >= 1"},
      {"--reshard-after-forward 0", "--reshard-after-forward: got '0'; legal: true, false or a rank count N >= 1"},
      {"--reshard-after-forward -2", "--reshard-after-forward: got '-2'; legal: true, false or a rank count N >= 1"},
      {"--reshard-after-forward 2x", "--reshard-after-forward: got '2x'; legal: true, false or a rank count N >= 1"},
      {"--reshard-after-forward 4294967296",
       "--reshard-after-forward: got '4294967296'; legal: true, false or a rank count N >= 1"},
  };
  for (const auto& [command_line, expected] : cases) {
    INFO(command_line);
    CHECK(parse_error(command_line) == expected);
  }
  CHECK_THROWS_AS(parsed("--parallel fsdp --parallel ddp"), CLI::ParseError);
}

TEST_CASE("--deterministic splits a step into nodes of the canonical tree, or rank-major shares and lists",
          "[train][flags]") {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  auto ranges = [](const std::string& flags, int64_t ranks) {
    Ranges out;
    for (const MicroBatch& m : micro_batches(parsed(flags), ranks)) out.emplace_back(m.first, m.rows);
    return out;
  };
  // Without the mode: --grad-accum equal ranges.
  CHECK(ranges("--batch-size 12 --grad-accum 3", 2) == Ranges{{0, 4}, {4, 4}, {8, 4}});
  // On a power of two of ranks: each micro-batch as the nodes covering it.
  CHECK(ranges("--deterministic --batch-size 12", 2) == Ranges{{0, 8}, {8, 4}});
  CHECK(ranges("--deterministic --batch-size 12 --grad-accum 2", 1) == Ranges{{0, 4}, {4, 2}, {6, 2}, {8, 4}});
  CHECK(ranges("--deterministic --batch-size 16", 2) == Ranges{{0, 16}});
  CHECK(ranges("--deterministic --batch-size 12", 1) == Ranges{{0, 12}});  // one rank holds the batch
  // Rank-major (3 ranks, or bf16): rank 0's first sequence, every rank's rows; each rank's
  // share of a micro-batch in nodes of the largest power of two dividing it.
  CHECK(ranges("--deterministic --batch-size 18", 3) == Ranges{{0, 6}, {2, 6}, {4, 6}});
  CHECK(ranges("--deterministic --batch-size 24 --grad-accum 2", 3) == Ranges{{0, 12}, {4, 12}});
  CHECK(ranges("--deterministic --batch-size 12", 3) == Ranges{{0, 12}});
  CHECK(ranges("--deterministic --mixed-precision --batch-size 12", 2) == Ranges{{0, 4}, {2, 4}, {4, 4}});
  // Lists of nodes where a rank's share of the step is no node, or hsdp's shard groups may be none.
  CHECK(rank_shares_are_node_lists(parsed("--deterministic --batch-size 18"), 3));
  CHECK_FALSE(rank_shares_are_node_lists(parsed("--deterministic --batch-size 24 --grad-accum 2"), 3));
  CHECK_FALSE(rank_shares_are_node_lists(parsed("--deterministic --batch-size 12"), 3));
  CHECK_FALSE(rank_shares_are_node_lists(parsed("--deterministic --batch-size 12"), 2));
  CHECK(rank_shares_are_node_lists(parsed("--deterministic --batch-size 12 --parallel hsdp"), 6));  // 2 x 3
  CHECK_FALSE(rank_shares_are_node_lists(
      parsed("--deterministic --batch-size 12 --parallel hsdp --mesh replicate=3,shard=2"), 6));  // groups are nodes
  CHECK_FALSE(rank_major_micro_batches(
      parsed("--deterministic --batch-size 12 --parallel hsdp --mesh replicate=3,shard=2"), 6));
  CHECK(rank_shares_are_node_lists(parsed("--deterministic --mixed-precision --batch-size 12"), 2));
  CHECK_FALSE(rank_major_micro_batches(parsed("--batch-size 18 --grad-accum 3"), 3));  // the mode is off
}

TEST_CASE("--deterministic takes every layout but tensor parallelism that splits a block", "[train][flags]") {
  const std::string det = "--deterministic --tie-embeddings false ";
  // Any number of ranks and sequences each (shares that cut the tree's nodes run as nodes or
  // lists of them); a sequence length and a global token count that are not powers of two
  // (the loss's mean divides each sequence's sum).
  const std::vector<std::pair<std::string, int64_t>> accepted = {
      {"--batch-size 12", 3},
      {"--batch-size 12 --seq-len 12", 1},
      {"--batch-size 24 --parallel ddp", 3},
      {"--batch-size 12 --parallel hsdp --mesh replicate=3,shard=1", 3},
      {"--batch-size 12 --parallel hsdp --mesh replicate=1,shard=3", 3},
      {"--batch-size 12 --parallel hsdp --mesh replicate=3,shard=2", 6},
      {"--batch-size 16 --grad-accum 4", 2},
      {"--batch-size 12 --grad-accum 3", 1},
      {"--batch-size 24 --grad-accum 3", 4},
      {"--batch-size 24 --grad-accum 2", 3},  // rank-major: each rank's 8 sequences one node
      // On a power of two of ranks any share: the micro-batches split into nodes.
      {"--batch-size 12", 2},
      {"--batch-size 24", 8},
      {"--batch-size 12 --grad-accum 2", 1},
      {"--batch-size 9 --grad-accum 3", 1},
      {"--batch-size 36 --grad-accum 3 --parallel hsdp --mesh replicate=2,shard=2", 4},
      // Elsewhere rank-major, shares that are no node reduced as lists of nodes.
      {"--batch-size 18", 3},
      {"--batch-size 36 --grad-accum 3", 3},
      {"--batch-size 12 --parallel hsdp --mesh replicate=2,shard=3", 6},
      {"--mixed-precision --batch-size 12", 2},
      {"--mixed-precision --batch-size 24 --grad-accum 3", 2},
      // Tensor parallelism: each tp rank a power of two of the feature blocks (one rank: any number).
      {"--feature-blocks 6 --dim 48 --heads 3", 1},
      {"--tp 2 --feature-blocks 2 --parallel none", 2},
      {"--tp 2 --feature-blocks 4", 4},
      {"--tp 3 --heads 3 --dim 48 --feature-blocks 6 --parallel none", 3},
      {"--mixed-precision --batch-size 16", 2},
      {"--mixed-precision --batch-size 16 --grad-accum 2", 2},
      {"--mixed-precision --batch-size 16 --parallel hsdp --mesh replicate=2,shard=2", 4},
  };
  for (const auto& [flags, ranks] : accepted) {
    INFO(flags << " on " << ranks << " ranks");
    CHECK_NOTHROW(validate(parsed(det + flags), ranks));
  }
  // Tensor parallelism that splits a block, named with what would not.
  const std::vector<std::tuple<std::string, int64_t, std::string>> refused = {
      // Tensor parallelism without whole blocks per rank, or splitting a sequence or the vocabulary.
      {"--tp 2 --parallel none", 2,
       "--deterministic with --tp 2 and --feature-blocks 1: each tp rank must sum a power of two of whole blocks of "
       "every contraction it splits; use --feature-blocks 2 (and the same in the runs you compare)"},
      {"--tp 2 --feature-blocks 6 --parallel none", 2,
       "--deterministic with --tp 2 and --feature-blocks 6: each tp rank must sum a power of two of whole blocks of "
       "every contraction it splits; use --feature-blocks 4"},
      {"--feature-blocks 3", 1,
       "--deterministic with --feature-blocks 3: the contractions over --dim 128 and the FFN's 512 features must "
       "split into 3 equal blocks; use a block count dividing --dim"},
      {"--tp 2 --feature-blocks 2 --parallel none --sequence-parallel", 2,
       "--deterministic with --sequence-parallel: it splits a reduction block (a sequence's tokens, or the "
       "vocabulary's sum of exponentials) over the tp ranks; drop it"},
      {"--tp 2 --feature-blocks 2 --parallel none --loss-parallel", 2, "--deterministic with --loss-parallel"},
  };
  for (const auto& [flags, ranks, expected] : refused) {
    INFO(flags << " on " << ranks << " ranks");
    CHECK_THROWS_WITH(validate(parsed(det + flags), ranks), Catch::Contains(expected));
  }
  for (const char* parallel : {"ddp", "none"}) {
    CHECK_THROWS_WITH(validate(parsed(fmt::format("--mixed-precision --parallel {}", parallel)), 1),
                      fmt::format("--mixed-precision is fully_shard's bf16 policy: --parallel {} would train in "
                                  "float32; use --parallel fsdp or hsdp",
                                  parallel));
  }
  CHECK_THROWS_WITH(validate(parsed("--feature-blocks 2"), 1),
                    "--feature-blocks 2: it fixes the blocks --deterministic sums in; add --deterministic");
}

}  // namespace
}  // namespace dtr::train
