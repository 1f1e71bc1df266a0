#include "dtensor/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc 2.28)
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "collectives/all_gather_json.h"
#include "collectives/init.h"
#include "collectives/posix_file.h"
#include "collectives/process_group.h"
#include "dtensor/internal/checkpoint_metadata.h"
#include "dtensor/internal/chunk_file.h"
#include "dtensor/internal/rank_failure.h"
#include "kernels/error.h"

namespace dtr::checkpoint {
namespace internal {
struct StagedSave;
}
namespace {

namespace fs = std::filesystem;
using internal::CheckpointMetadata;
using internal::SavedChunk;
using internal::SavedTensor;
using Json = nlohmann::json;

constexpr std::string_view kSave = "checkpoint::save";
constexpr std::string_view kLoad = "checkpoint::load";

// The default group (none: a world of one process).
struct World {
  std::shared_ptr<ProcessGroup> group;
  int rank = 0;
  int size = 1;
};

World world() {
  if (!is_initialized()) return {};
  std::shared_ptr<ProcessGroup> group = default_group();
  const int rank = group->rank(), size = group->size();
  return {std::move(group), rank, size};
}

// The checkpoint directory as an absolute path without a trailing separator.
fs::path checkpoint_path(const std::string& dir, std::string_view op) {
  DTR_CHECK(!dir.empty(), ValueError, "{}: the checkpoint directory is an empty string", op);
  fs::path p = fs::absolute(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "ckpt/" -> "ckpt"
  DTR_CHECK(p.has_filename() && p.filename() != "." && p.filename() != "..", ValueError,
            "{}: '{}' does not name a directory that can be replaced (it has no last component)", op, dir);
  return p;
}

// Calls a progress callback at most every kProgressInterval while bytes move, and once at
// the end with done == total.
class ProgressMeter {
 public:
  static constexpr std::chrono::seconds kProgressInterval{1};

  ProgressMeter(const ProgressCallback& on_progress, int64_t total)
      : on_progress_(on_progress), progress_{0, total}, last_(std::chrono::steady_clock::now()) {}

  void add(int64_t bytes) {
    progress_.done_bytes += bytes;
    if (!on_progress_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < kProgressInterval) return;
    last_ = now;
    on_progress_(progress_);
  }

  void finish() {
    DTR_INTERNAL_ASSERT(progress_.done_bytes == progress_.total_bytes,
                        "checkpoint progress counted {} of {} bytes at the end (a bug)", progress_.done_bytes,
                        progress_.total_bytes);
    if (on_progress_) on_progress_(progress_);
  }

 private:
  const ProgressCallback& on_progress_;
  Progress progress_;
  std::chrono::steady_clock::time_point last_;
};

std::string rank_file(int rank) { return fmt::format("__{}_0.safetensors", rank); }

bool is_checkpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / internal::kMetadataFile, ec);
}

// Siblings `<dir>.tmp-*` (saves that did not commit) and `<dir>.old-*` (the previous
// checkpoint during a commit without an atomic exchange).
std::vector<fs::path> leftover_siblings(const fs::path& target) {
  std::vector<fs::path> out;
  std::error_code ec;
  const std::string tmp = target.filename().string() + ".tmp-", old = target.filename().string() + ".old-";
  for (fs::directory_iterator it(target.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(tmp) || name.starts_with(old)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Rank 0's checks before anything is written: `dir` must be absent, empty or a checkpoint.
void check_replaceable(const fs::path& target) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(target, ec);
  if (!fs::exists(st)) return;
  DTR_CHECK(fs::is_directory(st), ValueError, "{}: '{}' exists and is not a directory; refusing to replace it", kSave,
            target.string());
  DTR_CHECK(is_checkpoint(target) || fs::is_empty(target, ec), ValueError,
            "{}: '{}' exists and is not a dtr checkpoint (it has no {}); refusing to replace it: remove it or save "
            "elsewhere",
            kSave, target.string(), internal::kMetadataFile);
}

std::string make_token() {
  std::random_device device;
  const uint64_t r = (static_cast<uint64_t>(device()) << 32) ^ device();
  return fmt::format("{}-{:016x}", ::getpid(), r);
}

Json mesh_json(const DeviceMesh& mesh) {
  return {{"device_type", mesh.device_type() == kCPU ? "cpu" : "cuda"},
          {"shape", mesh.shape()},
          {"ranks", mesh.ranks()},
          {"dim_names", mesh.dim_names()}};
}

void check_saveable(const State& state, int world_size) {
  for (const auto& [name, t] : state.tensors) {
    DTR_CHECK(t.defined(), ValueError, "{}: tensor '{}' is undefined", kSave, name);
    DTR_CHECK(!t.spec().has_partial(), ValueError,
              "{}: tensor '{}' is {}: a Partial tensor holds terms of a reduction, not values; reduce it first "
              "(redistribute to Replicate or Shard)",
              kSave, name, t.spec().to_string());
    DTR_CHECK(t.mesh().size() == world_size, ValueError,
              "{}: tensor '{}' is on {} ({} ranks) but the default group has {}; a checkpoint holds tensors of the "
              "whole world",
              kSave, name, t.mesh().to_string(), t.mesh().size(), world_size);
  }
}

// Whether this rank writes its chunk of `t`: a non-empty chunk, and coordinate 0 on every
// mesh dim where t is Replicate (the others hold the same values).
bool writes_chunk(const DTensor& t, const LocalChunk& chunk) {
  if (shape_numel(chunk.shape) == 0) return false;
  const std::vector<int64_t>& coordinate = t.mesh().coordinate();
  for (size_t m = 0; m < t.placements().size(); ++m) {
    if (t.placements()[m].is_replicate() && coordinate[m] != 0) return false;
  }
  return true;
}

// Whether save's host copies share the tensors' storage (save: they are written before it
// returns) or are copies (async_save: the tensors may change while they are written).
enum class Staging { kShare, kCopy };

// This rank's chunks as contiguous CPU tensors, with each tensor's spec (for the ranks'
// agreement check) and metadata entry without its chunks.
void stage(const State& state, Staging staging, internal::StagedSave& s);

// Every rank must have saved the same tensors (names and specs) and the same extra.
void check_ranks_agree(const std::vector<Json>& outcomes) {
  const Json& first = outcomes[0]["tensors"];
  for (size_t r = 1; r < outcomes.size(); ++r) {
    const Json& mine = outcomes[r]["tensors"];
    for (const auto& [name, spec] : first.items()) {
      DTR_CHECK(mine.contains(name), ValueError,
                "{}: rank 0 saves tensor '{}' but rank {} does not; every rank must save the same tensors", kSave, name,
                r);
      DTR_CHECK(mine[name] == spec, ValueError,
                "{}: tensor '{}' is {} on rank 0 but {} on rank {}; every rank must save the same tensors", kSave, name,
                spec.get<std::string>(), mine[name].get<std::string>(), r);
    }
    for (const auto& [name, spec] : mine.items()) {
      DTR_CHECK(first.contains(name), ValueError,
                "{}: rank {} saves tensor '{}' but rank 0 does not; every rank must save the same tensors", kSave, r,
                name);
    }
    DTR_CHECK(outcomes[r]["extra"] == outcomes[0]["extra"], ValueError,
              "{}: extra differs between rank 0 ({}) and rank {} ({}); it is saved once, so every rank must pass the "
              "same (store per-rank values under keys that name the rank)",
              kSave, outcomes[0]["extra"].dump(), r, outcomes[r]["extra"].dump());
  }
}

CheckpointMetadata build_metadata(const std::map<std::string, SavedTensor>& skeleton, const Json& extra,
                                  const std::vector<Json>& outcomes) {
  CheckpointMetadata m;
  m.world_size = static_cast<int64_t>(outcomes.size());
  m.extra = extra;
  m.tensors = skeleton;
  for (const Json& outcome : outcomes) {
    for (const Json& c : outcome["chunks"]) {
      m.tensors.at(c["name"].get<std::string>())
          .chunks.push_back(SavedChunk{c["offset"].get<Shape>(), c["shape"].get<Shape>(), c["file"].get<std::string>(),
                                       c["byte_range"][0].get<int64_t>(), c["byte_range"][1].get<int64_t>(),
                                       c["rows_per_block"].get<int64_t>(), c["crc32c"].get<std::vector<uint32_t>>()});
    }
  }
  for (auto& [name, s] : m.tensors) {
    std::sort(s.chunks.begin(), s.chunks.end(),
              [](const SavedChunk& a, const SavedChunk& b) { return a.offset < b.offset; });
  }
  return m;
}

// Moves the complete `temp` to `target`. With an existing checkpoint there, renameat2's
// RENAME_EXCHANGE swaps the two directories in one atomic step and the previous one is
// then removed; where the filesystem cannot exchange, the previous one moves aside to
// `<dir>.old-<token>` first (a crash between the two renames leaves no `dir`, the previous
// checkpoint there and the new complete one at `temp`). `moved` is set as soon as the new
// checkpoint is at `target`; the parent is fsync'ed after (a failure then says the new
// checkpoint is in place).
void commit(const fs::path& temp, const fs::path& target, const std::string& token, bool& moved) {
  const std::string parent = target.parent_path().string();
  auto make_durable = [&] {
    moved = true;
    try {
      sync_directory(parent, kSave);
    } catch (const OSError& e) {
      throw OSError(e.error_number(),
                    fmt::format("{}: fsync('{}') after the new checkpoint was renamed into place (it is there, "
                                "but the rename may not survive a power loss)",
                                kSave, parent));
    }
  };
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(target, ec))) {
    if (::rename(temp.c_str(), target.c_str()) != 0) {
      throw OSError(errno, fmt::format("{}: rename('{}', '{}')", kSave, temp.string(), target.string()));
    }
    make_durable();
    return;
  }
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    make_durable();
    fs::remove_all(temp, ec);  // the previous checkpoint, now under the temporary name
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
    throw OSError(errno,
                  fmt::format("{}: renameat2('{}', '{}', RENAME_EXCHANGE)", kSave, temp.string(), target.string()));
  }
  const fs::path old = target.string() + ".old-" + token;
  if (::rename(target.c_str(), old.c_str()) != 0) {
    throw OSError(errno, fmt::format("{}: rename('{}', '{}')", kSave, target.string(), old.string()));
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::rename(old.c_str(), target.c_str());  // put the previous checkpoint back
    throw OSError(error, fmt::format("{}: rename('{}', '{}')", kSave, temp.string(), target.string()));
  }
  make_durable();
  fs::remove_all(old, ec);
}

