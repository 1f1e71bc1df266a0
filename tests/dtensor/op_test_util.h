// check_op: the test every differentiable DTensor op gets (PyTorch's DTensor _test_op,
// plus autograd's gradcheck).
//
// 1. gradcheck: on a one-rank mesh in float64, autograd's gradient of every differentiable
//    input against central finite differences of sum(op(x) * w).
// 2. check_distributed: on real ranks, for every combination of input placements, the
//    output's and every input gradient's full_tensor() equal the one-rank run, and the
//    forward issues exactly the collectives its sharding rule promised.
// for_each_test_mesh runs a body on 1-D meshes of 2, 3 and 4 ranks and on a 2x2 mesh.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "dtensor/autograd.h"
#include "dtensor/sharding_strategy.h"
#include "tests/dtensor/distributed_data.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr::testing {

struct OpInput {
  Tensor full;
  bool requires_grad = true;
  bool allow_partial = true;  // false for indices, masks and other non-linear inputs
};

struct OpCase {
  std::string name;
  std::vector<OpInput> inputs;
  std::function<DTensor(const std::vector<DTensor>&)> fn;
  double rtol = 1e-9;  // float64 throughout: only summation order differs between runs
  double atol = 1e-9;
};

inline std::vector<DTensor> make_inputs(const OpCase& c, const DeviceMesh& mesh,
                                        const std::vector<Placements>& placements, uint64_t seed) {
  std::vector<DTensor> out;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& full = c.inputs[i].full;
    DTensorSpec spec(mesh, placements[i], full.shape(), full.dtype());
    // Partial terms are made in float64 (exact for the integer-valued data) and rounded once.
    Tensor local = is_floating(full.dtype()) ? partial_terms(full.to(kFloat64), spec, seed + i).to(full.dtype())
                                             : contiguous_chunk_of(full, spec.local_chunk());
    DTensor t =
        mesh.has_groups() ? from_local(local, mesh, placements[i], full.shape(), RunCheck::kNo) : DTensor(local, spec);
    if (c.inputs[i].requires_grad) t.requires_grad_();
    out.push_back(t);
  }
  return out;
}

struct OpResult {
  Tensor output;
  std::vector<Tensor> grads;  // undefined for inputs without grad
};

// Runs the op and its backward with gradient `w` (Replicate) and gathers everything.
inline OpResult run_op(const OpCase& c, const std::vector<DTensor>& inputs, const Tensor& w) {
  DTensor y = c.fn(inputs);
  OpResult r{y.full_tensor(), {}};
  if (y.requires_grad()) {
    DTensor wd =
        y.mesh().has_groups()
            ? distribute_tensor(w, y.mesh(), Placements(y.mesh().ndim(), Replicate()))
            : DTensor(w, DTensorSpec(y.mesh(), Placements(y.mesh().ndim(), Replicate()), w.shape(), w.dtype()));
    y.backward(wd);
  }
  for (const DTensor& x : inputs) r.grads.push_back(x.grad().defined() ? x.grad().full_tensor() : Tensor());
  return r;
}

// t as a Replicate DTensor on the one-rank mesh.
inline DTensor on_one_rank(const Tensor& t) {
  return DTensor(t, DTensorSpec(single_rank_mesh(), {Replicate()}, t.shape(), t.dtype()));
}

inline Tensor output_weight(const OpCase& c) {
  DTensor y = c.fn(make_inputs(c, single_rank_mesh(), std::vector<Placements>(c.inputs.size(), {Replicate()}), 1));
  return global_tensor(y.shape(), 77).to(y.dtype());
}

inline void gradcheck(const OpCase& c) {
  const DeviceMesh mesh = single_rank_mesh();
  const std::vector<Placements> replicated(c.inputs.size(), {Replicate()});
  const Tensor w = output_weight(c);
  const OpResult analytic = run_op(c, make_inputs(c, mesh, replicated, 1), w);
  constexpr double kEps = 1e-6;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].requires_grad) continue;
    const int64_t n = c.inputs[i].full.numel();
    const std::vector<double> grad = to_f64(analytic.grads[i]);
    for (int64_t k = 0; k < n; k += std::max<int64_t>(1, n / 24)) {
      auto f = [&](double delta) {
        OpCase perturbed = c;
        Tensor x = c.inputs[i].full.clone();
        x.data_ptr<double>()[k] += delta;
        perturbed.inputs[i].full = x;
        NoGradGuard no_grad;
        Tensor y = perturbed.fn(make_inputs(perturbed, mesh, replicated, 1)).full_tensor();
        double s = 0;
        const std::vector<double> yv = to_f64(y), wv = to_f64(w);
        for (size_t e = 0; e < yv.size(); ++e) s += yv[e] * wv[e];
        return s;
      };
      const double numeric = (f(kEps) - f(-kEps)) / (2 * kEps);
      INFO(c.name << ": d/d input " << i << " [flat " << k << "]: autograd " << grad[k] << ", finite difference "
                  << numeric);
      CHECK(std::abs(grad[k] - numeric) <= 1e-5 + 1e-5 * std::abs(numeric));
    }
  }
}

