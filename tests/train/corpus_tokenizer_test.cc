// The built-in corpus and the tokenizers: the corpus is a function of (bytes, seed) (and a
// golden hash pins it across platforms), holds correct sums and sorts, and splits at a
// paragraph; the byte and BPE tokenizers round-trip any bytes, BPE merges by count with
// ties to the smallest pair and encodes in rank order, save/load keep the encodings, and
// bad arguments and files give typed errors that name the value or the file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/testing/test_util.h"
#include "tools/train/corpus.h"
#include "tools/train/tokenizer.h"

namespace dtr::train {
namespace {

namespace fs = std::filesystem;
using testing::MessageContains;

// 64-bit FNV-1a: a platform-independent fingerprint of a text.
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<long long> numbers_in(const std::string& text) {
  std::vector<long long> numbers;
  std::istringstream in(text);
  for (long long n; in >> n;) numbers.push_back(n);
  return numbers;
}

void write_file(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string all_bytes() {
  std::string s;
  for (int b = 0; b < 256; ++b) s += static_cast<char>(b);
  return s;
}

std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen() & 0xFF);
  return s;
}

std::vector<uint16_t> ids(std::initializer_list<int> list) { return std::vector<uint16_t>(list.begin(), list.end()); }

TEST_CASE("builtin_corpus is a function of bytes and seed", "[corpus]") {
  const std::string a = builtin_corpus(200'000, 7);
  CHECK(a == builtin_corpus(200'000, 7));
  CHECK(a != builtin_corpus(200'000, 8));
  // A longer corpus starts with the shorter one: paragraphs are drawn one after another.
  CHECK(builtin_corpus(300'000, 7).compare(0, a.size(), a) == 0);
  // The same bytes on every platform and compiler (g++ 12 and clang++ 14 agree). When the
  // templates change on purpose, print fnv1a(builtin_corpus(65536, 1)) and update this value.
  CHECK(fnv1a(builtin_corpus(65'536, 1)) == 0x4d4e9ac6e77fc64fULL);
}

TEST_CASE("builtin_corpus is whole paragraphs of printable ASCII, just over the size asked", "[corpus]") {
  for (const int64_t bytes : {1, 100, 4097, 1'000'000}) {
    const std::string text = builtin_corpus(bytes, 3);
    INFO("bytes " << bytes << ", got " << text.size());
    CHECK(static_cast<int64_t>(text.size()) >= bytes);
    CHECK(static_cast<int64_t>(text.size()) < bytes + 1024);
    CHECK(text.back() == '\n');
    CHECK(text.substr(text.size() - 2) != "\n\n");
    CHECK(std::all_of(text.begin(), text.end(), [](char c) { return c == '\n' || (c >= ' ' && c <= '~'); }));
  }
  CHECK_THROWS_MATCHES(builtin_corpus(0, 1), ValueError, MessageContains("at least 1"));
}

TEST_CASE("builtin_corpus holds every kind of paragraph, with correct sums and sorts", "[corpus]") {
  const std::string text = builtin_corpus(300'000, 11);
  for (const char* part : {"Once upon a time", " holds a ", "What does the ", " + ", " * ", "Count: ", "Sort ",
                           "Reverse ", " years old.", "Who found the "}) {
    INFO(part);
    CHECK(text.find(part) != std::string::npos);
  }
  int64_t sums = 0, sorts = 0;
  for (const std::string& line : lines_of(text)) {
    long long a = 0, b = 0, c = 0;
    char op = 0;
    int used = 0;
    if (std::sscanf(line.c_str(), "%lld %c %lld = %lld.%n", &a, &op, &b, &c, &used) == 4 &&
        used == static_cast<int>(line.size())) {
      INFO(line);
      CHECK(c == (op == '+' ? a + b : op == '-' ? a - b : a * b));
      CHECK(c >= 0);
      ++sums;
    }
    if (line.rfind("Sort ", 0) == 0) {
      const size_t colon = line.find(": ");
      REQUIRE(colon != std::string::npos);
      std::vector<long long> given = numbers_in(line.substr(5, colon - 5));
      const std::vector<long long> sorted = numbers_in(line.substr(colon + 2, line.size() - colon - 3));
      std::sort(given.begin(), given.end());
      INFO(line);
      CHECK(given == sorted);
      ++sorts;
    }
  }
  CHECK(sums > 100);
  CHECK(sorts > 10);
}

TEST_CASE("split_corpus cuts at the paragraph nearest the fraction", "[corpus]") {
  const std::string text = builtin_corpus(100'000, 5);
  const CorpusSplit split = split_corpus(text, 0.05);
  CHECK(split.train + split.val == text);
  CHECK(split.train.size() >= 2);
  CHECK(split.train.substr(split.train.size() - 2) == "\n\n");
  REQUIRE_FALSE(split.val.empty());
  CHECK(split.val.front() != '\n');
  const double wanted = 0.05 * static_cast<double>(text.size());
  CHECK(std::abs(static_cast<double>(split.val.size()) - wanted) < 1024);

  SECTION("without blank lines, at a line; without lines, at the byte") {
    const CorpusSplit lines = split_corpus("abc\ndef\nghij", 0.4);
    CHECK(lines.train == "abc\ndef\n");
    CHECK(lines.val == "ghij");
    const CorpusSplit bytes = split_corpus("abcdefghij", 0.3);
    CHECK(bytes.train == "abcdefg");
    CHECK(bytes.val == "hij");
    const CorpusSplit tiny = split_corpus("ab", 0.01);
    CHECK(tiny.train == "a");
    CHECK(tiny.val == "b");
  }
  SECTION("bad arguments") {
    CHECK_THROWS_MATCHES(split_corpus(text, 0.0), ValueError, MessageContains("val_fraction"));
    CHECK_THROWS_MATCHES(split_corpus(text, 1.0), ValueError, MessageContains("val_fraction"));
    CHECK_THROWS_MATCHES(split_corpus("a", 0.5), ValueError, MessageContains("1 bytes"));
  }
}

TEST_CASE("the byte tokenizer is the identity on bytes", "[tokenizer]") {
  const auto tok = byte_tokenizer();
  CHECK(tok->vocab_size() == 256);
  CHECK(tok->kind() == "byte");
  const std::string bytes = all_bytes();
  const std::vector<uint16_t> tokens = tok->encode(bytes);
  REQUIRE(tokens.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(tokens[b] == b);
  CHECK(tok->decode(tokens) == bytes);
  CHECK(tok->encode("").empty());
  CHECK_THROWS_MATCHES(tok->decode(ids({65, 256})), IndexError, MessageContains("token 256 at position 1"));
}

TEST_CASE("train_bpe merges the most frequent pair, ties to the smallest ids", "[tokenizer]") {
  // "abab" and " abab": (a, b) occurs 4 times, then (ab, ab) twice.
  const auto tok = train_bpe("abab abab", 258);
  CHECK(tok->vocab_size() == 258);
  CHECK(tok->encode("abab") == ids({257}));
  CHECK(tok->encode(" ab") == ids({' ', 256}));
  CHECK(tok->decode(ids({257, 256})) == "ababab");
  // (' ', c), (a, b), (c, d) each occur once: the smallest pair, (' ', c) = (32, 99), wins.
  CHECK(train_bpe("ab cd", 257)->encode(" cd") == ids({256, 'd'}));
  // Overlapping pairs merge left to right.
  const auto aa = train_bpe("aaa", 257);
  CHECK(aa->encode("aaa") == ids({256, 'a'}));
  CHECK(aa->encode("aaaa") == ids({256, 256}));
  // A text that runs out of pairs gives fewer tokens than asked for.
  CHECK(train_bpe("ab", 1000)->vocab_size() == 257);
  // Merges never cross chunks: " " + "ab" and "ab" + "." stay apart.
  const auto chunks = train_bpe("ab. ab. ab.", 300);
  std::vector<uint16_t> apart = chunks->encode("ab");
  apart.push_back('.');
  CHECK(chunks->encode("ab.") == apart);
  CHECK(chunks->encode(" ab") == ids({257}));
  CHECK(chunks->vocab_size() == 258);
}

TEST_CASE("train_bpe on the corpus: vocab reached, shorter than bytes, round trips", "[tokenizer]") {
  const std::string text = builtin_corpus(300'000, 2);
  const auto tok = train_bpe(text, 512);
  CHECK(tok->kind() == "bpe");
  CHECK(tok->vocab_size() == 512);
  const std::vector<uint16_t> tokens = tok->encode(text);
  CHECK(tokens.size() * 2 < text.size());
  CHECK(std::all_of(tokens.begin(), tokens.end(), [](uint16_t t) { return t < 512; }));
  CHECK(tok->decode(tokens) == text);
  // Training is deterministic.
  CHECK(train_bpe(text, 512)->encode(text) == tokens);
  // Any bytes round-trip, including NUL and 0xFF, text it never saw and the empty string.
  for (const std::string& s : {all_bytes(), random_bytes(5000, 1), std::string("\0\xff\0\xff  \n\n\x80x", 12),
                               std::string(1000, ' '), std::string(600, 'z'), std::string()}) {
    CHECK(tok->decode(tok->encode(s)) == s);
  }
  const auto binary = train_bpe(random_bytes(20'000, 2) + all_bytes(), 400);
  const std::string unseen = random_bytes(3000, 3);
  CHECK(binary->decode(binary->encode(unseen)) == unseen);
  CHECK_THROWS_MATCHES(tok->decode(ids({511, 512})), IndexError, MessageContains("token 512 at position 1"));
}

TEST_CASE("train_bpe refuses a vocab_size outside 257..65535", "[tokenizer]") {
  for (const int64_t bad : {-1, 0, 256, 65536}) {
    CHECK_THROWS_MATCHES(train_bpe("some text", bad), ValueError,
                         MessageContains("vocab_size") && MessageContains(std::to_string(bad)));
  }
}

TEST_CASE("save and load_tokenizer keep the encodings", "[tokenizer]") {
  const fs::path dir = testing::make_temp_dir("tokenizer");
  const std::string text = builtin_corpus(100'000, 4);
  const std::string probe = text.substr(0, 5000) + all_bytes();
  for (const auto& tok : {byte_tokenizer(), train_bpe(text, 700)}) {
    const fs::path path = dir / (tok->kind() + ".json");
    tok->save(path.string());
    const auto loaded = load_tokenizer(path.string());
    CHECK(loaded->kind() == tok->kind());
    CHECK(loaded->vocab_size() == tok->vocab_size());
    CHECK(loaded->encode(probe) == tok->encode(probe));
    CHECK(loaded->decode(loaded->encode(probe)) == probe);
  }
  CHECK_THROWS_MATCHES(byte_tokenizer()->save((dir / "no" / "such" / "dir.json").string()), OSError,
                       MessageContains("dir.json"));
}

TEST_CASE("load_tokenizer refuses missing and malformed files, naming them", "[tokenizer]") {
  const fs::path dir = testing::make_temp_dir("tokenizer");
  const std::string missing = (dir / "missing.json").string();
  CHECK_THROWS_MATCHES(load_tokenizer(missing), OSError, MessageContains(missing));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not valid JSON"},
      {"[1, 2]", "JSON object"},
      {R"({"kind": "wordpiece", "vocab_size": 256})", "unknown kind"},
      {R"({"kind": "byte"})", "vocab_size"},
      {R"({"kind": "byte", "vocab_size": 300})", "vocab_size 256"},
      {R"({"kind": "bpe", "vocab_size": 257})", "merges"},
      {R"({"kind": "bpe", "vocab_size": 258, "merges": [[97, 98]]})", "does not match"},
      {R"({"kind": "bpe", "vocab_size": 257, "merges": [[97]]})", "not a pair"},
      {R"({"kind": "bpe", "vocab_size": 257, "merges": [[97, -1]]})", "not a pair"},
      {R"({"kind": "bpe", "vocab_size": 257, "merges": [[97, 256]]})", "does not exist yet"},
      {R"({"kind": "bpe", "vocab_size": 258, "merges": [[97, 98], [97, 98]]})", "repeats"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = (dir / ("bad" + std::to_string(i) + ".json")).string();
    write_file(path, cases[i].first);
    INFO(cases[i].first);
    CHECK_THROWS_MATCHES(load_tokenizer(path), ValueError, MessageContains(path) && MessageContains(cases[i].second));
  }
}

}  // namespace
}  // namespace dtr::train
