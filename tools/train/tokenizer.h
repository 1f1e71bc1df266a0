// Tokenizers for the train program: bytes to uint16 token ids and back, with
// decode(encode(s)) == s for any bytes s.
//
//   byte  256 tokens, token = byte value.
//   bpe   byte-level BPE as in GPT-2 (Sennrich et al. 2016; Radford et al. 2019): tokens
//         0..255 are the bytes, and token 256 + r is merge r, the pair (left, right) of
//         earlier tokens that training found most frequent at step r. The text is first
//         cut into chunks that merges never cross: an optional single space followed by a
//         run of letters (ASCII letters and every byte >= 0x80, so UTF-8 words stay
//         whole), of digits, or of other symbols; or a run of whitespace (which leaves a
//         final space to the next chunk). Chunks longer than 255 bytes are cut, so no
//         token is longer. encode applies the merges in rank order inside each chunk.
//
// For example "She took the key to her friend Otto." is the chunks "She" " took" " the" " key"
// " to" " her" " friend" " Otto" "."; a 512-token BPE trained on the built-in corpus
// encodes it as "S" "he" " took" " the" ... " Otto" "." (10 tokens for 36 bytes).
// save() writes JSON that load_tokenizer() reads back: {"kind": "byte", "vocab_size": 256}
// or {"kind": "bpe", "vocab_size": 256 + R, "merges": [[left, right], ...]} (R merges).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dtr::train {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids are 0 .. vocab_size() - 1.
  virtual int64_t vocab_size() const = 0;
  virtual std::vector<uint16_t> encode(std::string_view text) const = 0;
  // IndexError for an id outside 0 .. vocab_size() - 1.
  virtual std::string decode(std::span<const uint16_t> tokens) const = 0;
  // "byte" or "bpe".
  virtual std::string kind() const = 0;
  // Writes the tokenizer as JSON (the format above); OSError when the file cannot be written.
  virtual void save(const std::string& path) const = 0;
};

std::unique_ptr<Tokenizer> byte_tokenizer();

// Byte-level BPE trained on `text`: starting from the 256 byte tokens, merges the most
// frequent adjacent pair inside the chunks (ties: the smallest (left, right) ids) until
// vocab_size tokens exist, or fewer when no chunk has two tokens left (the built-in
// corpus, with few distinct words, runs out at about 1100). Pair counts are kept
// up to date incrementally (only the chunks that hold the merged pair are revisited), so
// training costs about one pass over the text plus a little per merge.
// ValueError unless 257 <= vocab_size <= 65535.
std::unique_ptr<Tokenizer> train_bpe(std::string_view text, int64_t vocab_size);

// Reads what Tokenizer::save wrote: OSError when the file cannot be opened, ValueError
// (naming the file) when it is not such JSON.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace dtr::train
