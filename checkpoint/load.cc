#include "checkpoint/load.h"

#include <algorithm>
#include <filesystem>

#include "checkpoint/chunk_file.h"
#include "checkpoint/internal/commit.h"
#include "checkpoint/internal/progress_meter.h"
#include "checkpoint/internal/rank_failure.h"
#include "checkpoint/metadata.h"
#include "collectives/all_gather_json.h"
#include "core/error.h"

namespace dtr::checkpoint {
namespace {

namespace fs = std::filesystem;
using internal::CheckpointMetadata;
using internal::SavedChunk;
using internal::SavedTensor;
using Json = nlohmann::json;
using internal::checkpoint_path;
using internal::kLoad;
using internal::leftover_siblings;
using internal::ProgressMeter;

CheckpointMetadata read_metadata(const fs::path& target) {
  std::error_code ec;
  const fs::file_status status = fs::status(target, ec);
  if (fs::exists(status) && !fs::is_directory(status)) {
    const fs::path parent = target.parent_path();
    throw ValueError(fmt::format("{}: '{}' is a file, not a checkpoint directory{}", kLoad, target.string(),
                                 internal::is_checkpoint(parent)
                                     ? fmt::format(" (the checkpoint that holds it is '{}')", parent.string())
                                     : ""));
  }
  if (!fs::is_directory(status)) {
    std::string hint;
    for (const fs::path& p : leftover_siblings(target)) {
      if (p.filename().string().starts_with(target.filename().string() + ".old-")) {
        hint = fmt::format(" (a save interrupted while replacing it left the previous checkpoint at '{}')", p.string());
      }
    }
    throw OSError(ENOENT, fmt::format("{}: no checkpoint directory '{}'{}", kLoad, target.string(), hint));
  }
  const fs::path path = target / internal::kMetadataFile;
  DTR_CHECK(fs::exists(fs::symlink_status(path, ec)), ValueError,
            "{}: '{}' has no {}: an incomplete checkpoint (a save that did not finish) or not a checkpoint", kLoad,
            target.string(), internal::kMetadataFile);
  return internal::read_metadata_file(path.string(), kLoad);
}

// Every requested tensor exists with the same shape and dtype, and is not Partial; one
// message lists every problem.
void check_loadable(const State& state, const CheckpointMetadata& meta, const fs::path& target) {
  std::vector<std::string> problems;
  bool missing = false;
  for (const auto& [name, t] : state.tensors) {
    if (!t.defined()) {
      problems.push_back(fmt::format("tensor '{}' is undefined (give a DTensor of the wanted spec)", name));
      continue;
    }
    const auto it = meta.tensors.find(name);
    if (it == meta.tensors.end()) {
      problems.push_back(fmt::format("tensor '{}' is not in the checkpoint", name));
      missing = true;
      continue;
    }
    const SavedTensor& s = it->second;
    if (s.shape != t.shape() || s.dtype != t.dtype()) {
      problems.push_back(fmt::format("tensor '{}' is {}{} in the checkpoint but {}{} in the state", name, s.dtype,
                                     s.shape, t.dtype(), t.shape()));
    }
    if (t.spec().has_partial()) {
      problems.push_back(
          fmt::format("tensor '{}' is {}: a Partial target has no one value to load into; load into "
                      "Replicate or Shard placements",
                      name, t.spec().to_string()));
    }
  }
  if (problems.empty()) return;
  std::string message =
      fmt::format("{}: '{}': {} problem(s): {}{}", kLoad, target.string(), problems.size(),
                  fmt::join(problems.begin(), problems.begin() + std::min<size_t>(problems.size(), 5), "; "),
                  problems.size() > 5 ? fmt::format("; and {} more", problems.size() - 5) : "");
  if (missing) {
    std::vector<std::string> names;
    for (const auto& [name, s] : meta.tensors) {
      if (names.size() == 8) {
        names.push_back("...");
        break;
      }
      names.push_back(fmt::format("'{}'", name));
    }
    message += fmt::format(" (it holds {} tensors: {}; checkpoint_tool list shows them all)", meta.tensors.size(),
                           fmt::join(names, ", "));
  }
  throw ValueError(message);
}

// This rank's part of `target`, read piece by piece from the saved chunks it overlaps.
DTensor load_tensor(const std::string& name, const DTensor& target, const SavedTensor& saved,
                    internal::ChunkFileReader& files, ProgressMeter& meter) {
  const DTensorSpec& spec = target.spec();
  const std::vector<LocalPiece> pieces = spec.local_pieces();
  // A saved chunk that is exactly this rank's only piece (a load on the mesh and placements
  // it was saved from) is read straight into the local, without a second buffer and a copy.
  const LocalChunk& only = pieces.front().chunk;
  for (const SavedChunk& chunk : saved.chunks) {
    if (pieces.size() != 1 || shape_numel(only.shape) == 0 || chunk.offset != only.offset || chunk.shape != only.shape)
      continue;
    DTensor out(files.read_rows(name, saved.dtype, chunk, 0, internal::chunk_rows(chunk.shape))
                    .data.to(target.to_local().device()),
                spec);
    meter.add(static_cast<int64_t>(out.to_local().nbytes()));
    if (target.requires_grad() && target.is_leaf()) out.requires_grad_(true);
    return out;
  }
  Tensor local = Tensor::empty(spec.local_shape(), spec.dtype(), kCPU);
  for (const LocalPiece& piece : pieces) {
    if (shape_numel(piece.chunk.shape) == 0) continue;
    files.read_region(name, saved, piece.chunk, chunk_of(local, {piece.local_offset, piece.chunk.shape}),
                      [&](int64_t bytes) { meter.add(bytes); });
  }
  DTensor out(local.to(target.to_local().device()), spec);
  if (target.requires_grad() && target.is_leaf()) out.requires_grad_(true);
  return out;
}

}  // namespace

bool is_committed_checkpoint(const std::string& dir) { return internal::is_checkpoint(dir); }

std::vector<std::string> saved_tensor_names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : read_metadata(checkpoint_path(dir, kLoad)).tensors) names.push_back(name);
  return names;
}

void load(State& state, const std::string& dir, const ProgressCallback& on_progress) {
  const internal::World w = internal::world();
  const fs::path target = checkpoint_path(dir, kLoad);
  std::map<std::string, DTensor> loaded;
  Json extra;
  Json outcome = Json::object();
  const std::exception_ptr error = internal::capture(outcome, [&] {
    const CheckpointMetadata meta = read_metadata(target);
    check_loadable(state, meta, target);
    internal::ChunkFileReader files(target.string());
    int64_t total = 0;
    for (const auto& [name, t] : state.tensors) {
      total += shape_numel(t.spec().local_shape()) * static_cast<int64_t>(itemsize(t.dtype()));
    }
    ProgressMeter meter(on_progress, total);
    for (const auto& [name, t] : state.tensors)
      loaded[name] = load_tensor(name, t, meta.tensors.at(name), files, meter);
    meter.finish();
    extra = meta.extra;
  });
  internal::raise_if_any_failed(all_gather_json(w.group.get(), outcome), error, kLoad);
  for (auto& [name, t] : state.tensors) t = std::move(loaded.at(name));
  state.extra = std::move(extra);
}

}  // namespace dtr::checkpoint
