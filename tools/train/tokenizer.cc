#include "tools/train/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <limits>
#include <queue>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace dtr::train {
namespace {

using Json = nlohmann::json;
using Merge = std::pair<uint16_t, uint16_t>;  // (left, right) token ids

constexpr int64_t kByteVocab = 256;
constexpr int64_t kMaxVocab = 65535;  // ids 0..65534 fit uint16
constexpr size_t kMaxChunk = 255;     // bytes; no chunk (so no token) is longer

enum class ByteClass : uint8_t { kSpace, kLetter, kDigit, kOther };

ByteClass byte_class(char byte) {
  const auto c = static_cast<unsigned char>(byte);
  if (c == ' ' || (c >= '\t' && c <= '\r')) return ByteClass::kSpace;  // space \t \n \v \f \r
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return ByteClass::kLetter;
  if (c >= '0' && c <= '9') return ByteClass::kDigit;
  return ByteClass::kOther;
}

// Calls f(chunk) for the chunks of `text` in order (the rules in tokenizer.h); they
// concatenate to `text`. "Hi  there\n\n42." gives "Hi", " ", " there", "\n\n", "42", ".".
template <class F>
void for_each_chunk(std::string_view text, F&& f) {
  const size_t n = text.size();
  const auto is_space = [&](size_t k) { return byte_class(text[k]) == ByteClass::kSpace; };
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    const bool word_space = text[i] == ' ' && i + 1 < n && !is_space(i + 1);
    if (is_space(i) && !word_space) {
      while (i < n && is_space(i) && i - start < kMaxChunk) ++i;
      // Leave the run's last space to the word that follows it.
      if (i < n && !is_space(i) && i - start > 1 && text[i - 1] == ' ') --i;
    } else {
      if (word_space) ++i;
      const ByteClass run = byte_class(text[i]);
      while (i < n && byte_class(text[i]) == run && i - start < kMaxChunk) ++i;
    }
    f(text.substr(start, i - start));
  }
}

uint32_t pair_key(uint16_t left, uint16_t right) { return (static_cast<uint32_t>(left) << 16) | right; }

// Replaces each (left, right) in `symbols` by `merged`, scanning left to right, so that
// overlapping pairs merge greedily: [a a a] with (a, a) gives [m a]. Afterwards no
// (left, right) is left adjacent.
void merge_pair(std::vector<uint16_t>& symbols, uint16_t left, uint16_t right, uint16_t merged) {
  size_t out = 0;
  for (size_t i = 0; i < symbols.size(); ++out) {
    if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
      symbols[out] = merged;
      i += 2;
    } else {
      symbols[out] = symbols[i];
      i += 1;
    }
  }
  symbols.resize(out);
}

std::vector<uint16_t> bytes_of(std::string_view chunk) {
  std::vector<uint16_t> symbols(chunk.size());
  for (size_t i = 0; i < chunk.size(); ++i) symbols[i] = static_cast<unsigned char>(chunk[i]);
  return symbols;
}

void check_token(uint16_t id, size_t position, int64_t vocab, std::string_view kind) {
  DTR_CHECK(id < vocab, IndexError, "decode: token {} at position {} is outside the {} tokenizer's ids 0..{}", id,
            position, kind, vocab - 1);
}

void write_json(const std::string& path, const Json& json) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw OSError(errno, fmt::format("Tokenizer::save: open('{}')", path));
  out << json.dump() << '\n';
  out.flush();
  if (!out) throw OSError(errno, fmt::format("Tokenizer::save: write('{}')", path));
}

class ByteTokenizer final : public Tokenizer {
 public:
  int64_t vocab_size() const override { return kByteVocab; }
  std::vector<uint16_t> encode(std::string_view text) const override { return bytes_of(text); }
  std::string decode(std::span<const uint16_t> tokens) const override {
    std::string text(tokens.size(), '\0');
    for (size_t i = 0; i < tokens.size(); ++i) {
      check_token(tokens[i], i, kByteVocab, "byte");
      text[i] = static_cast<char>(tokens[i]);
    }
    return text;
  }
  std::string kind() const override { return "byte"; }
  void save(const std::string& path) const override { write_json(path, {{"kind", "byte"}, {"vocab_size", 256}}); }
};

class BpeTokenizer final : public Tokenizer {
 public:
  // merges[r] makes token 256 + r; both of its ids must be below 256 + r (the callers check).
  explicit BpeTokenizer(std::vector<Merge> merges) : merges_(std::move(merges)) {
    pieces_.reserve(kByteVocab + merges_.size());
    for (int b = 0; b < kByteVocab; ++b) pieces_.emplace_back(1, static_cast<char>(b));
    for (size_t r = 0; r < merges_.size(); ++r) {
      const auto [left, right] = merges_[r];
      DTR_INTERNAL_ASSERT(left < pieces_.size() && right < pieces_.size(), "merge {} = ({}, {}) names a later token", r,
                          left, right);
      rank_.emplace(pair_key(left, right), static_cast<uint32_t>(r));
      pieces_.push_back(pieces_[left] + pieces_[right]);
    }
  }
  int64_t vocab_size() const override { return kByteVocab + static_cast<int64_t>(merges_.size()); }

