// explain_sharding: shows which global indices every rank holds before and after a
// placement change, and the redistribute plan between them with the bytes per rank.
//
//   bazel run //tools/explain_sharding -- --mesh 2x2 --shape 8,6 --from S0,R --to R,S1 [--alternatives] [--execute]
//       [--cost-model tools/bench/cost_model_gloo.json] [--names dp,tp --view tp,dp] [--deterministic]
//
// The mesh is laid out row-major over ranks 0..n-1 (init_device_mesh's layout); --view
// takes its named dims in another order (DeviceMesh::submesh: FSDP x TP's tp-first mesh is
// --names dp,tp --view tp,dp), the placements then given per view dim, the ranks the mesh's. Without
// --execute the tables and the plan come from the specs alone; --alternatives also lists
// every plan the planner weighed and why it chose its plan; --cost-model adds each
// collective's predicted time from a file collective_bench --fit-cost-model wrote; with
// --execute, the tool starts itself as the mesh's ranks (launch_self, Gloo over loopback),
// runs the redistribute and prints the collectives measured next to the planned ones
// (execute_plan.h). Exit code: 0 when all matched; 1 for a bad input, a mismatch or a
// failed check; a failing rank's own.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <charconv>
#include <chrono>
#include <iostream>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/init.h"
#include "core/dtype.h"
#include "core/error.h"
#include "dtensor/device_mesh.h"
#include "dtensor/dtensor_spec.h"
#include "dtensor/explain.h"
#include "dtensor/placement.h"
#include "dtensor/redistribute_plan.h"
#include "dtensor/visualize_sharding.h"
#include "kernels/block_reduce.h"
#include "tools/command_line.h"
#include "tools/explain_sharding/execute_plan.h"
#include "tools/launcher/self_launch.h"
#include "tools/tool_main.h"

namespace {

// The whole numbers of `text` split at `delimiter` ("8,6" -> [8, 6]); nullopt when an item
// is empty or not a whole number >= 0.
std::optional<std::vector<int64_t>> split_sizes(const std::string& text, char delimiter) {
  std::vector<int64_t> sizes;
  size_t start = 0;
  while (true) {
    const size_t end = std::min(text.find(delimiter, start), text.size());
    const std::string_view item = std::string_view(text).substr(start, end - start);
    int64_t size = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), size);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || size < 0) return std::nullopt;
    sizes.push_back(size);
    if (end == text.size()) return sizes;
    start = end + 1;
  }
}

// "8,6" -> [8, 6]; "scalar" -> []. Anything else, the empty text included, is a ValueError
// saying what is legal.
dtr::Shape parse_shape(const std::string& text) {
  if (text == "scalar") return {};
  const std::optional<std::vector<int64_t>> shape = split_sizes(text, ',');
  DTR_CHECK(shape.has_value(), ValueError,
            "--shape '{}': give the global tensor's sizes as non-negative integers separated by commas, e.g. 8,6 or "
            "0,4, or 'scalar' for a 0-d tensor",
            text);
  return *shape;
}

