// Shared failures: when one rank of a collective checkpoint step fails (a write error, a
// corrupt chunk), every rank raises, so that none goes on to wait in a later collective.
//
// Each rank sends its outcome in the step's all_gather_json: {"error": failure_json(e)} when
// it failed. raise_if_any_failed then rethrows a rank's own exception unchanged, and on the
// other ranks throws the same kind (ValueError, TypeError, OSError with its errno, or Error)
// with "<op>: rank <k> failed: <its message>", naming the lowest failed rank.
#pragma once

#include <nlohmann/json.hpp>

#include <exception>
#include <memory>
#include <string_view>
#include <vector>

#include "collectives/process_group.h"

namespace dtr::checkpoint::internal {

// The default group (none: a world of one process).
struct World {
  std::shared_ptr<ProcessGroup> group;
  int rank = 0;
  int size = 1;
};

World world();

// {"kind", "errno", "message"} for an exception.
nlohmann::json failure_json(std::exception_ptr error);

// Rethrows `mine` if set; else throws for the lowest rank whose outcome holds "error".
void raise_if_any_failed(const std::vector<nlohmann::json>& outcomes, std::exception_ptr mine, std::string_view op);

// Runs f, returning the exception it threw (or null) and recording it in `outcome`.
template <class F>
std::exception_ptr capture(nlohmann::json& outcome, F&& f) {
  try {
    f();
    return nullptr;
  } catch (...) {
    std::exception_ptr e = std::current_exception();
    outcome["error"] = failure_json(e);
    return e;
  }
}

}  // namespace dtr::checkpoint::internal
