// Shared failures (checkpoint/internal/rank_failure.h): every kind of error crosses to the other
// ranks as the same type, with the lowest failed rank's message (and an OSError's errno); a
// rank's own error is rethrown unchanged; a world of one needs no group.
#include "checkpoint/internal/rank_failure.h"

#include <catch2/catch.hpp>

#include <cerrno>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"

namespace dtr::checkpoint::internal {
namespace {

using Json = nlohmann::json;

// The outcomes of three ranks where `failed` threw `error` and the others did not.
std::vector<Json> outcomes_with(int failed, std::exception_ptr error) {
  std::vector<Json> outcomes(3, Json::object());
  outcomes[failed]["error"] = failure_json(error);
  return outcomes;
}

template <class E>
void check_crosses_as(const E& error, const std::string& message) {
  INFO(message);
  try {
    raise_if_any_failed(outcomes_with(1, std::make_exception_ptr(error)), nullptr, "op");
    FAIL("nothing thrown");
  } catch (const E& e) {
    CHECK(std::string(e.what()) == "op: rank 1 failed: " + message);
  }
}

TEST_CASE("every kind of error reaches the other ranks as the same type, naming the failed rank", "[rank_failure]") {
  check_crosses_as(ValueError("bad value"), "bad value");
  check_crosses_as(TypeError("bad type"), "bad type");
  check_crosses_as(IndexError("bad index"), "bad index");
  check_crosses_as(NotImplementedError("not here"), "not here");
  check_crosses_as(InternalError("dtr bug at x.cc:1: c (m); please report"), "dtr bug at x.cc:1: c (m); please report");
  // Another Error (or any exception) is an Error, with its message.
  try {
    raise_if_any_failed(outcomes_with(2, std::make_exception_ptr(std::runtime_error("odd"))), nullptr, "op");
    FAIL("nothing thrown");
  } catch (const ValueError&) {
    FAIL("an Error became a ValueError");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "op: rank 2 failed: odd");
  }
  // An OSError keeps its errno, and its strerror once.
  try {
    raise_if_any_failed(outcomes_with(0, std::make_exception_ptr(OSError(ENOENT, "open('f')"))), nullptr, "op");
    FAIL("nothing thrown");
  } catch (const OSError& e) {
    CHECK(e.error_number() == ENOENT);
    CHECK(std::string(e.what()) == "op: rank 0 failed: open('f'): No such file or directory");
  }
}

TEST_CASE("a rank rethrows its own error; the others hear of the lowest failed rank", "[rank_failure]") {
  std::vector<Json> outcomes(3, Json::object());
  outcomes[2]["error"] = failure_json(std::make_exception_ptr(TypeError("two")));
  outcomes[1]["error"] = failure_json(std::make_exception_ptr(ValueError("one")));
  CHECK_THROWS_MATCHES(raise_if_any_failed(outcomes, nullptr, "op"), ValueError,
                       Catch::Matchers::Message("op: rank 1 failed: one"));
  CHECK_THROWS_MATCHES(raise_if_any_failed(outcomes, std::make_exception_ptr(TypeError("two")), "op"), TypeError,
                       Catch::Matchers::Message("two"));
  CHECK_NOTHROW(raise_if_any_failed(std::vector<Json>(3, Json::object()), nullptr, "op"));
}

TEST_CASE("raise_if_any_rank_failed in a world of one: its own error, or nothing", "[rank_failure]") {
  CHECK_NOTHROW(raise_if_any_rank_failed(nullptr, nullptr, "op"));
  CHECK_THROWS_MATCHES(raise_if_any_rank_failed(nullptr, std::make_exception_ptr(IndexError("mine")), "op"), IndexError,
                       Catch::Matchers::Message("mine"));
}

}  // namespace
}  // namespace dtr::checkpoint::internal