// "2x4" -> [2, 4]: sizes >= 1 joined by 'x', at most kMaxRanks ranks in all; anything else
// is a ValueError saying what is legal.
constexpr int64_t kMaxRanks = 65536;
std::vector<int64_t> parse_mesh(const std::string& text) {
  const std::optional<std::vector<int64_t>> mesh = split_sizes(text, 'x');
  int64_t ranks = 1;
  bool ok = mesh.has_value();
  for (size_t d = 0; ok && d < mesh->size(); ++d) {
    const int64_t size = (*mesh)[d];
    ok = size >= 1 && size <= kMaxRanks && ranks * size <= kMaxRanks;
    ranks *= size;
  }
  DTR_CHECK(ok, ValueError,
            "--mesh '{}': give the mesh's sizes, each >= 1, joined by x (e.g. 8, 2x4 or 2x2x2), {} ranks at most", text,
            kMaxRanks);
  return *mesh;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Shows what every rank holds before and after a placement change, and the plan between them."};
  std::vector<std::string> names;
  std::string mesh_text, shape_text, from, to, cost_model_path;
  bool execute = false, alternatives = false, deterministic = false;
  app.add_option("--mesh", mesh_text, "mesh shape, e.g. 8, 2x4 or 2x2x2")->required();
  app.add_option("--shape", shape_text, "global tensor shape, e.g. 8,6 (scalar: a 0-d tensor)")->required();
  app.add_option("--from", from, "source placements, one per mesh dim, e.g. S0,R or S(0),P(sum)")->required();
  app.add_option("--to", to, "target placements, e.g. R,S1")->required();
  app.add_option("--names", names, "mesh dim names, e.g. dp,tp")->delimiter(',');
  std::vector<std::string> view;
  app.add_option("--view", view,
                 "the named mesh dims in another order, e.g. tp,dp (FSDP x TP's tp-first mesh); placements follow it")
      ->delimiter(',');
  std::map<std::string, dtr::DType> dtypes;
  for (dtr::DType d :
       {dtr::kFloat32, dtr::kFloat64, dtr::kBFloat16, dtr::kFloat16, dtr::kInt32, dtr::kInt64, dtr::kBool}) {
    dtypes.emplace(dtr::dtype_name(d), d);
  }
  std::string dtype_name = "float32";
  app.add_option("--dtype", dtype_name, "element type (default float32)")->check(CLI::IsMember(dtypes));
  app.add_flag("--alternatives", alternatives,
               "also list every plan the planner weighed, with its steps and bytes, and why it chose its plan");
  app.add_option("--cost-model", cost_model_path,
                 "a cost model file (collective_bench --fit-cost-model): print each collective's predicted time")
      ->check(CLI::ExistingFile);
  app.add_flag("--execute", execute,
               "also run it: start the mesh's ranks, redistribute, and compare the collectives measured with the plan");
  app.add_flag(
      "--deterministic", deterministic,
      "plan as train --deterministic does (a Partial's mesh dims reduced innermost first) and say how it runs "
      "each sum: over more than two ranks in the canonical tree of the group's members (docs/deterministic.md)");
  if (const std::optional<int> exit_code = dtr::parse_command_line("explain_sharding", app, argc, argv))
    return *exit_code;

  return dtr::tool_main("explain_sharding", [&] {
    DTR_CHECK(!(execute && deterministic), ValueError,
              "--execute with --deterministic: the run compares the counter with the planned ring collectives, "
              "which the mode replaces by its trees; give one of the two");
    const dtr::DType dtype = dtypes.at(dtype_name);
    const std::vector<int64_t> mesh_shape = parse_mesh(mesh_text);
    const dtr::Shape shape = parse_shape(shape_text);
    if (execute && dtr::launcher::is_rank_process()) {
      dtr::set_default_timeout(std::chrono::seconds(60));  // a lost peer fails in a minute, not PyTorch's ten
      const bool passed = dtr::execute_plan(
          {mesh_shape, names, view, dtr::parse_placements(from), dtr::parse_placements(to), shape, dtype}, std::cout);
      const bool rank0 = dtr::default_group()->rank() == 0;
      dtr::destroy_process_group();
      // Rank 0 alone carries the verdict: a failing rank makes the launcher stop the others,
      // which could cut rank 0's report short.
      return passed || !rank0 ? 0 : 1;
    }
    const int64_t world = dtr::shape_numel(mesh_shape);
    const dtr::DeviceMesh row_major = dtr::DeviceMesh::row_major(dtr::kCPU, mesh_shape, names, 0, world);
    const dtr::DeviceMesh mesh = view.empty() ? row_major : row_major.submesh(view);
    const dtr::DTensorSpec source(mesh, dtr::parse_placements(from), shape, dtype);
    if (deterministic) dtr::set_deterministic_block_tokens(1);  // plan as the mode does: its sums' order
    const dtr::RedistributePlan plan = dtr::plan_redistribute(source, dtr::parse_placements(to));
    std::optional<dtr::CostModel> cost_model;
    if (!cost_model_path.empty()) cost_model = dtr::CostModel::load(cost_model_path);
    const dtr::CostModel* model = cost_model ? &*cost_model : nullptr;
    std::cout << "source: " << dtr::visualize_sharding(source) << "\n"
              << explain_plan(plan, model, deterministic ? dtr::Deterministic::kYes : dtr::Deterministic::kNo) << "\n";
    if (alternatives)
      std::cout << dtr::explain_alternatives(dtr::plan_alternatives(source, plan.target_placements()), model) << "\n";
    std::cout << "target: " << dtr::visualize_sharding(source.with_placements(plan.target_placements()));
    if (!execute) return 0;
    DTR_CHECK(dtype != dtr::kBool, TypeError,
              "--execute with --dtype bool: collectives move float32, float64, bfloat16, float16, int32 and int64 "
              "tensors; choose one of those");
    std::cout << "\nexecuting on " << world << " ranks (processes on this machine, Gloo over 127.0.0.1):" << std::endl;
    const dtr::launcher::SelfLaunchResult result =
        dtr::launcher::launch_self(static_cast<int>(world), std::span(argv, argc));
    if (result.exit_code != 0) {
      std::cerr << "explain_sharding: --execute failed: " << result.failure << "\n";
      return result.exit_code;
    }
    return 0;
  });
}
