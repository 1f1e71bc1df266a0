#include "tools/train/token_data.h"

#include <bit>
#include <cerrno>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"

namespace dtr::train {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static_assert(std::endian::native == std::endian::little, "token files are little-endian; this host is not");

}  // namespace

std::vector<uint16_t> read_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in.good()) throw OSError(errno, fmt::format("open token file {}", path));
  const std::streamsize bytes = in.tellg();
  DTR_CHECK(bytes % 2 == 0, ValueError,
            "train: token file {} holds {} bytes, not a whole number of uint16 tokens (nanoGPT's .bin format)", path,
            bytes);
  std::vector<uint16_t> tokens(static_cast<size_t>(bytes / 2));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(tokens.data()), bytes);
  if (!in.good() && bytes > 0) throw OSError(errno, fmt::format("read token file {}", path));
  return tokens;
}

WindowOrder::WindowOrder(int64_t num_tokens, int64_t seq_len, DataOrder order, uint64_t seed, std::string_view split)
    : num_windows_(seq_len > 0 && num_tokens > 0 ? (num_tokens - 1) / seq_len : 0),
      seq_len_(seq_len),
      order_(order),
      seed_(seed) {
  DTR_CHECK(num_windows_ > 0, ValueError,
            "the {} split's {} tokens hold no window of --seq-len {} + 1 tokens; give more data (--data) or a shorter "
            "--seq-len",
            split, num_tokens, seq_len);
}

int64_t WindowOrder::start(int64_t i) const {
  const int64_t w = i % num_windows_;
  if (order_ == DataOrder::kSequential) return w * seq_len_;
  const int64_t epoch = i / num_windows_;
  if (epoch != epoch_) {
    perm_.resize(static_cast<size_t>(num_windows_));
    for (int64_t k = 0; k < num_windows_; ++k) perm_[static_cast<size_t>(k)] = k;
    uint64_t state = seed_ ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ULL);
    for (int64_t k = num_windows_ - 1; k > 0; --k) {
      const auto j = static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(k + 1));
      std::swap(perm_[static_cast<size_t>(k)], perm_[static_cast<size_t>(j)]);
    }
    epoch_ = epoch;
  }
  return perm_[static_cast<size_t>(w)] * seq_len_;
}

}  // namespace dtr::train
