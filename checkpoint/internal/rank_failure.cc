#include "checkpoint/internal/rank_failure.h"

#include "collectives/init.h"

#include <cstring>
#include <string>

#include "collectives/all_gather_json.h"
#include "core/error.h"

namespace dtr::checkpoint::internal {

nlohmann::json failure_json(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const ValueError& e) {
    return {{"kind", "ValueError"}, {"message", e.what()}};
  } catch (const TypeError& e) {
    return {{"kind", "TypeError"}, {"message", e.what()}};
  } catch (const IndexError& e) {
    return {{"kind", "IndexError"}, {"message", e.what()}};
  } catch (const NotImplementedError& e) {
    return {{"kind", "NotImplementedError"}, {"message", e.what()}};
  } catch (const InternalError& e) {
    return {{"kind", "InternalError"}, {"message", e.what()}};
  } catch (const OSError& e) {
    // OSError appends ": <strerror>"; the receiving side's OSError appends it again.
    std::string message = e.what();
    const std::string suffix = std::string(": ") + std::strerror(e.error_number());
    if (message.ends_with(suffix)) message.resize(message.size() - suffix.size());
    return {{"kind", "OSError"}, {"errno", e.error_number()}, {"message", message}};
  } catch (const std::exception& e) {
    return {{"kind", "Error"}, {"message", e.what()}};
  } catch (...) {
    return {{"kind", "Error"}, {"message", "an unknown exception"}};
  }
}

void raise_if_any_failed(const std::vector<nlohmann::json>& outcomes, std::exception_ptr mine, std::string_view op) {
  if (mine) std::rethrow_exception(mine);
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    if (!outcomes[rank].contains("error")) continue;
    const nlohmann::json& e = outcomes[rank]["error"];
    const std::string kind = e.value("kind", "Error");
    const std::string message = fmt::format("{}: rank {} failed: {}", op, rank, e.value("message", ""));
    if (kind == "ValueError") throw ValueError(message);
    if (kind == "TypeError") throw TypeError(message);
    if (kind == "IndexError") throw IndexError(message);
    if (kind == "NotImplementedError") throw NotImplementedError(message);
    if (kind == "InternalError") throw InternalError(message);
    if (kind == "OSError") throw OSError(e.value("errno", 0), message);
    throw Error(message);
  }
}

World world() {
  if (!is_initialized()) return {};
  std::shared_ptr<ProcessGroup> group = default_group();
  const int rank = group->rank(), size = group->size();
  return {std::move(group), rank, size};
}

void raise_if_any_rank_failed(ProcessGroup* group, std::exception_ptr mine, std::string_view op) {
  nlohmann::json outcome = nlohmann::json::object();
  if (mine) outcome["error"] = failure_json(mine);
  raise_if_any_failed(all_gather_json(group, outcome), mine, op);
}

}  // namespace dtr::checkpoint::internal
