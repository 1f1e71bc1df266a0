// The built-in training corpus: synthetic English-like text that dtr generates itself (its
// own small word lists and templates; nothing is downloaded or copied), so that the train
// program has data with structure at several ranges without any file.
//
// Paragraphs are separated by one blank line ("\n\n") and come in four kinds:
//   story       a template story with a consistent cast: a name introduced with a pronoun
//               (he/she) and referred to again, a place and an object that recur, and
//               sometimes questions about the story ("Who found the kite? Mia.");
//   facts       key-value facts stated, then queried ("The box holds a red key. ...
//               What does the box hold? A red key.");
//   arithmetic  lines such as "17 + 25 = 42." with correct answers;
//   lists       counting, stepping, sorting and reversing ("Sort 9 2 5: 2 5 9.").
// A byte-level LM learns spelling and word order first, then the templates, then the
// long-range copies (names, pronouns, facts, sums), so its loss keeps falling for a while.
// The text is a function of (bytes, seed) alone, byte for byte on every platform: it draws
// from its own splitmix64 with integer arithmetic, never std:: distributions.
#pragma once

#include <cstdint>
#include <string>

namespace dtr::train {

// Whole paragraphs, the last ending in '\n': at least `bytes` bytes and at most one
// paragraph (under 1 KB) more. ValueError when bytes < 1.
std::string builtin_corpus(int64_t bytes, uint64_t seed);

// A text cut in two, train + val == text, both non-empty.
struct CorpusSplit {
  std::string train, val;
};

// Cuts `text` so that val is about its last `val_fraction` (in (0, 1)): at the start of the
// paragraph (just after a blank line "\n\n") nearest to that point; when the text has no
// blank line, at the nearest line start; when it has no line break either, at the byte.
// ValueError for a fraction outside (0, 1) or a text under 2 bytes.
CorpusSplit split_corpus(const std::string& text, double val_fraction);

}  // namespace dtr::train
