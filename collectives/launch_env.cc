#include "collectives/launch_env.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace dtr {
namespace {

// The whole number in `text` (a launcher's variable `name`), or a ValueError naming it.
int64_t whole(std::string_view name, std::string_view text) {
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  DTR_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && n >= 0, ValueError,
            "launcher environment: {}={:?} is not a whole number", name, text);
  return n;
}

// Slurm's tasks per node, "2(x3),1" -> [2, 2, 2, 1].
std::vector<int64_t> tasks_per_node(std::string_view name, const std::string& text) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = std::string_view(text).substr(at, comma - at);
    const size_t paren = item.find("(x");
    const int64_t tasks = whole(name, item.substr(0, paren));
    int64_t repeat = 1;
    if (paren != std::string_view::npos) {
      DTR_CHECK(item.back() == ')', ValueError, "launcher environment: {}={:?} is not Slurm's N(xK),M form", name,
                text);
      repeat = whole(name, item.substr(paren + 2, item.size() - paren - 3));
    }
    out.insert(out.end(), static_cast<size_t>(repeat), tasks);
    at = comma + 1;
  }
  return out;
}

}  // namespace

std::string first_slurm_host(const std::string& hostlist) {
  // The first entry: up to a comma outside brackets.
  size_t end = 0;
  for (int depth = 0; end < hostlist.size() && (hostlist[end] != ',' || depth > 0); ++end) {
    if (hostlist[end] == '[') ++depth;
    if (hostlist[end] == ']') --depth;
  }
  const std::string entry = hostlist.substr(0, end);
  const size_t open = entry.find('[');
  if (open == std::string::npos) return entry;
  const size_t close = entry.find(']', open);
  DTR_CHECK(close != std::string::npos, ValueError, "launcher environment: Slurm hostlist {:?} has an unclosed '['",
            hostlist);
  // "07-09,12" -> "07": the first range's first number, its zero padding kept.
  const std::string ranges = entry.substr(open + 1, close - open - 1);
  const size_t stop = ranges.find_first_of("-,");
  return entry.substr(0, open) + ranges.substr(0, stop) + entry.substr(close + 1);
}

LauncherEnv torchrun_env_from(const EnvLookup& env) {
  const auto get = [&](const char* name) -> const char* {
    const char* v = env(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  const auto first_of = [&](const char* a, const char* b) { return get(a) != nullptr ? a : b; };
  if (get("RANK") != nullptr) return {};
  LauncherEnv out;
  std::map<std::string, std::string>& v = out.variables;
  if (get("SLURM_PROCID") != nullptr) {
    out.launcher = "slurm";
    const char* ntasks = first_of("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS");
    const char* nodelist = get("SLURM_STEP_NODELIST") != nullptr ? "SLURM_STEP_NODELIST"
                           : get("SLURM_NODELIST") != nullptr    ? "SLURM_NODELIST"
                                                                 : "SLURM_JOB_NODELIST";
    DTR_CHECK(get(ntasks) != nullptr && get(nodelist) != nullptr, ValueError,
              "launcher environment: SLURM_PROCID is set but {} or {} is not; run the ranks with srun", ntasks,
              nodelist);
    v["RANK"] = std::to_string(whole("SLURM_PROCID", get("SLURM_PROCID")));
    v["WORLD_SIZE"] = std::to_string(whole(ntasks, get(ntasks)));
    if (get("SLURM_LOCALID") != nullptr) v["LOCAL_RANK"] = std::to_string(whole("SLURM_LOCALID", get("SLURM_LOCALID")));
    const char* per_node = first_of("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
    if (get(per_node) != nullptr) {
      const std::vector<int64_t> tasks = tasks_per_node(per_node, get(per_node));
      const int64_t node = get("SLURM_NODEID") != nullptr ? whole("SLURM_NODEID", get("SLURM_NODEID")) : 0;
      if (node < static_cast<int64_t>(tasks.size())) v["LOCAL_WORLD_SIZE"] = std::to_string(tasks[node]);
    }
    v["MASTER_ADDR"] = get("MASTER_ADDR") != nullptr ? get("MASTER_ADDR") : first_slurm_host(get(nodelist));
    if (get("MASTER_PORT") == nullptr) {
      DTR_CHECK(get("SLURM_JOB_ID") != nullptr, ValueError,
                "launcher environment: under Slurm without MASTER_PORT the port comes from SLURM_JOB_ID, which is "
                "not set; export MASTER_PORT");
      v["MASTER_PORT"] = std::to_string(15000 + whole("SLURM_JOB_ID", get("SLURM_JOB_ID")) % 20000);
    }
    return out;
  }
  const bool openmpi = get("OMPI_COMM_WORLD_RANK") != nullptr;
  if (!openmpi && get("PMI_RANK") == nullptr) return {};
  out.launcher = openmpi ? "openmpi" : "pmi";
  const char* rank = openmpi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
  const char* size = openmpi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
  const char* local_rank = openmpi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID";
  const char* local_size = openmpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS";
  DTR_CHECK(get(size) != nullptr, ValueError, "launcher environment: {} is set but {} is not", rank, size);
  DTR_CHECK(get("MASTER_ADDR") != nullptr && get("MASTER_PORT") != nullptr, ValueError,
            "launched by MPI ({}={} of {}) without MASTER_ADDR and MASTER_PORT: export both to every rank (rank 0's "
            "host and a free port), e.g. mpirun -x MASTER_ADDR=node0 -x MASTER_PORT=29500 ...",
            rank, get(rank), get(size));
  v["RANK"] = std::to_string(whole(rank, get(rank)));
  v["WORLD_SIZE"] = std::to_string(whole(size, get(size)));
  if (get(local_rank) != nullptr) v["LOCAL_RANK"] = std::to_string(whole(local_rank, get(local_rank)));
  if (get(local_size) != nullptr) v["LOCAL_WORLD_SIZE"] = std::to_string(whole(local_size, get(local_size)));
  return out;
}

void adopt_launcher_env() {
  const LauncherEnv derived = torchrun_env_from([](const char* name) { return std::getenv(name); });
  for (const auto& [name, value] : derived.variables) ::setenv(name.c_str(), value.c_str(), 1);
}

}  // namespace dtr
