// libFuzzer target for the .safetensors header parser: any input either parses or throws
// one of dtr's typed user errors (ValueError, ...); a crash, a hang, a sanitizer report, an
// InternalError (a failed DTR_INTERNAL_ASSERT: a dtr bug, though it derives from Error) or
// any other exception is a bug. Built and run by tools/fuzz/run_safetensors_fuzzer.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>

#include "checkpoint/safetensors_header.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto bytes = std::span(data, size);
    const int64_t n = dtr::safetensors_header_length(bytes, static_cast<int64_t>(size), "fuzz");
    const std::string_view json(reinterpret_cast<const char*>(data) + 8, static_cast<size_t>(n));
    dtr::parse_safetensors_header(json, static_cast<int64_t>(size) - 8 - n, "fuzz");
  } catch (const dtr::InternalError& e) {
    // Caught before Error, its base: libFuzzer reports the abort as a crash and saves the input.
    std::fprintf(stderr, "safetensors_fuzzer: an internal assert failed (a dtr bug): %s\n", e.what());
    std::abort();
  } catch (const dtr::Error&) {  // a typed user error: the parser rejected the input, as it should
  }
  return 0;
}