// Rank 0's temporary directory, removed unless the save committed it.
struct TempDirGuard {
  fs::path path;
  bool committed = false;
  TempDirGuard() = default;
  TempDirGuard(const TempDirGuard&) = delete;
  TempDirGuard& operator=(const TempDirGuard&) = delete;
  ~TempDirGuard() {
    std::error_code ec;
    if (!committed && !path.empty()) fs::remove_all(path, ec);
  }
};

// Runs f, returning the exception it threw (or null) and recording it in `outcome`.
template <class F>
std::exception_ptr capture(Json& outcome, F&& f) {
  try {
    f();
    return nullptr;
  } catch (...) {
    std::exception_ptr e = std::current_exception();
    outcome["error"] = internal::failure_json(e);
    return e;
  }
}

}  // namespace

// A save between its checks (step 1, on the calling thread) and its commit (step 3): what
// the rank file write (step 2, on any thread) needs, and what the commit needs after it.
struct internal::StagedSave {
  World w;
  fs::path target, temp;
  std::string token;
  std::vector<internal::ChunkToWrite> chunks;  // this rank's chunks, on the host, with offsets
  Json signatures = Json::object();            // name -> spec string
  Json extra;
  std::map<std::string, SavedTensor> skeleton;  // every tensor's metadata without chunks
  TempDirGuard guard;                           // rank 0's temporary directory
  ProgressCallback on_progress;                 // called by the writer (step 2)
};

