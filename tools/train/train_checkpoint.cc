#include "tools/train/train_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "checkpoint/load.h"
#include "checkpoint/safetensors_dtype.h"
#include "checkpoint/save.h"
#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/error.h"
#include "core/units.h"
#include "dtensor/autograd.h"
#include "kernels/fill.h"
#include "nn/init.h"

namespace dtr::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "step_";

// The committed checkpoints under `dir`, oldest first (a save in progress or killed is a
// temporary directory, not a step_* one).
std::vector<fs::path> committed(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.starts_with(kPrefix) && name.find('.') == std::string::npos &&
        checkpoint::is_committed_checkpoint(e.path().string())) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A progress callback printing "checkpoint <name>: 12.3 of 80.0 MiB <verb>" on rank 0 once
// the save or load has taken over kQuietSeconds (small runs stay quiet). It may run on
// async_save's writer thread: it touches only its own copied state and stdout.
checkpoint::ProgressCallback progress_printer(const std::string& path, const char* verb) {
  constexpr double kQuietSeconds = 2.0;
  if (default_group()->rank() != 0) return {};
  return [name = fs::path(path).filename().string(), verb,
          start = std::chrono::steady_clock::now()](const checkpoint::Progress& p) {
    if (seconds_since(start) < kQuietSeconds) return;
    fmt::print("checkpoint {}: {:.1f} of {:.1f} MiB {}\n", name, mib(p.done_bytes), mib(p.total_bytes), verb);
    std::fflush(stdout);
  };
}

}  // namespace

std::string checkpoint_path(const std::string& checkpoint_dir, int64_t step) {
  return (fs::path(checkpoint_dir) / fmt::format("{}{:08d}", kPrefix, step)).string();
}

Checkpointer::Checkpointer(std::string checkpoint_dir, int64_t keep_last)
    : dir_(std::move(checkpoint_dir)), keep_last_(keep_last) {}

void Checkpointer::save(const RunPosition& position, nn::Module& model, optim::Optimizer& opt) {
  commit();
  checkpoint::State state;
  for (auto& [name, p] : model.named_parameters()) state.tensors.emplace("model." + name, *p);
  nlohmann::json optim = nlohmann::json::object();
  for (const auto& [index, param] : opt.state_dict().state) {
    nlohmann::json dtypes = nlohmann::json::object();
    for (const auto& [name, t] : param.tensors) {
      state.tensors.emplace(fmt::format("optim.{}.{}", index, name), t);
      dtypes[name] = std::string(safetensors_dtype(t.dtype()));
    }
    optim[std::to_string(index)] = {{"step", param.step}, {"dtypes", dtypes}};
  }
  const nn::SeedState rng = nn::seed_state();
  state.extra = {{"step", position.step},
                 {"window", position.window},
                 {"rng", {{"seed", rng.seed}, {"draws", rng.draws}}},
                 {"optim", optim}};
  fs::create_directories(dir_);
  const std::string path = checkpoint_path(dir_, position.step);
  in_flight_ = checkpoint::async_save(state, path, progress_printer(path, "written"));
  in_flight_path_ = path;
  in_flight_bytes_ = 0;
  for (const auto& [name, t] : state.tensors) {
    in_flight_bytes_ += shape_numel(t.shape()) * static_cast<int64_t>(itemsize(t.dtype()));
  }
}

void Checkpointer::commit() {
  if (in_flight_.done()) return;  // nothing in flight (or already committed)
  in_flight_.wait();
  if (default_group()->rank() != 0) return;
  fmt::print("checkpoint {} committed: {:.1f} MiB\n", fs::path(in_flight_path_).filename().string(),
             mib(in_flight_bytes_));
  std::fflush(stdout);
  // Only rank 0 cleans up, so nothing here may throw (the other ranks go on training): a
  // directory that cannot be removed stays, with a line saying so.
  std::error_code ec;
  std::vector<fs::path> stale;
  const std::vector<fs::path> all = committed(dir_);
  for (size_t k = 0; k + static_cast<size_t>(keep_last_) < all.size(); ++k) stale.push_back(all[k]);
  // No save is in flight now: any temporary directory is what a killed save left.
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(kPrefix) &&
        (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos)) {
      stale.push_back(it->path());
    }
  }
  for (const fs::path& p : stale) {
    if (fs::remove_all(p, ec); ec) fmt::print("train: cannot remove {}: {}\n", p.string(), ec.message());
  }
}

