#include "tools/train/train_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/tensor.h"
#include "core/units.h"

namespace dtr::train {

double parameter_bytes(const std::vector<DTensor*>& params) {
  double bytes = 0;
  for (const DTensor* p : params) bytes += static_cast<double>(p->to_local().nbytes());
  return bytes;
}

double gradient_bytes(const std::vector<DTensor*>& params) {
  double bytes = 0;
  for (const DTensor* p : params) {
    if (p->grad().defined()) bytes += static_cast<double>(p->grad().to_local().nbytes());
  }
  return bytes;
}

double optimizer_state_bytes(const optim::Optimizer& opt) {
  double bytes = 0;
  for (const auto& [index, state] : opt.state_dict().state) {
    for (const auto& [name, t] : state.tensors) bytes += static_cast<double>(t.to_local().nbytes());
  }
  return bytes;
}

std::vector<RankFigures> gather_rank_figures(const RankFigures& mine) {
  constexpr int64_t kFields = 11;
  const std::shared_ptr<ProcessGroup> group = default_group();
  const int64_t world = group->size(), rank = group->rank();
  std::vector<double> all(static_cast<size_t>(world * kFields), 0.0);
  const double fields[kFields] = {mine.param_bytes,
                                  mine.grad_bytes,
                                  mine.optim_bytes,
                                  mine.peak_bytes,
                                  mine.host_peak_bytes,
                                  mine.device_in_use_bytes,
                                  mine.device_reserved_bytes,
                                  mine.comm_s,
                                  mine.exposed_s,
                                  mine.train_s,
                                  mine.tokens};
  std::copy(fields, fields + kFields, all.begin() + rank * kFields);
  Tensor t = Tensor::from_vector<double>(all).to(group->device());
  group->all_reduce(t, ReduceOp::kSum).wait();
  t = t.to(kCPU);
  const double* v = t.data_ptr<double>();
  std::vector<RankFigures> out;
  for (int64_t r = 0; r < world; ++r) {
    const double* f = v + r * kFields;
    out.push_back({f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10]});
  }
  return out;
}

double activation_bytes(const RankFigures& f) {
  return std::max(0.0, f.peak_bytes - (f.param_bytes + f.grad_bytes + f.optim_bytes));
}

std::string monitoring_table(const std::vector<RankFigures>& ranks) {
  const bool gpu =
      std::any_of(ranks.begin(), ranks.end(), [](const RankFigures& f) { return f.device_reserved_bytes > 0; });
  std::string table = fmt::format("{:>4} | {:>10} | {:>9} | {:>9} | {:>11} | {:>8} | {:>6} | {:>7} | {:>8} | {:>9}",
                                  "rank", "params MiB", "grads MiB", "optim MiB", "activ. MiB",
                                  gpu ? "GPU peak" : "peak MiB", "comm %", "compute %", "hidden %", "tokens/s");
  table += gpu ? fmt::format(" | {:>9} | {:>9} | {:>9}\n", "GPU alloc", "GPU resv.", "host peak") : "\n";
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankFigures& f = ranks[r];
    const double comm = f.train_s > 0 ? 100 * f.exposed_s / f.train_s : 0;
    const double hidden = f.comm_s > 0 ? 100 * (f.comm_s - f.exposed_s) / f.comm_s : 0;
    table += fmt::format(
        "{:>4} | {:>10.2f} | {:>9.2f} | {:>9.2f} | {:>11.2f} | {:>8.2f} | {:>6.1f} | {:>9.1f} | {:>8.1f} | {:>9.0f}", r,
        mib(f.param_bytes), mib(f.grad_bytes), mib(f.optim_bytes), mib(activation_bytes(f)), mib(f.peak_bytes), comm,
        100 - comm, hidden, f.train_s > 0 ? f.tokens / f.train_s : 0);
    table += gpu ? fmt::format(" | {:>9.2f} | {:>9.2f} | {:>9.2f}\n", mib(f.device_in_use_bytes),
                               mib(f.device_reserved_bytes), mib(f.host_peak_bytes))
                 : "\n";
  }
  return table;
}

nlohmann::json to_json(const RankFigures& f) {
  return {{"param_bytes", f.param_bytes},
          {"grad_bytes", f.grad_bytes},
          {"optim_bytes", f.optim_bytes},
          {"peak_bytes", f.peak_bytes},
          {"activation_bytes", activation_bytes(f)},
          {"host_peak_bytes", f.host_peak_bytes},
          {"device_in_use_bytes", f.device_in_use_bytes},
          {"device_reserved_bytes", f.device_reserved_bytes},
          {"comm_s", f.comm_s},
          {"exposed_comm_s", f.exposed_s},
          {"train_s", f.train_s},
          {"tokens", f.tokens}};
}

}  // namespace dtr::train