// An async_save between its call and its wait(): the staged save, its writer thread and
// what the writer produced; then whether it is finished and how.
struct internal::PendingSave {
  std::unique_ptr<StagedSave> staged;
  std::thread writer;
  Json written = Json::object();  // the writer's outcome: chunk list, or {"error"}
  std::exception_ptr write_error;
  std::atomic<bool> write_ended{false};  // set by the writer as its last act
  bool finished = false;
  std::exception_ptr result;  // wait()'s error, once finished
  ~PendingSave() {
    if (writer.joinable()) writer.join();
  }
};

namespace {

using internal::StagedSave;

void stage(const State& state, Staging staging, StagedSave& s) {
  for (const auto& [name, t] : state.tensors) {
    s.signatures[name] = t.spec().to_string();
    SavedTensor& saved = s.skeleton[name];
    saved.dtype = t.dtype();
    saved.shape = t.shape();
    saved.mesh = mesh_json(t.mesh());
    for (const Placement& p : t.placements()) saved.placements.push_back(p.str());
    const LocalChunk chunk = t.spec().local_chunk();
    if (!writes_chunk(t, chunk)) continue;
    const Tensor& local = t.to_local();
    // to(kCPU) of a GPU tensor copies already; contiguous() of a contiguous CPU one does not.
    Tensor host = local.device().is_cuda() || staging == Staging::kShare ? local.to(kCPU).contiguous() : local.clone();
    s.chunks.push_back({name, std::move(host), chunk.offset});
  }
  s.extra = state.extra;
}

// Step 1: every rank checks and stages its state; rank 0 checks `dir`, clears leftovers of
// interrupted saves (only while a committed checkpoint is there: otherwise they may hold
// the only copy) and names the temporary directory.
std::unique_ptr<StagedSave> begin_save(const State& state, const std::string& dir, Staging staging,
                                       const ProgressCallback& on_progress) {
  auto s = std::make_unique<StagedSave>();
  s->on_progress = on_progress;
  s->w = world();
  s->target = checkpoint_path(dir, kSave);
  Json outcome = Json::object();
  std::exception_ptr error = capture(outcome, [&] {
    check_saveable(state, s->w.size);
    stage(state, staging, *s);
    if (s->w.rank != 0) return;
    check_replaceable(s->target);
    if (is_checkpoint(s->target)) {
      std::error_code ec;
      for (const fs::path& p : leftover_siblings(s->target)) fs::remove_all(p, ec);
    }
    outcome["token"] = make_token();
  });
  const std::vector<Json> outcomes = all_gather_json(s->w.group.get(), outcome);
  internal::raise_if_any_failed(outcomes, error, kSave);
  s->token = outcomes[0]["token"].get<std::string>();
  s->temp = s->target.string() + ".tmp-" + s->token;
  if (s->w.rank == 0) s->guard.path = s->temp;
  return s;
}

// Step 2 (no communication, any thread): writes this rank's file into the temporary
// directory and fsyncs it; returns {"tensors": {name: spec}, "chunks": [...], "extra"}.
Json write_staged(const StagedSave& s) {
  std::error_code ec;
  fs::create_directories(s.temp, ec);
  if (ec) throw OSError(ec.value(), fmt::format("{}: create_directories('{}')", kSave, s.temp.string()));
  const std::string file = rank_file(s.w.rank);
  int64_t total = 0;
  for (const internal::ChunkToWrite& c : s.chunks) total += static_cast<int64_t>(c.data.nbytes());
  ProgressMeter meter(s.on_progress, total);
  const std::vector<internal::WrittenChunk> written =
      internal::write_chunk_file((s.temp / file).string(), s.chunks, [&](int64_t bytes) { meter.add(bytes); });
  sync_directory(s.temp.string(), kSave);
  meter.finish();
  Json listed = Json::array();
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    listed.push_back({{"name", s.chunks[i].name},
                      {"offset", s.chunks[i].offset},
                      {"shape", s.chunks[i].data.shape()},
                      {"file", file},
                      {"byte_range", {written[i].begin, written[i].end}},
                      {"rows_per_block", written[i].rows_per_block},
                      {"crc32c", written[i].crc32c}});
  }
  return {{"tensors", s.signatures}, {"chunks", std::move(listed)}, {"extra", s.extra}};
}

