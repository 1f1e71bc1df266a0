// execute_plan: the explainer's --execute mode, run on every rank of a real job: it
// redistributes a known tensor and puts the collectives measured next to the planned ones.
//
// Each rank wraps its part of a deterministic global tensor (integers in [-8, 8], so every
// sum is exact in every dtype) under the source placements, Partial ones split into terms
// that reduce to it, resets the CollectiveCounter, redistributes, and checks the result:
// full_tensor() equals the global tensor, and for a target without Partial the local tensor
// equals the rank's target chunk. Rank 0 prints one row per collective step and rank: planned
// send/recv bytes, planned and measured calls and nccl-tests size, and "ok" or "MISMATCH".
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "dtensor/placement.h"

namespace dtr {

struct ExecuteRequest {
  Shape mesh_shape;
  std::vector<std::string> mesh_dim_names;
  std::vector<std::string> view;  // the named dims in another order (DeviceMesh::submesh); empty: as laid out
  Placements from;
  Placements to;
  Shape shape;
  DType dtype = kFloat32;
};

// Runs `request` on this rank (collective over the world, whose size must be the mesh's)
// and prints the report to `out` on rank 0. Returns whether every measured collective
// matched the plan and every check passed, on every rank (the same answer on every rank).
bool execute_plan(const ExecuteRequest& request, std::ostream& out);

}  // namespace dtr
