// all_gather_json: every rank's JSON value on every rank, through a process group: how
// checkpoint ranks exchange plans and outcomes (and, being collective, a barrier) and how
// traces reach rank 0.
//
// The text travels as int64 words (the dtypes process groups move): one all-gather of the
// lengths, then one uneven all-gather (all_gather_v) of the words.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

namespace dtr {

class ProcessGroup;

// Rank r's `mine` at index r. Collective over `group` (its buffers on group->device());
// a null group is a world of one.
std::vector<nlohmann::json> all_gather_json(ProcessGroup* group, const nlohmann::json& mine);

}  // namespace dtr