// The exchange of step 2's outcomes is the barrier after which every file is on disk; then
// step 3: rank 0 writes the metadata last, fsyncs it, and commits; every rank learns how
// that went. `written` is this rank's step 2 outcome ({"error"} when `error` is set).
void finish_save(StagedSave& s, std::exception_ptr error, const Json& written) {
  std::vector<Json> outcomes = all_gather_json(s.w.group.get(), written);
  internal::raise_if_any_failed(outcomes, error, kSave);
  check_ranks_agree(outcomes);
  Json outcome = Json::object();
  error = capture(outcome, [&] {
    if (s.w.rank != 0) return;
    const std::string text = internal::metadata_to_json(build_metadata(s.skeleton, s.extra, outcomes)).dump(1);
    write_file_durably((s.temp / internal::kMetadataFile).string(), text, kSave);
    sync_directory(s.temp.string(), kSave);
    commit(s.temp, s.target, s.token, s.guard.committed);  // the guard keeps what moved into place
  });
  outcomes = all_gather_json(s.w.group.get(), outcome);
  internal::raise_if_any_failed(outcomes, error, kSave);
}

// This process's latest async_save, until the next one (or its wait()) finishes it; not
// owning: an AsyncSave destroyed before wait() is abandoned.
std::weak_ptr<internal::PendingSave>& latest_async_save() {
  static std::weak_ptr<internal::PendingSave> latest;
  return latest;
}

