#include "tools/train/train_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <vector>

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

constexpr std::string_view kPrefix = "step_";

// Whether `text` is a decimal number of 1 to `max_digits` digits.
bool is_decimal(std::string_view text, size_t max_digits) {
  return !text.empty() && text.size() <= max_digits &&
         std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

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

Checkpointer::Checkpointer(std::string checkpoint_dir, int64_t keep_last, nlohmann::json model_flags)
    : dir_(std::move(checkpoint_dir)), keep_last_(keep_last), model_flags_(std::move(model_flags)) {}

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
                 {"optim", optim},
                 {"model", model_flags_}};
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

void check_no_earlier_checkpoints(const std::string& checkpoint_dir, std::string_view flag) {
  const std::vector<fs::path> all = committed(checkpoint_dir);
  DTR_CHECK(all.empty(), ValueError,
            "{}: {} holds an earlier run's checkpoints ({} of them, {} to {}); continue that run with --resume latest, "
            "or give this one another {} (its checkpoints would be deleted by --keep-last in favour of those)",
            flag, checkpoint_dir, all.size(), all.empty() ? "" : all.front().filename().string(),
            all.empty() ? "" : all.back().filename().string(), flag);
}

void set_aside_later_checkpoints(const std::string& checkpoint_dir, int64_t step) {
  for (const fs::path& p : committed(checkpoint_dir)) {
    const std::string name = p.filename().string();
    const std::string digits = name.substr(kPrefix.size());
    if (!is_decimal(digits, 18) || std::stoll(digits) <= step) continue;
    // Unique: the same step may be resumed again after a newer line wrote this step anew.
    fs::path aside = p.string() + fmt::format(".abandoned-at-{}", step);
    for (int k = 2; fs::exists(aside); ++k) aside = p.string() + fmt::format(".abandoned-at-{}-{}", step, k);
    std::error_code ec;
    fs::rename(p, aside, ec);
    if (ec) {
      fmt::print("train: cannot set aside {}, a checkpoint after the one resumed: {}\n", p.string(), ec.message());
    } else {
      fmt::print(
          "train: set aside {} (after the step resumed; --resume latest and --keep-last follow this run) as {}\n", name,
          aside.filename().string());
    }
  }
  std::fflush(stdout);
}

std::string resume_path(const std::string& resume, const std::string& checkpoint_dir) {
  if (resume != "latest") return resume;
  const std::vector<fs::path> all = committed(checkpoint_dir);
  return all.empty() ? "" : all.back().string();
}

namespace {

// The largest step, data window and draw count a checkpoint may hold: far beyond any run,
// and small enough that the arithmetic on them cannot overflow.
constexpr int64_t kMaxCount = int64_t{1} << 62;

// What `extra` holds for one parameter's optimizer state.
struct SavedOptimParam {
  int64_t step = 0;
  std::map<std::string, DType> dtypes;
};

// `extra` read and checked: every field there, of its type and in its range.
struct SavedExtra {
  RunPosition position;
  nn::SeedState rng;
  std::map<int64_t, SavedOptimParam> optim;
};

// Reads `extra` of the checkpoint at `path` for a model of `num_params` parameters; one
// ValueError line naming the field and what is legal when it is missing or off.
class ExtraReader {
 public:
  explicit ExtraReader(const std::string& path) : path_(path) {}

  // The object at `where` ("extra.rng"): ValueError unless it is a JSON object.
  const nlohmann::json& object(const nlohmann::json& parent, const std::string& key, const std::string& where) const {
    DTR_CHECK(parent.contains(key) && parent.at(key).is_object(), ValueError,
              "--resume {}: {} is missing or not an object (a checkpoint train wrote holds it)", path_, where);
    return parent.at(key);
  }

  // The integer at `where`, in [lo, hi].
  int64_t integer(const nlohmann::json& parent, const std::string& key, const std::string& where, int64_t lo,
                  int64_t hi) const {
    const nlohmann::json* v = parent.contains(key) ? &parent.at(key) : nullptr;
    // An unsigned value past int64's range would read as negative.
    const bool whole = v != nullptr && v->is_number_integer() &&
                       !(v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) &&
                       v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
    DTR_CHECK(whole, ValueError, "--resume {}: {} is {}; legal: a whole number in [{}, {}]", path_, where,
              v != nullptr ? v->dump() : "missing", lo, hi);
    return v->get<int64_t>();
  }

  // The unsigned 64-bit integer at `where`.
  uint64_t unsigned_integer(const nlohmann::json& parent, const std::string& key, const std::string& where) const {
    const nlohmann::json* v = parent.contains(key) ? &parent.at(key) : nullptr;
    DTR_CHECK(v != nullptr && (v->is_number_unsigned() || (v->is_number_integer() && v->get<int64_t>() >= 0)),
              ValueError, "--resume {}: {} is {}; legal: a whole number in [0, 2^64)", path_, where,
              v != nullptr ? v->dump() : "missing");
    return v->get<uint64_t>();
  }

