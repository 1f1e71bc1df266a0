// Data for distributed tests: a global tensor every rank can compute, the block a rank
// holds, and Partial terms that reduce exactly to a value (integer-valued float64, so
// every sum is exact and results compare bit for bit).
#pragma once

#include <cmath>
#include <random>

#include "core/tensor.h"
#include "dtensor/dtensor_spec.h"

namespace dtr::testing {

// Integer-valued float64 data: every sum is exact, so results compare bit for bit.
inline Tensor global_tensor(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, kFloat64);
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_ptr<double>()[i] = dist(gen);
  return t;
}

// The chunk of `full` that `chunk` names, contiguous.
inline Tensor contiguous_chunk_of(const Tensor& full, const LocalChunk& chunk) {
  return chunk_of(full, chunk).contiguous();
}

// This rank's term of `full` under `placements`: its chunk, split over every Partial mesh
// dim into terms that reduce (with that dim's op) to the value. Terms are random but the
// same function of (seed, coordinates) on every rank.
inline Tensor partial_terms(const Tensor& full, const DTensorSpec& spec, uint64_t seed) {
  const DeviceMesh& mesh = spec.mesh();
  Tensor value = ranges_of(full, spec.local_ranges()).contiguous();
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = spec.placements()[m];
    if (!p.is_partial()) continue;
    const int64_t n = mesh.size(m), j = mesh.coordinate()[m];
    // noise(k): the random part of group member k's term, seeded by the coordinates so far.
    auto noise = [&](int64_t k) {
      uint64_t s = seed * 1000003 + static_cast<uint64_t>(m) * 7919;
      for (int64_t q = 0; q < m; ++q) s = s * 31 + static_cast<uint64_t>(mesh.coordinate()[q]);
      return global_tensor(value.shape(), s * 131 + static_cast<uint64_t>(k));
    };
    Tensor term = value.clone();
    double* t = term.data_ptr<double>();
    const double* v = value.data_ptr<double>();
    switch (p.reduce_op()) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: {
        // Members k > 0 hold noise; member 0 holds the rest, so the sum is the value (times n for avg).
        const double scale = p.reduce_op() == ReduceOp::kAvg ? static_cast<double>(n) : 1.0;
        if (j > 0) {
          term = noise(j);
        } else {
          for (int64_t i = 0; i < term.numel(); ++i) t[i] = scale * v[i];
          for (int64_t k = 1; k < n; ++k) {
            Tensor r = noise(k);
            for (int64_t i = 0; i < term.numel(); ++i) t[i] -= r.data_ptr<double>()[i];
          }
        }
        break;
      }
      case ReduceOp::kMax:
      case ReduceOp::kMin: {
        // Member 0 holds the value; the others hold values on the losing side of it.
        const double sign = p.reduce_op() == ReduceOp::kMax ? -1.0 : 1.0;
        if (j > 0) {
          Tensor r = noise(j);
          for (int64_t i = 0; i < term.numel(); ++i) t[i] = v[i] + sign * (1 + std::abs(r.data_ptr<double>()[i]));
        }
        break;
      }
    }
    value = term;
  }
  return value;
}

}  // namespace dtr::testing