  std::vector<uint16_t> encode(std::string_view text) const override {
    std::vector<uint16_t> tokens;
    tokens.reserve(text.size() / 2);
    // Text repeats its chunks (words), so each distinct one is encoded once per call.
    std::unordered_map<std::string_view, std::vector<uint16_t>> cache;
    for_each_chunk(text, [&](std::string_view chunk) {
      auto it = cache.find(chunk);
      if (it == cache.end()) it = cache.emplace(chunk, encode_chunk(chunk)).first;
      tokens.insert(tokens.end(), it->second.begin(), it->second.end());
    });
    return tokens;
  }

  std::string decode(std::span<const uint16_t> tokens) const override {
    std::string text;
    for (size_t i = 0; i < tokens.size(); ++i) {
      check_token(tokens[i], i, vocab_size(), "bpe");
      text += pieces_[tokens[i]];
    }
    return text;
  }

  std::string kind() const override { return "bpe"; }

  void save(const std::string& path) const override {
    Json merges = Json::array();
    for (const auto& [left, right] : merges_) merges.push_back(Json::array({left, right}));
    write_json(path, {{"kind", "bpe"}, {"vocab_size", vocab_size()}, {"merges", std::move(merges)}});
  }

 private:
  // Applies the merges in rank order: a merge only makes pairs with its new token, so
  // merging the lowest-ranked pair present, again and again, is the same as rank order.
  std::vector<uint16_t> encode_chunk(std::string_view chunk) const {
    std::vector<uint16_t> symbols = bytes_of(chunk);
    constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
    while (symbols.size() >= 2) {
      uint32_t best = kNone;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const auto it = rank_.find(pair_key(symbols[i], symbols[i + 1]));
        if (it != rank_.end()) best = std::min(best, it->second);
      }
      if (best == kNone) break;
      merge_pair(symbols, merges_[best].first, merges_[best].second, static_cast<uint16_t>(kByteVocab + best));
    }
    return symbols;
  }

  std::vector<Merge> merges_;
  std::unordered_map<uint32_t, uint32_t> rank_;  // pair_key(left, right) -> merge rank
  std::vector<std::string> pieces_;              // token id -> its bytes
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> train_bpe(std::string_view text, int64_t vocab_size) {
  DTR_CHECK(vocab_size > kByteVocab && vocab_size <= kMaxVocab, ValueError,
            "train_bpe: vocab_size must be in {}..{} (the 256 byte tokens, at least one merge, ids that fit uint16), "
            "got {}",
            kByteVocab + 1, kMaxVocab, vocab_size);
  // Training works on the distinct chunks ("words"), each weighted by how often it occurs.
  // Their order (a hash map's) does not matter: counts are sums and ties go by pair ids.
  struct Word {
    std::vector<uint16_t> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  {
    std::unordered_map<std::string_view, int64_t> chunk_counts;
    for_each_chunk(text, [&](std::string_view chunk) { ++chunk_counts[chunk]; });
    for (const auto& [chunk, count] : chunk_counts) {
      if (chunk.size() >= 2) words.push_back({bytes_of(chunk), count});
    }
  }

  // pair_counts: occurrences of each adjacent pair, over all words and weighted;
  // pair_words: for each pair, the words that held it when it was counted (a word may have
  // lost it since, so a merge checks again).
  std::unordered_map<uint32_t, int64_t> pair_counts;
  std::unordered_map<uint32_t, std::vector<int32_t>> pair_words;
  const auto note_word = [&](uint32_t key, int32_t w) {
    std::vector<int32_t>& list = pair_words[key];
    if (list.empty() || list.back() != w) list.push_back(w);
  };
  for (size_t w = 0; w < words.size(); ++w) {
    const std::vector<uint16_t>& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint32_t key = pair_key(s[i], s[i + 1]);
      pair_counts[key] += words[w].count;
      note_word(key, static_cast<int32_t>(w));
    }
  }

  // A max-heap of (count, pair) with stale entries left in: a pair's count only falls
  // after it is pushed (a merge makes new pairs only with its new token, and those are
  // pushed then), so an entry that disagrees with pair_counts is re-pushed with the
  // current count, and the first entry that agrees is the most frequent pair. Ties go to
  // the smallest (left, right).
  struct Candidate {
    int64_t count;
    uint32_t key;
  };
  const auto lower = [](const Candidate& a, const Candidate& b) {
    return a.count != b.count ? a.count < b.count : a.key > b.key;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower)> heap(lower);
  for (const auto& [key, count] : pair_counts) heap.push({count, key});

  std::vector<Merge> merges;
  std::vector<int64_t> visited(words.size(), -1);  // the last merge that revisited each word
  std::vector<uint32_t> fresh;                     // the pairs a merge made
  while (kByteVocab + static_cast<int64_t>(merges.size()) < vocab_size && !heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const auto found = pair_counts.find(top.key);
    const int64_t count = found == pair_counts.end() ? 0 : found->second;
    if (count != top.count) {
      if (count > 0) heap.push({count, top.key});
      continue;
    }
    const auto rank = static_cast<int64_t>(merges.size());
    const auto left = static_cast<uint16_t>(top.key >> 16), right = static_cast<uint16_t>(top.key & 0xFFFF);
    const auto merged = static_cast<uint16_t>(kByteVocab + rank);
    merges.emplace_back(left, right);

    // Revisit only the words that held the pair: uncount all their pairs, merge, count again.
    const std::vector<int32_t> holders = std::move(pair_words[top.key]);
    pair_words.erase(top.key);
    fresh.clear();
    for (const int32_t w : holders) {
      if (visited[w] == rank) continue;
      visited[w] = rank;
      std::vector<uint16_t>& s = words[w].symbols;
      bool holds = false;
      for (size_t i = 0; i + 1 < s.size() && !holds; ++i) holds = s[i] == left && s[i + 1] == right;
      if (!holds) continue;
      const int64_t weight = words[w].count;
      for (size_t i = 0; i + 1 < s.size(); ++i) pair_counts[pair_key(s[i], s[i + 1])] -= weight;
      merge_pair(s, left, right, merged);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint32_t key = pair_key(s[i], s[i + 1]);
        pair_counts[key] += weight;
        if (s[i] == merged || s[i + 1] == merged) {
          note_word(key, w);
          fresh.push_back(key);
        }
      }
    }
    const auto gone = pair_counts.find(top.key);
    DTR_INTERNAL_ASSERT(gone != pair_counts.end() && gone->second == 0, "train_bpe: pair ({}, {}) left after merge {}",
                        left, right, rank);
    pair_counts.erase(gone);
    std::sort(fresh.begin(), fresh.end());
    fresh.erase(std::unique(fresh.begin(), fresh.end()), fresh.end());
    for (const uint32_t key : fresh) heap.push({pair_counts[key], key});
  }
  return std::make_unique<BpeTokenizer>(std::move(merges));
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw OSError(errno, fmt::format("load_tokenizer: open('{}')", path));
  std::stringstream text;
  text << in.rdbuf();
  Json json;
  try {
    json = Json::parse(text.str());
  } catch (const Json::exception& e) {
    throw ValueError(fmt::format("tokenizer file '{}' is not valid JSON: {}", path, e.what()));
  }
  DTR_CHECK(json.is_object() && json.contains("kind") && json.at("kind").is_string(), ValueError,
            "tokenizer file '{}': expected a JSON object with a string \"kind\" (\"byte\" or \"bpe\")", path);
  const auto kind = json.at("kind").get<std::string>();
  DTR_CHECK(kind == "byte" || kind == "bpe", ValueError,
            "tokenizer file '{}': unknown kind \"{}\"; expected \"byte\" or \"bpe\"", path, kind);
  DTR_CHECK(json.contains("vocab_size") && json.at("vocab_size").is_number_integer(), ValueError,
            "tokenizer file '{}': expected an integer \"vocab_size\"", path);
  const auto vocab = json.at("vocab_size").get<int64_t>();
  if (kind == "byte") {
    DTR_CHECK(vocab == kByteVocab, ValueError, "tokenizer file '{}': a byte tokenizer has vocab_size 256, not {}", path,
              vocab);
    return byte_tokenizer();
  }
  DTR_CHECK(json.contains("merges") && json.at("merges").is_array(), ValueError,
            "tokenizer file '{}': a bpe tokenizer needs an array \"merges\" of [left, right] pairs", path);
  const Json& list = json.at("merges");
  const int64_t expected = kByteVocab + static_cast<int64_t>(list.size());
  DTR_CHECK(vocab == expected && vocab <= kMaxVocab, ValueError,
            "tokenizer file '{}': vocab_size {} does not match its {} merges (256 + merges = {}, at most {})", path,
            vocab, list.size(), expected, kMaxVocab);
  std::vector<Merge> merges;
  std::set<uint32_t> seen;
  for (size_t r = 0; r < list.size(); ++r) {
    const Json& m = list[r];
    const bool pair = m.is_array() && m.size() == 2 && m[0].is_number_unsigned() && m[1].is_number_unsigned();
    DTR_CHECK(pair, ValueError, "tokenizer file '{}': merge {} is {}, not a pair [left, right] of token ids", path, r,
              m.dump());
    const auto left = m[0].get<uint64_t>(), right = m[1].get<uint64_t>();
    const uint64_t limit = kByteVocab + r;
    DTR_CHECK(left < limit && right < limit, ValueError,
              "tokenizer file '{}': merge {} = [{}, {}] names a token that does not exist yet (ids below {})", path, r,
              left, right, limit);
    DTR_CHECK(seen.insert(pair_key(left, right)).second, ValueError,
              "tokenizer file '{}': merge {} = [{}, {}] repeats an earlier merge", path, r, left, right);
    merges.emplace_back(left, right);
  }
  return std::make_unique<BpeTokenizer>(std::move(merges));
}

}  // namespace dtr::train