std::string resume_path(const std::string& resume, const std::string& checkpoint_dir) {
  if (resume != "latest") return resume;
  const std::vector<fs::path> all = committed(checkpoint_dir);
  return all.empty() ? "" : all.back().string();
}

namespace {

// load_checkpoint, its `extra` read without checking its form.
RunPosition load_unchecked(const std::string& path, nn::Module& model, optim::Optimizer& opt) {
  // The step counts and dtypes of the optimizer's state come first, from `extra`.
  checkpoint::State header;
  checkpoint::load(header, path);
  checkpoint::State state;
  std::vector<DTensor*> params;
  for (auto& [name, p] : model.named_parameters()) {
    state.tensors.emplace("model." + name, *p);
    params.push_back(p);
  }
  optim::OptimizerState saved = opt.state_dict();
  for (const auto& [key, entry] : header.extra.at("optim").items()) {
    const int64_t index = std::stoll(key);
    DTR_CHECK(index >= 0 && index < static_cast<int64_t>(params.size()), ValueError,
              "train: checkpoint {} has optimizer state for parameter {} but the model has {} parameters", path, index,
              params.size());
    optim::OptimizerState::Param& param = saved.state[index];
    param.step = entry.at("step").get<int64_t>();
    for (const auto& [name, dtype] : entry.at("dtypes").items()) {
      const DTensorSpec spec = params[static_cast<size_t>(index)]->spec();
      const std::optional<DType> d = dtype_from_safetensors(dtype.get<std::string>());
      DTR_CHECK(d.has_value(), ValueError, "train: checkpoint {}: optimizer state '{}' of parameter {} has dtype '{}'",
                path, name, index, dtype.get<std::string>());
      const DTensorSpec typed(spec.mesh(), spec.placements(), spec.shape(), *d);
      // Read beside the parameter (the host under --cpu-offload).
      const Tensor& beside = params[static_cast<size_t>(index)]->to_local();
      const DTensor empty(zeros(typed.local_shape(), typed.dtype(), beside.device()), typed);
      state.tensors.emplace(fmt::format("optim.{}.{}", index, name), empty);
      param.tensors[name] = empty;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  checkpoint::load(state, path, progress_printer(path, "read"));
  if (default_group()->rank() == 0) {
    int64_t bytes = 0;
    for (const auto& [name, t] : state.tensors)
      bytes += shape_numel(t.shape()) * static_cast<int64_t>(itemsize(t.dtype()));
    fmt::print("loaded checkpoint {}: {:.1f} MiB in {:.1f} s\n", path, mib(bytes), seconds_since(start));
    std::fflush(stdout);
  }
  {
    const NoGradGuard no_grad;
    for (auto& [name, p] : model.named_parameters()) {
      Tensor local = p->to_local();
      local.copy_(state.tensors.at("model." + name).to_local());
    }
  }
  for (auto& [index, param] : saved.state) {
    for (auto& [name, t] : param.tensors) t = state.tensors.at(fmt::format("optim.{}.{}", index, name));
  }
  opt.load_state_dict(saved);
  const nlohmann::json& rng = state.extra.at("rng");
  nn::set_seed_state({.seed = rng.at("seed").get<uint64_t>(), .draws = rng.at("draws").get<uint64_t>()});
  return {.step = state.extra.at("step").get<int64_t>(), .window = state.extra.at("window").get<int64_t>()};
}

}  // namespace

RunPosition load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt) {
  // Every rank reads the same metadata, so a malformed `extra` fails on all of them alike.
  try {
    return load_unchecked(path, model, opt);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(fmt::format("train: checkpoint {} was not written by train (its extra: {})", path, e.what()));
  } catch (const std::invalid_argument& e) {
    throw ValueError(fmt::format("train: checkpoint {} was not written by train (its extra: {})", path, e.what()));
  }
}

}  // namespace dtr::train
