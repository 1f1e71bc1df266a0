// clip_grad_norm_ over gradients of every placement on a 2x2 mesh of real ranks: the norm
// is the norm of the full gradients (Replicate mesh dims counted once, Partial gradients
// reduced first), the same on every rank, with one all_reduce per mesh dim for all
// parameters together; clipping scales every shard alike.
#include <catch2/catch.hpp>

#include <cmath>

#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "dtensor/dtensor.h"
#include "optim/clip_grad.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr::optim {
namespace {

// A parameter under `placements` whose gradient is the chunk of `full` (or, for Partial
// placements, the full value on coordinate 0 of those dims and zeros elsewhere).
DTensor parameter_with_grad(const DeviceMesh& mesh, const Placements& placements, const Tensor& full) {
  DTensor p = distribute_tensor(full, mesh, reduced_placements(placements));
  p.requires_grad_();
  const DTensorSpec spec(mesh, placements, full.shape(), full.dtype());
  Tensor local = ranges_of(full, spec.local_ranges()).clone();  // its own storage: clipping must not scale `full`
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (placements[m].is_partial() && mesh.coordinate()[m] != 0) local = zeros_like(local);
  }
  p.set_grad(DTensor(local, spec));
  return p;
}

TEST_CASE("clip_grad_norm_ on a 2x2 mesh: the true global norm, one all_reduce per mesh dim", "[optim][clip]") {
  testing::run_ranks(4, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 2}, {"dp", "tp"});
    const std::vector<Placements> placements = {
        {Shard(0), Replicate()},          {Replicate(), Shard(1)}, {Shard(0), Shard(1)},
        {Replicate(), Replicate()},       {Shard(1), Shard(1)},  // (S1, S1): nested, uneven over 5 columns
        {Replicate(), StridedShard(0, 3)}};                      // packed rows, as q, k, v
    std::vector<Tensor> fulls;
    std::vector<DTensor> params;
    double squares = 0, largest = 0;
    for (size_t k = 0; k < placements.size(); ++k) {
      fulls.push_back(testing::random_tensor({6, 5}, kFloat32, 10 + k, -2, 2));
      params.push_back(parameter_with_grad(mesh, placements[k], fulls.back()));
      for (double v : testing::to_f64(fulls.back())) {
        squares += v * v;
        largest = std::max(largest, std::abs(v));
      }
    }
    std::vector<DTensor*> pointers;
    for (DTensor& p : params) pointers.push_back(&p);
    collective_counter().reset();
    const double norm = clip_grad_norm_(pointers, 1e9);
    CHECK(norm == Approx(std::sqrt(squares)).epsilon(1e-6));
    CHECK(collective_counter().calls(CollectiveKind::kAllReduce) == 2);  // one per mesh dim, all parameters
    CHECK(collective_counter().snapshot().size() == 2);
    CHECK(clip_grad_norm_(pointers, 1e9, INFINITY) == Approx(largest));
    // Clipping to half the norm halves every full gradient.
    const double clipped = clip_grad_norm_(pointers, norm / 2);
    CHECK(clipped == Approx(norm));
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<double> half = testing::to_f64(fulls[k]);
      for (double& v : half) v *= 0.5 * norm / (norm + 1e-6);
      testing::check_close(params[k].grad().full_tensor(), fulls[k].shape(), half, {1e-6, 1e-5}, "clipped gradient");
    }
    // A Partial gradient is reduced first: its norm is the full value's.
    DTensor partial = parameter_with_grad(mesh, {Partial(), Shard(0)}, fulls[0]);
    double partial_squares = 0;
    for (double v : testing::to_f64(fulls[0])) partial_squares += v * v;
    CHECK(clip_grad_norm_({&partial}, 1e9) == Approx(std::sqrt(partial_squares)).epsilon(1e-6));
  });
}

}  // namespace
}  // namespace dtr::optim