// --- load ---

CheckpointMetadata read_metadata(const fs::path& target) {
  std::error_code ec;
  if (!fs::is_directory(target, ec)) {
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
  FileDescriptor fd = open_file(path.string(), O_RDONLY, kLoad);
  const int64_t size = file_size(fd.get(), path.string(), kLoad);
  std::string text(static_cast<size_t>(size), '\0');
  DTR_CHECK(read_at(fd.get(), text.data(), text.size(), 0, path.string(), kLoad) == text.size(), ValueError,
            "{}: '{}' ended early (changed while being read?)", kLoad, path.string());
  try {
    return internal::metadata_from_json(Json::parse(text), path.string());
  } catch (const Json::exception& e) {
    throw ValueError(fmt::format("{}: '{}' is not valid checkpoint metadata: {}", kLoad, path.string(), e.what()));
  }
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

// The overlap of chunk `a` and a saved chunk at `offset` of `shape`, or none when they share
// no element.
std::optional<LocalChunk> intersect(const LocalChunk& a, const Shape& offset, const Shape& shape) {
  LocalChunk out{Shape(a.offset.size()), Shape(a.offset.size())};
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], offset[d]), hi = std::min(a.offset[d] + a.shape[d], offset[d] + shape[d]);
    if (hi <= lo) return std::nullopt;
    out.offset[d] = lo;
    out.shape[d] = hi - lo;
  }
  return out;
}

// This rank's chunk of `target`, read from the saved chunks it overlaps.
DTensor load_tensor(const std::string& name, const DTensor& target, const SavedTensor& saved,
                    internal::ChunkFileReader& files, const fs::path& dir, ProgressMeter& meter) {
  const DTensorSpec& spec = target.spec();
  const LocalChunk wanted = spec.local_chunk();
  // A saved chunk that is exactly this rank's chunk (a load on the mesh and placements it was
  // saved from) is read straight into the local, without a second buffer and a copy.
  for (const SavedChunk& chunk : saved.chunks) {
    if (shape_numel(wanted.shape) == 0 || chunk.offset != wanted.offset || chunk.shape != wanted.shape) continue;
    DTensor out(files.read_rows(name, saved.dtype, chunk, 0, internal::chunk_rows(chunk.shape))
                    .data.to(target.to_local().device()),
                spec);
    meter.add(static_cast<int64_t>(out.to_local().nbytes()));
    if (target.requires_grad() && target.is_leaf()) out.requires_grad_(true);
    return out;
  }
  Tensor local = Tensor::empty(wanted.shape, spec.dtype(), kCPU);
  if (shape_numel(wanted.shape) > 0) {
    std::vector<LocalChunk> filled;
    int64_t covered = 0;
    for (const SavedChunk& chunk : saved.chunks) {
      const std::optional<LocalChunk> common = intersect(wanted, chunk.offset, chunk.shape);
      if (!common) continue;
      for (const LocalChunk& other : filled) {
        DTR_CHECK(!intersect(other, common->offset, common->shape), ValueError,
                  "{}: '{}', tensor '{}': saved chunks overlap at offset {} (corrupt metadata)", kLoad, dir.string(),
                  name, common->offset);
      }
      const int64_t ndim = static_cast<int64_t>(wanted.shape.size());
      // The rows of the saved chunk the overlap spans (a 0-d chunk is one row).
      const int64_t row_begin = ndim == 0 ? 0 : common->offset[0] - chunk.offset[0];
      const int64_t row_end = ndim == 0 ? 1 : row_begin + common->shape[0];
      internal::ChunkRows rows = files.read_rows(name, saved.dtype, chunk, row_begin, row_end);
      Tensor src = rows.data, dst = local;
      for (int64_t d = 0; d < ndim; ++d) {
        const int64_t src_start = common->offset[d] - chunk.offset[d] - (d == 0 ? rows.first_row : 0);
        src = src.narrow(d, src_start, common->shape[d]);
        dst = dst.narrow(d, common->offset[d] - wanted.offset[d], common->shape[d]);
      }
      dst.copy_(src);
      filled.push_back(*common);
      covered += shape_numel(common->shape);
      meter.add(shape_numel(common->shape) * static_cast<int64_t>(itemsize(spec.dtype())));
    }
    DTR_CHECK(covered == shape_numel(wanted.shape), ValueError,
              "{}: '{}', tensor '{}': the saved chunks cover {} of the {} elements of this rank's chunk at offset {} "
              "of shape {} (corrupt metadata)",
              kLoad, dir.string(), name, covered, shape_numel(wanted.shape), wanted.offset, wanted.shape);
  }
  DTensor out(local.to(target.to_local().device()), spec);
  if (target.requires_grad() && target.is_leaf()) out.requires_grad_(true);
  return out;
}

}  // namespace

