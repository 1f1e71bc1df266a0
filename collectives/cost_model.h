// CostModel: the alpha-beta (Hockney) model of a collective's time on one machine and
// backend, fitted per (collective kind, group size) from collective_bench's measurements:
//
//   seconds(bytes) = alpha_s + bytes / beta_bytes_per_s
//
// bytes is nccl-tests' size, as CollectiveCounter and RedistributeStep::buffer_bytes count
// it (all_gather: the output; reduce_scatter: the input; all_reduce: the tensor). alpha is
// a call's fixed cost, beta the bandwidth beyond it. A group size with no fit of its own
// takes the nearest fitted size n0 of its kind (ties: the larger) and scales it as a ring
// does: alpha by (n-1)/(n0-1) (one latency per hop), 1/beta by ((n-1)/n)/((n0-1)/n0) (the
// share of the buffer each rank moves). For a fit at n0 = 2 of alpha 100 us, beta 2 GB/s:
//
//   n | alpha  | beta
//   2 | 100 us | 2.00 GB/s   (the fit)
//   4 | 300 us | 1.33 GB/s   (alpha x 3/1, beta x (1/2)/(3/4))
//
// A group of one rank costs nothing; a kind with no fit at any size predicts nothing.
// File format and the fitted values: docs/collective_bench.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "collectives/collective_counter.h"

namespace dtr {

struct AlphaBeta {
  double alpha_s = 0;           // the time of a call that moves nothing, seconds (>= 0)
  double beta_bytes_per_s = 0;  // bytes per second beyond alpha (> 0)

  double seconds(int64_t bytes) const { return alpha_s + static_cast<double>(bytes) / beta_bytes_per_s; }
};

// One measured call: kind on a group of group_size ranks moving bytes took seconds.
struct CostSample {
  CollectiveKind kind;
  int64_t group_size;
  int64_t bytes;
  double seconds;
};

// |predicted - measured| / measured over a set of samples.
struct RelativeError {
  double median = 0;
  double worst = 0;
};

class CostModel {
 public:
  // machine: the hardware the fits were measured on (CPU, interconnect); backend: "gloo", "nccl".
  CostModel(std::string machine, std::string backend);

  // Fits alpha and beta for every (kind, group size) in samples by least squares on the
  // relative error. ValueError naming the kind and group size for a group of fewer than
  // two ranks, a sample with bytes < 0 or seconds <= 0, fewer than two distinct sizes, or
  // times that do not grow with bytes (beta <= 0). A fit with alpha < 0 is clamped to
  // alpha = 0, beta refitted.
  static CostModel fit(std::span<const CostSample> samples, std::string machine, std::string backend);

  // Reads a file save wrote. OSError when it cannot be opened; ValueError naming the file
  // for anything else: not JSON, another format or version, a missing or mistyped field,
  // an unknown kind, a group size < 2, alpha < 0, beta <= 0, a (kind, group size) twice.
  static CostModel load(const std::string& path);
  // Writes the model as JSON (format "dtr-cost-model", version 1); OSError on failure.
  void save(const std::string& path) const;

  // Sets (or replaces) the fit of kind at group_size; ValueError for group_size < 2,
  // alpha < 0 or beta <= 0.
  void set(CollectiveKind kind, int64_t group_size, AlphaBeta fit);

  // The fit for kind at group_size, scaled from the nearest fitted size when it has none of
  // its own (the rule above); std::nullopt when kind has no fit. ValueError for group_size < 2.
  std::optional<AlphaBeta> alpha_beta(CollectiveKind kind, int64_t group_size) const;
  // The predicted time of one call: 0 for a group of one rank, std::nullopt when kind has no
  // fit. ValueError for group_size < 1 or bytes < 0.
  std::optional<double> predict_seconds(CollectiveKind kind, int64_t group_size, int64_t bytes) const;
  // The model's relative error on samples (not empty, every kind fitted).
  RelativeError relative_error(std::span<const CostSample> samples) const;

  const std::string& machine() const { return machine_; }
  const std::string& backend() const { return backend_; }
  const std::map<std::pair<CollectiveKind, int64_t>, AlphaBeta>& fits() const { return fits_; }

 private:
  std::string machine_;
  std::string backend_;
  std::map<std::pair<CollectiveKind, int64_t>, AlphaBeta> fits_;
};

}  // namespace dtr