  // `extra` for a model of `num_params` parameters built from `model_flags`.
  SavedExtra read(const nlohmann::json& extra, int64_t num_params, const nlohmann::json& model_flags) const {
    DTR_CHECK(extra.is_object() && extra.contains("step") && extra.contains("optim"), ValueError,
              "--resume {}: the checkpoint holds no training state (no step, optimizer state or data position: "
              "checkpoint_tool to-sharded writes such); to start a new run from its weights, export them "
              "(checkpoint_tool export) and give --init-from",
              path_);
    if (extra.contains("model")) check_model_flags(object(extra, "model", "extra.model"), model_flags);
    SavedExtra out;
    out.position.step = integer(extra, "step", "extra.step", 0, kMaxCount);
    out.position.window = integer(extra, "window", "extra.window", 0, kMaxCount);
    const nlohmann::json& rng = object(extra, "rng", "extra.rng");
    out.rng = {.seed = unsigned_integer(rng, "seed", "extra.rng.seed"),
               .draws = static_cast<uint64_t>(integer(rng, "draws", "extra.rng.draws", 0, kMaxCount))};
    for (const auto& [key, entry] : object(extra, "optim", "extra.optim").items()) {
      const std::string where = "extra.optim." + key;
      DTR_CHECK(is_decimal(key, 9) && std::stoll(key) < num_params, ValueError,
                "--resume {}: {}: the checkpoint has optimizer state for a parameter '{}' but the model's are 0 to "
                "{} (was it saved with other model flags?)",
                path_, where, key, num_params - 1);
      DTR_CHECK(entry.is_object(), ValueError, "--resume {}: {} is not an object", path_, where);
      SavedOptimParam& param = out.optim[std::stoll(key)];
      // A parameter's optimizer has stepped at most as often as the run.
      param.step = integer(entry, "step", where + ".step", 1, std::max<int64_t>(out.position.step, 1));
      for (const auto& [name, dtype] : object(entry, "dtypes", where + ".dtypes").items()) {
        const std::optional<DType> d =
            dtype.is_string() ? dtype_from_safetensors(dtype.get<std::string>()) : std::nullopt;
        DTR_CHECK(d.has_value(), ValueError, "--resume {}: {}.dtypes.{} is {}; legal: a safetensors dtype (F32, BF16)",
                  path_, where, name, dtype.dump());
        param.dtypes[name] = *d;
      }
    }
    return out;
  }

 private:
  // ValueError listing every model flag the checkpoint was saved with that this run gives
  // otherwise.
  void check_model_flags(const nlohmann::json& saved, const nlohmann::json& ours) const {
    std::vector<std::string> differ;
    for (const auto& [flag, value] : ours.items()) {
      const std::string theirs = saved.contains(flag) && saved.at(flag).is_string() ? saved.at(flag).get<std::string>()
                                                                                    : std::string("(not recorded)");
      if (theirs != value.get<std::string>()) {
        differ.push_back(fmt::format("{} {} (this run: {})", flag, theirs, value.get<std::string>()));
      }
    }
    DTR_CHECK(differ.empty(), ValueError,
              "--resume {}: the checkpoint was saved with {}; resume with its model flags, or start a new run from "
              "its weights with --init-from",
              path_, fmt::join(differ, ", "));
  }

  const std::string& path_;
};

// ValueError unless every tensor the checkpoint holds is one this run reads: a parameter of
// the model, or optimizer state that `extra` lists (a checkpoint of another model, or an
// edited one, would otherwise load in part, the rest silently left out).
void check_saved_names(const std::string& path, const std::vector<std::string>& saved,
                       const checkpoint::State& model_state, const SavedExtra& extra) {
  std::unordered_set<std::string> read;
  for (const auto& [name, t] : model_state.tensors) read.insert(name);
  for (const auto& [index, param] : extra.optim) {
    for (const auto& [state_name, dtype] : param.dtypes) read.insert(fmt::format("optim.{}.{}", index, state_name));
  }
  std::vector<std::string> unread;
  for (const std::string& name : saved) {
    if (!read.contains(name)) unread.push_back(name);
  }
  constexpr size_t kNamed = 4;
  DTR_CHECK(unread.empty(), ValueError,
            "--resume {}: the checkpoint holds {} tensor(s) this run would not read: {}{}; a model of other flags "
            "(--arch and its switches?) or optimizer state extra.optim does not list",
            path, unread.size(), fmt::join(unread.begin(), unread.begin() + std::min(unread.size(), kNamed), ", "),
            unread.size() > kNamed ? ", ..." : "");
}

}  // namespace

RunPosition load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                            const nlohmann::json& model_flags) {
  // `extra` first, checked whole before any tensor is read: every rank reads the same
  // metadata, so a malformed one fails on all of them alike.
  checkpoint::State header;
  checkpoint::load(header, path);
  checkpoint::State state;
  std::vector<DTensor*> params;
  for (auto& [name, p] : model.named_parameters()) {
    state.tensors.emplace("model." + name, *p);
    params.push_back(p);
  }
  const SavedExtra extra = ExtraReader(path).read(header.extra, static_cast<int64_t>(params.size()), model_flags);
  check_saved_names(path, checkpoint::saved_tensor_names(path), state, extra);
  optim::OptimizerState saved = opt.state_dict();
  for (const auto& [index, entry] : extra.optim) {
    optim::OptimizerState::Param& param = saved.state[index];
    param.step = entry.step;
    for (const auto& [name, dtype] : entry.dtypes) {
      const DTensorSpec spec = params[static_cast<size_t>(index)]->spec();
      const DTensorSpec typed(spec.mesh(), spec.placements(), spec.shape(), dtype);
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
  nn::set_seed_state(extra.rng);
  return extra.position;
}

}  // namespace dtr::train
