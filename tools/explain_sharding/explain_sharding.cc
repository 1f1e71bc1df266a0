// explain_sharding: shows which global indices every rank holds before and after a
// placement change, and the redistribute plan between them with the bytes per rank.
//
//   bazel run //tools/explain_sharding -- --mesh 2x2 --shape 8,6 --from S0,R --to R,S1
//
// The mesh is laid out row-major over ranks 0..n-1 (init_device_mesh's layout). Nothing
// is executed: the tables and the plan come from the specs alone.
#include <CLI/CLI.hpp>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/dtensor_spec.h"
#include "dtensor/placement.h"
#include "dtensor/redistribute_plan.h"
#include "dtensor/visualize_sharding.h"
#include "kernels/dtype.h"
#include "kernels/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Shows what every rank holds before and after a placement change, and the plan between them."};
  std::vector<int64_t> mesh_shape, shape;
  std::vector<std::string> names;
  std::string from, to;
  app.add_option("--mesh", mesh_shape, "mesh shape, e.g. 8, 2x4 or 2x2x2")->required()->delimiter('x');
  app.add_option("--shape", shape, "global tensor shape, e.g. 8,6")->required()->delimiter(',');
  app.add_option("--from", from, "source placements, one per mesh dim, e.g. S0,R or S(0),P(sum)")->required();
  app.add_option("--to", to, "target placements, e.g. R,S1")->required();
  app.add_option("--names", names, "mesh dim names, e.g. dp,tp")->delimiter(',');
  std::map<std::string, dtr::DType> dtypes;
  for (dtr::DType d : {dtr::kFloat32, dtr::kFloat64, dtr::kBFloat16, dtr::kFloat16, dtr::kInt32, dtr::kInt64,
                       dtr::kBool}) {
    dtypes.emplace(dtr::dtype_name(d), d);
  }
  std::string dtype_name = "float32";
  app.add_option("--dtype", dtype_name, "element type (default float32)")->check(CLI::IsMember(dtypes));
  CLI11_PARSE(app, argc, argv);

  try {
    const int64_t world = dtr::shape_numel(mesh_shape);
    const dtr::DeviceMesh mesh = dtr::DeviceMesh::row_major(dtr::kCPU, mesh_shape, names, 0, world);
    const dtr::DTensorSpec source(mesh, dtr::parse_placements(from), shape, dtypes.at(dtype_name));
    const dtr::RedistributePlan plan = dtr::plan_redistribute(source, dtr::parse_placements(to));
    std::cout << "source: " << dtr::visualize_sharding(source) << "\n"
              << plan.explain() << "\n"
              << "target: " << dtr::visualize_sharding(source.with_placements(plan.target_placements()));
  } catch (const dtr::Error& e) {
    std::cerr << "explain_sharding: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