namespace {

// Commits (or throws the error of) this process's async_save still pending, if any.
void wait_for_async_save() {
  std::weak_ptr<internal::PendingSave>& latest = latest_async_save();
  const std::shared_ptr<internal::PendingSave> previous = latest.lock();
  latest.reset();
  if (previous != nullptr && !previous->finished) AsyncSave(previous).wait();
}

}  // namespace

bool is_committed_checkpoint(const std::string& dir) { return is_checkpoint(dir); }

void save(const State& state, const std::string& dir, const ProgressCallback& on_progress) {
  wait_for_async_save();  // its commit sweeps leftovers: none may be in flight meanwhile
  const std::unique_ptr<StagedSave> staged = begin_save(state, dir, Staging::kShare, on_progress);
  Json written = Json::object();
  const std::exception_ptr error = capture(written, [&] { written.update(write_staged(*staged)); });
  finish_save(*staged, error, written);
}

void load(State& state, const std::string& dir, const ProgressCallback& on_progress) {
  const World w = world();
  const fs::path target = checkpoint_path(dir, kLoad);
  std::map<std::string, DTensor> loaded;
  Json extra;
  Json outcome = Json::object();
  const std::exception_ptr error = capture(outcome, [&] {
    const CheckpointMetadata meta = read_metadata(target);
    check_loadable(state, meta, target);
    internal::ChunkFileReader files(target.string());
    int64_t total = 0;
    for (const auto& [name, t] : state.tensors) {
      total += shape_numel(t.spec().local_chunk().shape) * static_cast<int64_t>(itemsize(t.dtype()));
    }
    ProgressMeter meter(on_progress, total);
    for (const auto& [name, t] : state.tensors)
      loaded[name] = load_tensor(name, t, meta.tensors.at(name), files, target, meter);
    meter.finish();
    extra = meta.extra;
  });
  internal::raise_if_any_failed(all_gather_json(w.group.get(), outcome), error, kLoad);
  for (auto& [name, t] : state.tensors) t = std::move(loaded.at(name));
  state.extra = std::move(extra);
}

void AsyncSave::wait() {
  if (pending_ == nullptr) return;
  internal::PendingSave& p = *pending_;
  if (!p.finished) {
    if (p.writer.joinable()) p.writer.join();
    p.finished = true;
    try {
      finish_save(*p.staged, p.write_error, p.written);
    } catch (...) {
      p.result = std::current_exception();
    }
    p.staged.reset();  // frees the host copies; rank 0 removes an uncommitted temporary directory
  }
  if (p.result) std::rethrow_exception(p.result);
}

bool AsyncSave::done() const { return pending_ == nullptr || pending_->finished; }

bool AsyncSave::written() const { return pending_ == nullptr || pending_->write_ended.load(std::memory_order_acquire); }

AsyncSave async_save(const State& state, const std::string& dir, const ProgressCallback& on_progress) {
  wait_for_async_save();
  std::weak_ptr<internal::PendingSave>& latest = latest_async_save();

  auto pending = std::make_shared<internal::PendingSave>();
  pending->staged = begin_save(state, dir, Staging::kCopy, on_progress);
  internal::PendingSave* p = pending.get();
  pending->writer = std::thread([p] {
    p->write_error = capture(p->written, [p] { p->written.update(write_staged(*p->staged)); });
    p->write_ended.store(true, std::memory_order_release);
  });
  latest = pending;
  return AsyncSave(pending);
}

}  // namespace dtr::checkpoint
