// Errors: one typed exception per kind of user mistake, and one for broken invariants.
//
// DTR_CHECK(cond, Kind, fmt, args...) is for a user's mistake: it throws dtr::Kind
// (ValueError, TypeError, IndexError, NotImplementedError) with a message built only
// on failure. DTR_INTERNAL_ASSERT(cond, fmt, args...) is for a broken invariant: its
// message says it is a dtr bug. (PyTorch's TORCH_CHECK vs TORCH_INTERNAL_ASSERT.)
// Messages name the op, the shapes, dtypes, devices and what would have been legal.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtr {

// A list in one line of a message, however long: "2 (a, b)" or "57 (a, b, c, d, e and 52
// more)", so a mismatch of two large models stays readable.
inline std::string list_summary(const std::vector<std::string>& items, size_t shown = 5) {
  std::string out = fmt::format("{} (", items.size());
  for (size_t i = 0; i < items.size() && i < shown; ++i) out += fmt::format("{}{}", i == 0 ? "" : ", ", items[i]);
  if (items.size() > shown) out += fmt::format(" and {} more", items.size() - shown);
  return out + ")";
}

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ValueError : public Error {
 public:
  using Error::Error;
};
class TypeError : public Error {
 public:
  using Error::Error;
};
class IndexError : public Error {
 public:
  using Error::Error;
};
class NotImplementedError : public Error {
 public:
  using Error::Error;
};
// A CUDA runtime, cuBLAS or driver call failed (names the call, device and the library's error).
class CudaError : public Error {
 public:
  using Error::Error;
};
// An allocation failed (names the device, the bytes asked for, in use and cached): torch.OutOfMemoryError.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};
// An operating-system call failed (Python's OSError): the message names the call and ends
// with strerror(error_number()), as in "pipe2(): Too many open files".
class OSError : public Error {
 public:
  OSError(int error_number, const std::string& call)
      : Error(call + ": " + std::strerror(error_number)), error_number_(error_number) {}
  int error_number() const { return error_number_; }

 private:
  int error_number_;
};
// Thrown only by DTR_INTERNAL_ASSERT: an invariant dtr relies on did not hold.
class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace dtr

#define DTR_CHECK(cond, Kind, ...)                   \
  do {                                               \
    if (!(cond)) [[unlikely]] {                      \
      throw ::dtr::Kind(::fmt::format(__VA_ARGS__)); \
    }                                                \
  } while (0)

#define DTR_INTERNAL_ASSERT(cond, ...)                                                                                \
  do {                                                                                                                \
    if (!(cond)) [[unlikely]] {                                                                                       \
      throw ::dtr::InternalError(::fmt::format("dtr bug at {}:{}: {} ({}); please report", __FILE__, __LINE__, #cond, \
                                               ::fmt::format(__VA_ARGS__)));                                          \
    }                                                                                                                 \
  } while (0)
