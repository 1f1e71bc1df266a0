#include "checkpoint/save.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <thread>

#include "checkpoint/chunk_file.h"
#include "checkpoint/internal/commit.h"
#include "checkpoint/internal/progress_meter.h"
#include "checkpoint/internal/rank_failure.h"
#include "checkpoint/metadata.h"
#include "collectives/all_gather_json.h"
#include "core/error.h"
#include "core/posix_file.h"

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
using internal::capture;
using internal::check_replaceable;
using internal::checkpoint_path;
using internal::commit;
using internal::is_checkpoint;
using internal::kSave;
using internal::leftover_siblings;
using internal::make_token;
using internal::ProgressMeter;
using internal::rank_file;
using internal::world;
using internal::World;

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

// Whether this rank writes its chunk of `t`: coordinate 0 on every mesh dim where t is
// Replicate (the others hold the same values).
bool writes_chunk(const DTensor& t) {
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
  TempPath temp_owner;                          // rank 0: the temporary directory until commit
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
    // A rank file holds one entry per tensor, so a rank saves one rectangle of each: a
    // StridedShard that leaves ranks several ranges is saved as the Shard of its dim (one
    // all_gather, every rank taking part as in any save); load reads any rectangles into any
    // placements, StridedShard included.
    Placements plain = t.placements();
    for (Placement& p : plain) {
      if (p.is_strided_shard()) p = Shard(p.shard_dim());
    }
    const DTensor rectangle = t.spec().has_strided_pieces() ? t.detach().redistribute(plain) : t;
    if (!writes_chunk(rectangle)) continue;
    const LocalChunk chunk = rectangle.spec().local_chunk();
    if (shape_numel(chunk.shape) == 0) continue;
    const Tensor& local = rectangle.to_local();
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
  if (s->w.rank == 0) s->temp_owner = TempPath(s->temp);
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
    commit(std::move(s.temp_owner), s.target, s.token);
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

// Commits (or throws the error of) this process's async_save still pending, if any.
void wait_for_async_save() {
  std::weak_ptr<internal::PendingSave>& latest = latest_async_save();
  const std::shared_ptr<internal::PendingSave> previous = latest.lock();
  latest.reset();
  if (previous != nullptr && !previous->finished) AsyncSave(previous).wait();
}

}  // namespace

void save(const State& state, const std::string& dir, const ProgressCallback& on_progress) {
  wait_for_async_save();  // its commit sweeps leftovers: none may be in flight meanwhile
  const std::unique_ptr<StagedSave> staged = begin_save(state, dir, Staging::kShare, on_progress);
  Json written = Json::object();
  const std::exception_ptr error = capture(written, [&] { written.update(write_staged(*staged)); });
  finish_save(*staged, error, written);
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
