// Token data for the train program: nanoGPT's token files, and the exact order in which
// windows of a token stream form the global batches.
//
// A token stream of n tokens is cut into windows of seq_len + 1 tokens (a sequence and its
// next-token targets) at stride seq_len: window w starts at token w * seq_len, for
// 0 <= w < W = (n - 1) / seq_len. The run reads windows in one order, numbered i = 0, 1, ...
// (i = (step * grad_accum + micro) * micro_batch + b for sequence b of a micro-batch):
//   sequential  window i mod W, so step s of a run without accumulation takes the windows
//               s*B .. s*B + B - 1 (mod W) for a global batch of B sequences;
//   shuffled    window perm_e(i mod W) with e = i / W, perm_e a permutation of 0..W-1
//               drawn from (seed, e) (Fisher-Yates on splitmix64), so every epoch sees every
//               window once.
// Each rank reads only its rows of every micro-batch (the batch dim is Shard(0)).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtr::train {

enum class DataOrder : uint8_t { kSequential, kShuffled };

// A file of tokens as nanoGPT writes them: a flat little-endian uint16 array (.bin).
std::vector<uint16_t> read_token_file(const std::string& path);

class WindowOrder {
 public:
  // ValueError naming `split` ("training", "held-out") when the stream holds no window
  // (n < seq_len + 1).
  WindowOrder(int64_t num_tokens, int64_t seq_len, DataOrder order, uint64_t seed, std::string_view split);
  int64_t num_windows() const { return num_windows_; }
  // The first token of the run's i-th window.
  int64_t start(int64_t i) const;

 private:
  int64_t num_windows_, seq_len_;
  DataOrder order_;
  uint64_t seed_;
  mutable int64_t epoch_ = -1;  // whose permutation perm_ holds
  mutable std::vector<int64_t> perm_;
};

}  // namespace dtr::train
