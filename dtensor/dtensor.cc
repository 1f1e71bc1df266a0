#include "dtensor/dtensor.h"

#include <algorithm>

#include "collectives/process_group.h"
#include "kernels/fill.h"

namespace dtr {
namespace {

std::string describe_placements_on(const DeviceMesh& mesh, const Placements& placements) {
  return fmt::format("{} on {}", placements_str(placements), mesh.to_string());
}

// Every mesh rank's `values` (all of one length), in row-major mesh order: one small
// all_gather per mesh dim, innermost first.
std::vector<std::vector<int64_t>> all_gather_mesh(const DeviceMesh& mesh, const std::vector<int64_t>& values) {
  Tensor data = Tensor::from_vector(values);
  for (int64_t m = mesh.ndim() - 1; m >= 0; --m) {
    ProcessGroup& group = mesh.group(m);
    Tensor gathered = Tensor::empty({group.size() * data.numel()}, kInt64);
    group.all_gather_into_tensor(gathered, data).wait();
    data = gathered;
  }
  const int64_t* p = data.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    out.emplace_back(p + r * static_cast<int64_t>(values.size()), p + (r + 1) * static_cast<int64_t>(values.size()));
  }
  return out;
}

}  // namespace

DTensor::DTensor(Tensor local, DTensorSpec spec) : local_(std::move(local)), spec_(std::move(spec)) {
  const Shape expected = spec_->local_box().shape;
  DTR_CHECK(local_.defined() && local_.shape() == expected && local_.dtype() == spec_->dtype(), ValueError,
            "DTensor: local tensor {} does not match the spec {}: this rank (coordinate {}) holds {}{}",
            describe(local_), spec_->to_string(), spec_->mesh().coordinate(), dtype_name(spec_->dtype()), expected);
}

DTensor::DTensor(std::shared_ptr<PendingRedistribute> pending, size_t index, DTensorSpec spec)
    : spec_(std::move(spec)), pending_(std::move(pending)), pending_index_(index) {}

const DTensorSpec& DTensor::spec() const {
  DTR_CHECK(spec_.has_value(), ValueError, "DTensor: use of an undefined DTensor");
  return *spec_;
}

const Tensor& DTensor::to_local() const {
  if (pending_) {
    local_ = pending_->wait()[pending_index_];
    pending_.reset();
  }
  return local_;
}

Tensor DTensor::full_tensor() const {
  return redistribute(Placements(mesh().ndim(), Replicate())).to_local();
}

DTensor DTensor::redistribute(const Placements& placements, Async async) const {
  return redistribute_coalesced(std::span(this, 1), placements, async).front();
}

DTensor DTensor::redistribute(const DeviceMesh& mesh, const Placements& placements, Async async) const {
  DTR_CHECK(mesh == this->mesh(), ValueError,
            "redistribute: {} lives on {}; moving it to {} is a cross-mesh redistribute, which dtr does not "
            "support (redistribute on its own mesh)",
            spec().to_string(), this->mesh().to_string(), mesh.to_string());
  return redistribute(placements, async);
}

std::string DTensor::to_string() const {
  if (!defined()) return "DTensor(undefined)";
  return fmt::format("DTensor({}, local {})", spec_->to_string(),
                     is_pending() ? "pending" : describe(local_));
}

std::vector<DTensor> redistribute_coalesced(std::span<const DTensor> tensors, const Placements& placements,
                                            Async async) {
  DTR_CHECK(!tensors.empty(), ValueError, "redistribute_coalesced: no tensors given");
  std::vector<DTensorSpec> specs;
  std::vector<Tensor> locals;
  for (const DTensor& t : tensors) {
    specs.push_back(t.spec());
    locals.push_back(t.to_local());
  }
  RedistributePlan plan = plan_redistribute_coalesced(specs, placements);
  std::vector<DTensor> out;
  if (plan.steps().empty()) {
    for (const DTensor& t : tensors) out.push_back(t);
    return out;
  }
  auto pending = std::make_shared<PendingRedistribute>(std::move(plan), std::move(locals));
  if (async == Async::kNo) pending->wait();
  for (size_t i = 0; i < specs.size(); ++i) {
    DTensorSpec target = specs[i].with_placements(placements);
    if (async == Async::kNo) {
      out.emplace_back(pending->wait()[i], std::move(target));
    } else {
      out.push_back(DTensor(pending, i, std::move(target)));
    }
  }
  return out;
}

DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  DTensorSpec replicated(mesh, Placements(mesh.ndim(), Replicate()), full.shape(), full.dtype());
  DTensorSpec target = replicated.with_placements(placements);  // validates before any communication
  // The source's dtype and shape first (padded to a fixed length), so that a mismatch is
  // an error rather than a broken broadcast.
  constexpr int64_t kMaxDims = 16;
  DTR_CHECK(full.dim() <= kMaxDims, ValueError, "distribute_tensor: {} has more than {} dims", describe(full), kMaxDims);
  std::vector<int64_t> header(kMaxDims + 2, -1);
  header[0] = static_cast<int64_t>(full.dtype());
  header[1] = full.dim();
  std::copy(full.shape().begin(), full.shape().end(), header.begin() + 2);
  Tensor data = full.contiguous().clone();
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (mesh.size(m) == 1) continue;
    Tensor source = Tensor::from_vector(header);
    mesh.group(m).broadcast(source, 0).wait();
    const int64_t* s = source.data_ptr<int64_t>();
    DTR_CHECK(std::equal(header.begin(), header.end(), s), ValueError,
              "distribute_tensor: rank {} passed {} but the source rank (coordinate 0 of {}) passed {}{}; every rank "
              "must pass a tensor of the same shape and dtype",
              mesh.this_rank(), describe(full), mesh.to_string(), dtype_name(static_cast<DType>(s[0])),
              Shape(s + 2, s + 2 + s[1]));
    mesh.group(m).broadcast(data, 0).wait();
  }
  RedistributePlan plan = plan_redistribute(replicated, placements);
  return DTensor(execute_redistribute(plan, {data}).front(), std::move(target));
}

DTensor from_local(const Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                   std::optional<Shape> shape, RunCheck run_check) {
  DTR_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), ValueError,
            "from_local: {} placements {} for a {}-d mesh {}; give one placement per mesh dim", placements.size(),
            placements_str(placements), mesh.ndim(), mesh.to_string());
  Shape global = shape.value_or(local.shape());
  if (!shape) {
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      if (placements[m].is_shard()) {
        const int64_t d = wrap_dim(placements[m].shard_dim(), local.dim(), "from_local");
        global[d] *= mesh.size(m);
      }
    }
  }
  DTensorSpec spec(mesh, placements, global, local.dtype());
  if (run_check == RunCheck::kYes) {
    const auto all = all_gather_mesh(mesh, {local.dim(), static_cast<int64_t>(local.dtype())});
    for (int64_t r = 0; r < mesh.size(); ++r) {
      DTR_CHECK(all[r] == all[0], ValueError,
                "from_local: ranks {} and {} of {} pass local tensors of different rank or dtype ({}-d {} vs {}-d "
                "{})",
                mesh.ranks()[0], mesh.ranks()[r], mesh.to_string(), all[0][0], dtype_name(static_cast<DType>(all[0][1])),
                all[r][0], dtype_name(static_cast<DType>(all[r][1])));
    }
    const auto shapes = all_gather_mesh(mesh, local.shape());
    for (int64_t r = 0; r < mesh.size(); ++r) {
      const Shape expected = spec.local_shape(mesh.coordinate_at(r));
      DTR_CHECK(shapes[r] == expected, ValueError,
                "from_local: rank {} holds a local tensor of shape {} but {} of global shape {} gives it {}{}",
                mesh.ranks()[r], shapes[r], describe_placements_on(mesh, placements), global, expected,
                shape ? "" : " (shards look uneven: pass the global shape)");
    }
  }
  return DTensor(local, std::move(spec));
}

}  // namespace dtr
