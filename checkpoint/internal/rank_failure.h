// Shared failures: when one rank of a collective step fails (a checkpoint's write error or
// corrupt chunk, a full state dict file it cannot write or read), every rank raises, so
// that none goes on to wait in a later collective.
//
// Each rank sends its outcome in the step's all_gather_json: {"error": failure_json(e)} when
// it failed. raise_if_any_failed then rethrows a rank's own exception unchanged, and on the
// other ranks throws the same kind (ValueError, TypeError, IndexError, NotImplementedError,
// OSError with its errno, InternalError, or Error) with "<op>: rank <k> failed: <its
// message>", naming the lowest failed rank. raise_if_any_rank_failed is the whole protocol
// for a step whose outcome carries nothing else.
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

// Collective over `group` (null: a world of one): every rank calls it, with its own error or
// null, and every rank throws when any failed (as raise_if_any_failed); else returns.
void raise_if_any_rank_failed(ProcessGroup* group, std::exception_ptr mine, std::string_view op);

}  // namespace dtr::checkpoint::internal
