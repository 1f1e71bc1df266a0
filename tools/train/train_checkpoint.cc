#include "tools/train/train_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "collectives/init.h"
#include "collectives/process_group.h"
#include "dtensor/autograd.h"
#include "dtensor/checkpoint.h"
#include "kernels/error.h"
#include "kernels/fill.h"
#include "nn/init.h"

namespace dtr::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "step_";

DType dtype_named(const std::string& name) {
  for (DType d : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kBool}) {
    if (dtype_name(d) == name) return d;
  }
  throw ValueError(fmt::format("train: a checkpoint's optimizer state has an unknown dtype '{}'", name));
}

// The committed checkpoints under `dir`, oldest first (a save in progress or killed is a
// temporary directory, not a step_* one).
std::vector<fs::path> committed(const std::string& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.starts_with(kPrefix) && name.find('.') == std::string::npos &&
        fs::exists(e.path() / ".metadata.json")) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

constexpr double kMiB = 1024.0 * 1024.0;

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
    fmt::print("checkpoint {}: {:.1f} of {:.1f} MiB {}\n", name, p.done_bytes / kMiB, p.total_bytes / kMiB, verb);
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
      dtypes[name] = std::string(dtype_name(t.dtype()));
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

void Checkpointer::finish() { commit(); }

void Checkpointer::commit() {
  if (in_flight_.done()) return;  // nothing in flight (or already committed)
  in_flight_.wait();
  if (default_group()->rank() != 0) return;
  fmt::print("checkpoint {} committed: {:.1f} MiB\n", fs::path(in_flight_path_).filename().string(),
             in_flight_bytes_ / kMiB);
  std::fflush(stdout);
  std::vector<fs::path> all = committed(dir_);
  for (size_t k = 0; k + static_cast<size_t>(keep_last_) < all.size(); ++k) fs::remove_all(all[k]);
  // No save is in flight now: any temporary directory is what a killed save left.
  for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(kPrefix) &&
        (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos)) {
      fs::remove_all(e.path());
    }
  }
}

std::string resume_path(const std::string& resume, const std::string& checkpoint_dir) {
  if (resume != "latest") return resume;
  const std::vector<fs::path> all = committed(checkpoint_dir);
  return all.empty() ? "" : all.back().string();
}

RunPosition load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt) {
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
      const DTensorSpec typed(spec.mesh(), spec.placements(), spec.shape(), dtype_named(dtype.get<std::string>()));
      const DTensor empty(zeros(typed.local_box().shape, typed.dtype(), typed.mesh().device_type()), typed);
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
    fmt::print("loaded checkpoint {}: {:.1f} MiB in {:.1f} s\n", path, bytes / kMiB, seconds_since(start));
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

}  // namespace dtr::train
