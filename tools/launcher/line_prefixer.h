// LinePrefixer: turns one rank's raw output bytes into whole lines that carry its prefix.
//
// Bytes arrive in arbitrary pieces (a pipe read can end mid-line); feed() returns only
// complete lines, each as "<prefix><line>\n", and keeps the unterminated tail for the next
// call, so the caller can write each returned block in one go and lines of different ranks
// never interleave. finish() returns the tail at end of stream, terminated with '\n'. A tail
// that grows past kMaxLineBytes without a newline is emitted as a line of its own, which
// bounds memory for a rank that never writes '\n'. torchrun's `[rank0]: ` prefixing
// (`--tee`, `--local-ranks-filter`) is the model.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dtr::launcher {

class LinePrefixer {
 public:
  // Longest unterminated line held back before it is emitted anyway.
  static constexpr size_t kMaxLineBytes = 64 * 1024;

  explicit LinePrefixer(std::string prefix) : prefix_(std::move(prefix)) {}

  // Appends `bytes` and returns every line now complete, each prefixed and '\n'-terminated.
  std::string feed(std::string_view bytes);
  // Returns the held-back unterminated line, prefixed and '\n'-terminated, or "" if none.
  std::string finish();

 private:
  std::string prefix_;
  std::string pending_;  // the current line so far: no '\n', at most kMaxLineBytes
};

}  // namespace dtr::launcher
