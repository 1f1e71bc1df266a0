// The train program's data: the token streams (train and held-out) from the built-in
// corpus, a text file or a nanoGPT token file, and the batches each rank reads from them.
//
// Text (the corpus or --data FILE.txt) is tokenised by the byte tokenizer or a BPE trained
// on its training part; the held-out split is the corpus's last 5% (cut at a paragraph),
// or a token file's last 5% of tokens. Batches follow token_data.h's window order; a rank
// copies only its own rows of each micro-batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/dtensor.h"
#include "tools/train/token_data.h"
#include "tools/train/tokenizer.h"
#include "tools/train/train_config.h"

namespace dtr::train {

struct TrainData {
  std::unique_ptr<Tokenizer> tokenizer;  // null for a token file (ids are taken as they are)
  std::vector<uint16_t> train, val;
  std::string source;  // "built-in corpus (N bytes)", or the file
  int64_t vocab = 0;   // the tokenizer's, or 1 + the largest id in a token file
};

// Loads and tokenises what --data (or its absence) names.
TrainData load_train_data(const TrainConfig& config);

// One micro-batch: tokens [rows, seq_len] and next-token targets [rows, seq_len], sharded
// over every mesh dim (Shard(0) of the batch); the local rows are this rank's.
struct Batch {
  DTensor tokens, targets;
};

// The micro-batch of `rows` sequences whose first sequence is the run's window `first` in
// `order` over `stream`; with rank_stride > 0 rank-major (kernels/block_reduce.h's
// BatchWindow): each data-parallel rank's rows start rank_stride windows after the previous
// rank's.
Batch make_batch(const std::vector<uint16_t>& stream, const WindowOrder& order, int64_t first, int64_t rows,
                 int64_t seq_len, const DeviceMesh& mesh, int64_t rank_stride = 0);

}  // namespace dtr::train
