#include "tools/train/train_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "kernels/block_reduce.h"
#include "tools/train/corpus.h"

namespace dtr::train {
namespace {

constexpr double kValFraction = 0.05;
constexpr int64_t kCorpusBytes = 4'000'000;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) throw OSError(errno, fmt::format("--data: open {}", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TrainData load_train_data(const TrainConfig& config) {
  TrainData data;
  if (!config.data.empty() && ends_with(config.data, ".bin")) {
    std::vector<uint16_t> tokens = read_token_file(config.data);
    DTR_CHECK(tokens.size() >= 16, ValueError, "--data {}: {} tokens are too few to train on", config.data,
              tokens.size());
    const auto cut = static_cast<std::ptrdiff_t>(static_cast<double>(tokens.size()) * (1 - kValFraction));
    data.train.assign(tokens.begin(), tokens.begin() + cut);
    data.val.assign(tokens.begin() + cut, tokens.end());
    data.vocab = 1 + *std::max_element(tokens.begin(), tokens.end());
    data.source = fmt::format("{} ({} tokens)", config.data, tokens.size());
    return data;
  }
  const std::string text = config.data.empty() ? builtin_corpus(kCorpusBytes, config.seed) : read_text(config.data);
  data.source = config.data.empty() ? fmt::format("built-in corpus ({} bytes)", text.size())
                                    : fmt::format("{} ({} bytes of text)", config.data, text.size());
  const CorpusSplit split = split_corpus(text, kValFraction);
  data.tokenizer =
      config.tokenizer == TokenizerKind::kBpe ? train_bpe(split.train, config.bpe_vocab) : byte_tokenizer();
  data.train = data.tokenizer->encode(split.train);
  data.val = data.tokenizer->encode(split.val);
  data.vocab = data.tokenizer->vocab_size();
  return data;
}

Batch make_batch(const std::vector<uint16_t>& stream, const WindowOrder& order, int64_t first, int64_t rows,
                 int64_t seq_len, const DeviceMesh& mesh, int64_t rank_stride) {
  // Split over the data-parallel mesh dims; the tensor-parallel ranks share theirs.
  Placements batch;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    const bool tensor_parallel = !mesh.dim_names().empty() && mesh.dim_names()[i] == kTensorParallelDim;
    batch.push_back(tensor_parallel ? Replicate() : Shard(0));
  }
  const DTensorSpec spec(mesh, batch, {rows, seq_len}, kInt64);
  const LocalChunk chunk = spec.local_chunk();
  const int64_t local_rows = chunk.shape[0];
  Tensor tokens = Tensor::empty({local_rows, seq_len}, kInt64);
  Tensor targets = Tensor::empty({local_rows, seq_len}, kInt64);
  int64_t* x = tokens.data_ptr<int64_t>();
  int64_t* y = targets.data_ptr<int64_t>();
  const int64_t first_row =
      BatchWindow{.first = first, .count = rows, .rank_stride = rank_stride, .rank_rows = local_rows}.row(
          chunk.offset[0]);
  for (int64_t r = 0; r < local_rows; ++r) {
    const int64_t start = order.start(first_row + r);
    for (int64_t t = 0; t < seq_len; ++t) {
      x[r * seq_len + t] = stream[static_cast<size_t>(start + t)];
      y[r * seq_len + t] = stream[static_cast<size_t>(start + t + 1)];
    }
  }
  // Filled on the host; on a GPU mesh the copies in are queued through pinned staging.
  return {DTensor(tokens.to(mesh.device()), spec), DTensor(targets.to(mesh.device()), spec)};
}

}  // namespace dtr::train
