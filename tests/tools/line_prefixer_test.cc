// LinePrefixer: however the bytes are cut into reads, the output is the input's lines, each
// prefixed once, with over-long lines cut at kMaxLineBytes; checked against a reference that
// splits the whole text at once.
#include "tools/launcher/line_prefixer.h"

#include <catch2/catch.hpp>
#include <string>

using dtr::launcher::LinePrefixer;

namespace {

constexpr size_t kMax = LinePrefixer::kMaxLineBytes;

// The expected output for `text` as a whole: every line (an unterminated last one too), cut
// into pieces of at most kMax bytes, each as "<prefix><piece>\n".
std::string reference(const std::string& prefix, const std::string& text) {
  std::string out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    size_t piece = begin;
    do {
      const size_t length = std::min(kMax, end - piece);
      out += prefix + text.substr(piece, length) + "\n";
      piece += length;
    } while (piece < end);
    begin = end + (terminated ? 1 : 0);
  }
  return out;
}

// Feeds `text` in reads of `chunk` bytes, then finishes.
std::string relay(const std::string& prefix, const std::string& text, size_t chunk) {
  LinePrefixer prefixer(prefix);
  std::string out;
  for (size_t i = 0; i < text.size(); i += chunk) out += prefixer.feed(text.substr(i, chunk));
  return out + prefixer.finish();
}

}  // namespace

TEST_CASE("LinePrefixer prefixes whole lines and holds back the unterminated tail") {
  LinePrefixer prefixer("[rank3]: ");
  CHECK(prefixer.feed("ab") == "");
  CHECK(prefixer.feed("c\nd\n\ne") == "[rank3]: abc\n[rank3]: d\n[rank3]: \n");
  CHECK(prefixer.feed("") == "");
  CHECK(prefixer.finish() == "[rank3]: e\n");
  CHECK(prefixer.finish() == "");
  CHECK(prefixer.feed("\n") == "[rank3]: \n");
}

TEST_CASE("LinePrefixer gives the same lines however the stream is cut") {
  const size_t length =
      GENERATE(size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{4097}, kMax - 1, kMax, kMax + 1, 2 * kMax + 5);
  const bool terminated = GENERATE(true, false);
  // Three lines: short, `length` bytes, short; the last one terminated or not.
  std::string text = "first\n";
  for (size_t i = 0; i < length; ++i) text.push_back(static_cast<char>('a' + i % 26));
  text += "\nlast";
  if (terminated) text += "\n";
  const size_t chunk = GENERATE(size_t{1}, size_t{7}, size_t{4097}, kMax, size_t{1} << 30);
  INFO("long line " << length << " bytes, terminated " << terminated << ", reads of " << chunk);
  if (chunk == 1 && length > kMax) return;  // byte-by-byte over 64 KiB adds nothing but time
  CHECK(relay("[rank0]: ", text, chunk) == reference("[rank0]: ", text));
}

TEST_CASE("LinePrefixer cuts a line longer than kMaxLineBytes into whole pieces") {
  const std::string text = std::string(kMax, 'x') + std::string(3, 'y') + "\n";
  LinePrefixer prefixer("> ");
  const std::string out = prefixer.feed(text) + prefixer.finish();
  CHECK(out == "> " + std::string(kMax, 'x') + "\n> yyy\n");
}