// Placements input `i` may take on one mesh dim.
inline std::vector<Placement> placement_options(const OpInput& in) {
  std::vector<Placement> out{Replicate()};
  for (int64_t d = 0; d < in.full.dim(); ++d) out.push_back(Shard(d));
  if (in.allow_partial && is_floating(in.full.dtype())) out.push_back(Partial());
  return out;
}

inline void check_distributed_in(const OpCase& c, const DeviceMesh& mesh, int max_cases) {
  const std::vector<Placements> replicated(c.inputs.size(), {Replicate()});
  const Tensor w = output_weight(c);
  const OpResult reference = run_op(c, make_inputs(c, single_rank_mesh(), replicated, 1), w);
  // Every combination, as digits of a mixed-radix number; a seeded sample if too many.
  std::vector<std::vector<Placement>> options;
  int64_t total = 1;
  for (const OpInput& in : c.inputs) {
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      options.push_back(placement_options(in));
      total *= static_cast<int64_t>(options.back().size());
    }
  }
  std::mt19937_64 gen(12345);
  const int64_t cases = std::min<int64_t>(total, max_cases);
  for (int64_t k = 0; k < cases; ++k) {
    int64_t code = total <= max_cases ? k : static_cast<int64_t>(gen() % static_cast<uint64_t>(total));
    std::vector<Placements> placements(c.inputs.size());
    for (size_t slot = 0; slot < options.size(); ++slot) {
      const int64_t radix = static_cast<int64_t>(options[slot].size());
      placements[slot / mesh.ndim()].push_back(options[slot][code % radix]);
      code /= radix;
    }
    std::string what = c.name + " on " + mesh.to_string() + " with inputs";
    for (const Placements& p : placements) what += " " + placements_str(p);
    INFO(what);
    const std::vector<DTensor> inputs = make_inputs(c, mesh, placements, 1);
    collective_counter().reset();
    reset_promised_collectives();
    DTensor y = c.fn(inputs);
    CHECK(issued_collectives() == promised_collectives());
    y = DTensor();
    for (const DTensor& x : inputs) {
      if (x.requires_grad()) x.set_grad({});
    }
    const OpResult r = run_op(c, inputs, w);
    check_close(r.output, reference.output, Tolerance{c.atol, c.rtol}, what + ": output");
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!reference.grads[i].defined()) continue;
      REQUIRE(r.grads[i].defined());
      check_close(r.grads[i], reference.grads[i], Tolerance{c.atol, c.rtol},
                  what + ": gradient of input " + std::to_string(i));
    }
  }
}

// Every combination of input placements (R, S(d) for every dim, P(sum) where allowed; a
// seeded sample of max_cases when there are more), collectives compared as
// collective_counter() against promised_collectives(). In float64 (tolerance: the case's,
// summation order only) and again with the floating inputs in float32 (1e-4 absolute and
// relative, against a float32 one-rank run).
inline void check_distributed(const OpCase& c, const DeviceMesh& mesh, int max_cases = 48) {
  check_distributed_in(c, mesh, max_cases);
  OpCase f32 = c;
  f32.name += " (float32)";
  f32.rtol = f32.atol = 1e-4;
  for (OpInput& in : f32.inputs) {
    if (in.full.dtype() == kFloat64) in.full = in.full.to(kFloat32);
  }
  check_distributed_in(f32, mesh, max_cases);
}

// Runs body(mesh) on 1-D meshes of 2, 3 and 4 ranks and on a 2x2 mesh, each on real ranks.
inline void for_each_test_mesh(const std::function<void(const DeviceMesh&)>& body) {
  for (int world : {2, 3, 4}) {
    run_ranks(world, [&](int, int world_size) {
      body(init_device_mesh(kCPU, {world_size}));
      if (world_size == 4) body(init_device_mesh(kCPU, {2, 2}));
    });
  }
}

}  // namespace dtr::testing
