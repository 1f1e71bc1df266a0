// Distributed checkpoints on real ranks: a state of seven tensors (Shard(0) uneven [7, 5],
// Shard(1) bf16, Replicate int64, a [2] bias with empty shards, a 3-D float16, a 0-d
// int64, a bool mask) saved at 1..4 ranks loads bit for bit at 1..4 ranks under other
// placements, and from a 1-D mesh into a 2-D (Replicate, Shard) HSDP mesh and back; each
// rank file is a plain safetensors file holding exactly its chunks, a Replicate tensor is
// written once, `extra` round-trips; a flipped byte, a truncated or missing file, missing
// metadata, a chunk offset its file's DCP_SHARDING_INFO contradicts, a shape whose element
// count overflows, a missing tensor and a shape or dtype mismatch are typed errors naming the
// file and the tensor on every rank; a save replaces the previous checkpoint atomically,
// and a save interrupted (partial temp directory, or a rank killed by the kernel inside
// write()) leaves it loadable. async_save saves the state at the call while the tensors
// change, a second one waits for the first, a failed background write throws at wait() on
// every rank, and training collectives overlap its write.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "checkpoint/internal/crc32c.h"
#include "checkpoint/load.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/save.h"
#include "collectives/distributed_error.h"
#include "collectives/init.h"
#include "dtensor/chunking.h"
#include "dtensor/dtensor.h"
#include "kernels/fill.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

namespace fs = std::filesystem;
using checkpoint::State;
using Json = nlohmann::json;
using testing::MessageContains;
using testing::run_ranks;
using namespace std::chrono_literals;

// One tensor of the test state: placements it is saved with and loaded into (on a 1-D
// mesh; on a 2-D mesh under Replicate on mesh dim 0).
struct Case {
  std::string name;
  Shape shape;
  DType dtype;
  Placement save;
  Placement load;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {
      {"layers.0.w", {7, 5}, kFloat32, Shard(0), Shard(0)},   // uneven rows
      {"layers.0.v", {5, 7}, kBFloat16, Shard(1), Shard(0)},  // columns saved, rows loaded
      {"ids", {6, 3}, kInt64, Replicate(), Shard(0)},         // written once
      {"bias", {2}, kFloat32, Shard(0), Replicate()},         // empty shards at 3 and 4 ranks
      {"cube", {4, 6, 3}, kFloat16, Shard(1), Shard(2)},     {"step", {}, kInt64, Replicate(), Replicate()},  // 0-d
      {"mask", {5, 3}, kBool, Shard(0), Shard(1)},
  };
  return kCases;
}

const Case& case_named(const std::string& name) {
  for (const Case& c : cases()) {
    if (c.name == name) return c;
  }
  FAIL("no case " << name);
  throw;
}

// The full value of a case; `seed` tells two saves apart. int64 values beyond int32's range.
Tensor full_value(const Case& c, uint64_t seed) {
  const uint64_t s = seed * 1000 + static_cast<uint64_t>(&c - cases().data());
  if (c.dtype == kBool) return testing::random_tensor(c.shape, kBool, s, 0.0, 2.0);
  const double bound = is_floating(c.dtype) ? 1.0 : 1e12;
  return testing::random_tensor(c.shape, c.dtype, s, -bound, bound);
}

Json extra_for(uint64_t seed) {
  return {{"step", 1000 + seed}, {"rng_seed", 42}, {"data", {{"file", "tokens.bin"}, {"position", 123456789012}}}};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

Placements on(const DeviceMesh& mesh, const Placement& p) {
  if (mesh.ndim() == 1) return {p};
  return {Replicate(), p};
}

// Every rank's chunk of `full`, without communication.
DTensor sharded(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  DTensorSpec spec(mesh, placements, full.shape(), full.dtype());
  return DTensor(chunk_of(full, spec.local_chunk()).contiguous(), spec);
}

State saved_state(const DeviceMesh& mesh, uint64_t seed) {
  State s;
  for (const Case& c : cases()) s.tensors[c.name] = sharded(full_value(c, seed), mesh, on(mesh, c.save));
  s.extra = extra_for(seed);
  return s;
}

// Zero-filled targets under the load placements (placements_of gives them per case).
template <class F>
State load_targets(const DeviceMesh& mesh, F&& placements_of) {
  State s;
  for (const Case& c : cases()) {
    DTensorSpec spec(mesh, placements_of(c), c.shape, c.dtype);
    s.tensors[c.name] = DTensor(zeros(spec.local_shape(), c.dtype), spec);
  }
  return s;
}

State load_targets(const DeviceMesh& mesh) {
  return load_targets(mesh, [&](const Case& c) { return on(mesh, c.load); });
}

// Each rank's local equals its chunk of the saved full value, and (but for bool, which
// collectives do not move) full_tensor() equals it all.
void check_loaded(const State& s, uint64_t seed, const std::string& what) {
  for (const Case& c : cases()) {
    INFO(what << ", tensor " << c.name << ": " << s.tensors.at(c.name).to_string());
    const DTensor& t = s.tensors.at(c.name);
    const Tensor expected = full_value(c, seed);
    CHECK(same_bits(t.to_local(), chunk_of(expected, t.spec().local_chunk())));
    if (c.dtype != kBool) CHECK(same_bits(t.full_tensor(), expected));
  }
  CHECK(s.extra == extra_for(seed));
}

Json read_metadata(const fs::path& dir) {
  std::ifstream in(dir / ".metadata.json");
  REQUIRE(in.good());
  return Json::parse(in);
}

std::string rank_file(int rank) { return "__" + std::to_string(rank) + "_0.safetensors"; }

// The non-empty shards of a dim of `size` over `ranks`.
int64_t non_empty_shards(int64_t size, int64_t ranks) {
  int64_t n = 0;
  for (int64_t i = 0; i < ranks; ++i) n += chunk_range(size, ranks, i).length > 0 ? 1 : 0;
  return n;
}

// The files of a checkpoint saved at `world` ranks on a 1-D mesh, read with nn's own
// safetensors reader: each holds exactly the chunks the metadata gives it, at the offsets its
// DCP_SHARDING_INFO gives (what PyTorch's HuggingFaceStorageReader reads), and every element
// of every tensor is stored exactly once (Replicate tensors by rank 0 only).
void check_files(const fs::path& dir, int world, uint64_t seed) {
  const Json meta = read_metadata(dir);
  CHECK(meta["format"] == "dtr-checkpoint");
  CHECK(meta["version"] == 1);
  CHECK(meta["world_size"] == world);
  CHECK(meta["extra"] == extra_for(seed));
  int64_t stored = 0, expected = 0;
  for (int r = 0; r < world; ++r) {
    SafetensorsMetadata file_metadata;
    const TensorMap file = safetensors::load_file((dir / rank_file(r)).string(), &file_metadata);
    REQUIRE(file_metadata.contains("DCP_SHARDING_INFO"));
    const Json sharding = Json::parse(file_metadata.at("DCP_SHARDING_INFO"));
    CHECK(sharding.size() == file.size());
    for (const auto& [name, values] : file) {
      INFO("file " << rank_file(r) << ", tensor " << name);
      const Json* saved = nullptr;
      for (const Json& c : meta["tensors"][name]["chunks"]) {
        if (c["file"] == rank_file(r)) saved = &c;
      }
      REQUIRE(saved != nullptr);
      const LocalChunk chunk{(*saved)["offset"].get<Shape>(), (*saved)["shape"].get<Shape>()};
      CHECK(sharding.at(name).at("saved_offsets").get<Shape>() == chunk.offset);
      CHECK(same_bits(values, chunk_of(full_value(case_named(name), seed), chunk)));
      stored += static_cast<int64_t>(values.nbytes());
    }
  }
  for (const Case& c : cases()) {
    INFO("tensor " << c.name << " saved at " << world << " ranks");
    const Json& t = meta["tensors"][c.name];
    CHECK(t["dtype"] == std::string(dtype_name(c.dtype)));
    CHECK(t["shape"].get<Shape>() == c.shape);
    CHECK(t["placements"] == Json::array({c.save.str()}));
    CHECK(t["mesh"]["ranks"].size() == static_cast<size_t>(world));
    if (c.save.is_replicate()) {
      REQUIRE(t["chunks"].size() == 1);
      CHECK(t["chunks"][0]["file"] == rank_file(0));
    } else {
      CHECK(static_cast<int64_t>(t["chunks"].size()) == non_empty_shards(c.shape[c.save.shard_dim()], world));
    }
    expected += shape_numel(c.shape) * static_cast<int64_t>(itemsize(c.dtype));
  }
  CHECK(stored == expected);
}

// Siblings `<dir>.tmp-*` and `<dir>.old-*` (what an unfinished save leaves).
std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir.parent_path())) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(dir.filename().string() + ".")) out.push_back(name);
  }
  return out;
}

void save_at(int world, const fs::path& dir, uint64_t seed) {
  run_ranks(world, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    checkpoint::save(saved_state(mesh, seed), dir.string());
  });
}

TEST_CASE("CRC32C gives RFC 3720's values on both paths and extends over concatenation", "[checkpoint]") {
  using checkpoint::internal::crc32c;
  using checkpoint::internal::crc32c_extend;
  using checkpoint::internal::crc32c_extend_portable;
  const std::string digits = "123456789";
  CHECK(crc32c(digits.data(), digits.size()) == 0xE3069283u);
  CHECK(crc32c_extend_portable(0, digits.data(), digits.size()) == 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), ascending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<uint8_t>(i);
  CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c(ascending.data(), 32) == 0x46DD794Eu);
  std::vector<uint8_t> bytes(4097);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{4097}}) {
    INFO("split at " << split);
    const uint32_t whole = crc32c(bytes.data(), bytes.size());
    CHECK(crc32c_extend(crc32c(bytes.data(), split), bytes.data() + split, bytes.size() - split) == whole);
    CHECK(crc32c_extend_portable(crc32c_extend_portable(0, bytes.data(), split), bytes.data() + split,
                                 bytes.size() - split) == whole);
  }
}

TEST_CASE("a checkpoint saved at 1, 2, 3 or 4 ranks loads at 1, 2, 3 or 4 ranks, resharded", "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_matrix");
  auto dir = [&](int n) { return root / ("saved_at_" + std::to_string(n)); };
  for (int n = 1; n <= 4; ++n) {
    save_at(n, dir(n), n);
    check_files(dir(n), n, n);
  }
  for (int m = 1; m <= 4; ++m) {
    run_ranks(m, [&](int, int world) {
      const DeviceMesh mesh = init_device_mesh(kCPU, {world});
      for (int n = 1; n <= 4; ++n) {
        State s = load_targets(mesh);
        checkpoint::load(s, dir(n).string());
        check_loaded(s, n, fmt::format("saved at {} ranks, loaded at {}", n, world));
      }
    });
  }
}

TEST_CASE("a world of one process without a process group saves and loads", "[checkpoint]") {
  REQUIRE_FALSE(is_initialized());
  const fs::path dir = testing::make_temp_dir("checkpoint_single") / "ckpt";
  const DeviceMesh mesh = single_rank_mesh();
  checkpoint::save(saved_state(mesh, 7), dir.string());
  check_files(dir, 1, 7);
  State s = load_targets(mesh);
  s.tensors["layers.0.w"].requires_grad_(true);
  checkpoint::load(s, dir.string() + "/");  // a trailing separator names the same directory
  check_loaded(s, 7, "one process");
  CHECK(s.tensors["layers.0.w"].requires_grad());
  CHECK_FALSE(s.tensors["ids"].requires_grad());

  // A tensor with no elements has no chunks; a state of extra alone saves and loads.
  const fs::path other = dir.parent_path() / "empty_and_extra";
  State saved;
  saved.tensors["empty"] = sharded(zeros({0, 4}), mesh, {Shard(0)});
  saved.extra = {{"only", "extra"}};
  checkpoint::save(saved, other.string());
  CHECK(read_metadata(other)["tensors"]["empty"]["chunks"].empty());
  State loaded;
  loaded.tensors["empty"] = sharded(full({0, 4}, 1.0), mesh, {Replicate()});
  checkpoint::load(loaded, other.string());
  CHECK(loaded.tensors["empty"].shape() == Shape{0, 4});
  CHECK(loaded.extra == saved.extra);
  State extra_only;
  checkpoint::load(extra_only, other.string());
  CHECK(extra_only.extra == saved.extra);
}

TEST_CASE("1-D Shard checkpoints load into a 2-D (Replicate, Shard) HSDP mesh and back", "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_hsdp");
  const fs::path flat = root / "flat", hsdp = root / "hsdp";
  save_at(2, flat, 11);
  run_ranks(4, [&](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 2}, {"replicate", "shard"});
    State s = load_targets(mesh);  // (Replicate, load placement)
    checkpoint::load(s, flat.string());
    check_loaded(s, 11, "1-D at 2 ranks into (R, S) on 2x2");
    // Nested sharding of one dim over both mesh dims.
    State nested = load_targets(mesh, [](const Case& c) { return Placements{c.load, c.load}; });
    checkpoint::load(nested, flat.string());
    check_loaded(nested, 11, "1-D at 2 ranks into (S, S) on 2x2");
    // Saved from the 2-D mesh: only mesh row 0 (ranks 0 and 1) writes data.
    checkpoint::save(saved_state(mesh, 12), hsdp.string());
  });
  const Json meta = read_metadata(hsdp);
  for (const auto& [name, t] : meta["tensors"].items()) {
    INFO("tensor " << name);
    CHECK(t["placements"][0] == "R");
    for (const Json& c : t["chunks"]) CHECK((c["file"] == rank_file(0) || c["file"] == rank_file(1)));
  }
  CHECK(meta["tensors"]["ids"]["chunks"].size() == 1);
  CHECK(safetensors::load_file((hsdp / rank_file(2)).string()).empty());
  CHECK(safetensors::load_file((hsdp / rank_file(3)).string()).empty());
  run_ranks(3, [&](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {3});
    State s = load_targets(mesh);
    checkpoint::load(s, hsdp.string());
    check_loaded(s, 12, "(R, S) on 2x2 into 1-D at 3 ranks");
  });
}

TEST_CASE("StridedShard tensors save as one rectangle per rank and load into any placements", "[checkpoint][strided]") {
  const fs::path dir = testing::make_temp_dir("checkpoint_strided") / "ckpt";
  // Packed q, k, v rows (uneven over 3 ranks at load) and strided columns.
  const Tensor rows = testing::random_tensor({12, 5}, kFloat32, 1, -1.0, 1.0);
  const Tensor cols = testing::random_tensor({4, 9}, kFloat32, 2, -1.0, 1.0);
  auto placed = [](const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
    const DTensorSpec spec(mesh, placements, full.shape(), full.dtype());
    return DTensor(ranges_of(full, spec.local_ranges()).contiguous(), spec);
  };
  auto check = [](const State& s, const std::string& name, const Tensor& full) {
    const DTensor& t = s.tensors.at(name);
    INFO(name << ": " << t.spec().to_string());
    CHECK(same_bits(t.to_local(), ranges_of(full, t.spec().local_ranges()).contiguous()));
    CHECK(same_bits(t.full_tensor(), full));
  };
  run_ranks(2, [&](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2});
    State s;
    s.tensors["in_proj"] = placed(rows, mesh, {StridedShard(0, 3)});
    s.tensors["cols"] = placed(cols, mesh, {StridedShard(1, 3)});
    checkpoint::save(s, dir.string());
  });
  const Json meta = read_metadata(dir);
  CHECK(meta["tensors"]["in_proj"]["placements"] == Json::array({"SS(0,3)"}));
  CHECK(meta["tensors"]["in_proj"]["chunks"].size() == 2);  // saved as S(0): one rectangle per rank
  const std::vector<std::pair<Shape, Placements>> layouts = {
      {{3}, {StridedShard(0, 3)}}, {{3}, {Shard(0)}}, {{2, 2}, {StridedShard(0, 2), Shard(0)}}, {{1}, {Replicate()}}};
  for (const auto& [mesh_shape, placements] : layouts) {
    run_ranks(static_cast<int>(shape_numel(mesh_shape)), [&](int, int) {
      const DeviceMesh mesh = init_device_mesh(kCPU, mesh_shape);
      State s;
      s.tensors["in_proj"] = placed(zeros({12, 5}), mesh, placements);
      Placements col_placements = placements;
      for (Placement& p : col_placements) {
        if (p.splits_a_dim()) p = StridedShard(1, p.split_factor());
      }
      s.tensors["cols"] = placed(zeros({4, 9}), mesh, col_placements);
      checkpoint::load(s, dir.string());
      check(s, "in_proj", rows);
      check(s, "cols", cols);
    });
  }
}

TEST_CASE("save refuses Partial tensors, ranks that disagree and directories that are not checkpoints",
          "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_refusals");
  const fs::path not_checkpoint = root / "notes";
  fs::create_directories(not_checkpoint);
  std::ofstream(not_checkpoint / "important.txt") << "keep me";
  run_ranks(2, [&](int rank, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    const fs::path dir = root / "ckpt";
    {
      State s = saved_state(mesh, 1);
      s.tensors["grad"] = DTensor(zeros({3}), DTensorSpec(mesh, {Partial()}, {3}, kFloat32));
      CHECK_THROWS_MATCHES(
          checkpoint::save(s, dir.string()), ValueError,
          MessageContains("tensor 'grad'") && MessageContains("P(sum)") && MessageContains("reduce it first"));
    }
    {
      State s = saved_state(mesh, 1);
      if (rank == 1) s.extra["step"] = 5;
      CHECK_THROWS_MATCHES(checkpoint::save(s, dir.string()), ValueError,
                           MessageContains("extra differs between rank 0") && MessageContains("rank 1"));
    }
    {
      State s = saved_state(mesh, 1);
      if (rank == 1) s.tensors.erase("bias");
      CHECK_THROWS_MATCHES(checkpoint::save(s, dir.string()), ValueError,
                           MessageContains("tensor 'bias'") && MessageContains("every rank must save the same"));
    }
    CHECK_THROWS_MATCHES(checkpoint::save(saved_state(mesh, 1), not_checkpoint.string()), ValueError,
                         MessageContains("is not a dtr checkpoint") && MessageContains("refusing to replace it"));
  });
  CHECK_FALSE(fs::exists(root / "ckpt"));
  CHECK(leftovers(root / "ckpt").empty());
  std::ifstream kept(not_checkpoint / "important.txt");
  std::string text;
  std::getline(kept, text);
  CHECK(text == "keep me");
}

TEST_CASE("corrupt, truncated and missing files and missing metadata fail on every rank, naming file and tensor",
          "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_damage");
  const fs::path good = root / "good";
  save_at(2, good, 3);
  const Json meta = read_metadata(good);
  auto copy_of = [&](const std::string& name) {
    const fs::path dir = root / name;
    fs::copy(good, dir, fs::copy_options::recursive);
    return dir;
  };
  // One byte of rank 1's rows of layers.0.w flipped.
  const fs::path corrupt = copy_of("corrupt");
  int64_t flip_at = -1;
  for (const Json& c : meta["tensors"]["layers.0.w"]["chunks"]) {
    if (c["file"] == rank_file(1)) flip_at = c["byte_range"][0].get<int64_t>() + 13;
  }
  REQUIRE(flip_at > 0);
  {
    std::fstream f(corrupt / rank_file(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(flip_at);
    const char byte = static_cast<char>(f.get());
    f.seekp(flip_at);
    f.put(static_cast<char>(byte ^ 0x10));
  }
  // Rank 1's file loses its last 3 bytes (half its 6-byte chunk of the mask): its header no
  // longer matches its size, so the file is refused whichever tensor is read from it first.
  const fs::path truncated = copy_of("truncated");
  fs::resize_file(truncated / rank_file(1), fs::file_size(truncated / rank_file(1)) - 3);
  const fs::path missing_file = copy_of("missing_file");
  fs::remove(missing_file / rank_file(1));
  const fs::path no_metadata = copy_of("no_metadata");
  fs::remove(no_metadata / ".metadata.json");
  const fs::path bad_metadata = copy_of("bad_metadata");
  std::ofstream(bad_metadata / ".metadata.json", std::ios::trunc) << "{\"format\": ";

  run_ranks(2, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    const std::string file1 = rank_file(1);
    {
      State s = load_targets(mesh);
      const DTensor before = s.tensors["layers.0.w"];
      // Rank 1 reads the flipped rows itself; rank 0 learns of it.
      CHECK_THROWS_MATCHES(checkpoint::load(s, corrupt.string()), ValueError,
                           MessageContains("checksum mismatch") && MessageContains(file1) &&
                               MessageContains("tensor 'layers.0.w'") && MessageContains("corrupt"));
      CHECK(s.tensors["layers.0.w"].is_same(before));  // nothing loaded
      CHECK(s.extra.is_null());
    }
    {
      State s = load_targets(mesh);
      CHECK_THROWS_MATCHES(checkpoint::load(s, truncated.string()), ValueError,
                           MessageContains("truncated") && MessageContains(file1) &&
                               MessageContains("the data section has") && MessageContains("reading tensor '"));
    }
    {
      State s = load_targets(mesh);
      try {
        checkpoint::load(s, missing_file.string());
        FAIL("a missing file loaded");
      } catch (const OSError& e) {
        CHECK(e.error_number() == ENOENT);
        CHECK_THAT(e.what(), Catch::Contains(file1) && Catch::Contains("tensor 'bias'") &&
                                 Catch::Contains("No such file or directory"));
      }
    }
    {
      State s = load_targets(mesh);
      CHECK_THROWS_MATCHES(checkpoint::load(s, no_metadata.string()), ValueError,
                           MessageContains("has no .metadata.json") && MessageContains("incomplete checkpoint"));
      CHECK_THROWS_MATCHES(checkpoint::load(s, bad_metadata.string()), ValueError,
                           MessageContains("not valid checkpoint metadata"));
      CHECK_THROWS_AS(checkpoint::load(s, (root / "nowhere").string()), OSError);
    }
    State s = load_targets(mesh);
    checkpoint::load(s, good.string());
    check_loaded(s, 3, "the undamaged original");
  });
}

TEST_CASE(
    "load checks each chunk's offset against its file's DCP_SHARDING_INFO and names a file given as the "
    "directory",
    "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_offsets");
  const fs::path good = root / "good";
  save_at(2, good, 5);
  // cube's two [4, 3, 3] chunks (Shard(1) at 2 ranks) with their offsets swapped in the
  // metadata: every check of the metadata alone passes, and the values would load transposed.
  const fs::path swapped = root / "swapped";
  fs::copy(good, swapped, fs::copy_options::recursive);
  Json meta = read_metadata(good);
  Json& chunks = meta["tensors"]["cube"]["chunks"];
  REQUIRE(chunks.size() == 2);
  REQUIRE(chunks[0]["offset"] == Json::array({0, 0, 0}));
  std::swap(chunks[0]["offset"], chunks[1]["offset"]);
  std::ofstream(swapped / ".metadata.json", std::ios::trunc) << meta.dump();

  const DeviceMesh mesh = single_rank_mesh();
  State s = load_targets(mesh);
  CHECK_THROWS_MATCHES(checkpoint::load(s, swapped.string()), ValueError,
                       MessageContains(rank_file(0)) && MessageContains("tensor 'cube'") &&
                           MessageContains("the file's header (DCP_SHARDING_INFO) says offset [0, 0, 0] but the "
                                           "metadata says offset [0, 3, 0]"));
  CHECK(s.extra.is_null());  // nothing loaded

  // A file of the checkpoint, not its directory.
  for (const fs::path& file : {good / rank_file(0), good / ".metadata.json"}) {
    CHECK_THROWS_MATCHES(checkpoint::load(s, file.string()), ValueError,
                         MessageContains(fmt::format("'{}' is a file, not a checkpoint directory (the checkpoint "
                                                     "that holds it is '{}')",
                                                     file.string(), good.string())));
  }
  // Metadata that is not UTF-8: the parser's message echoes the byte, escaped.
  const fs::path not_utf8 = root / "not_utf8";
  fs::copy(good, not_utf8, fs::copy_options::recursive);
  std::ofstream(not_utf8 / ".metadata.json", std::ios::trunc) << "{\"format\": \"\xff\"}";
  try {
    checkpoint::load(s, not_utf8.string());
    FAIL("metadata that is not UTF-8 loaded");
  } catch (const ValueError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("not valid checkpoint metadata") && Catch::Contains("\\xff"));
    CHECK(std::all_of(what.begin(), what.end(), [](char c) { return c >= 0x20 && c < 0x7f; }));
  }
  // Files written before dtr recorded DCP_SHARDING_INFO (its key renamed, the header's
  // length kept) load: there is no offset to compare.
  const fs::path older = root / "older";
  fs::copy(good, older, fs::copy_options::recursive);
  for (const fs::directory_entry& e : fs::directory_iterator(older)) {
    if (e.path().extension() != ".safetensors") continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t at = bytes.find("DCP_SHARDING_INFO");
    REQUIRE(at != std::string::npos);
    bytes.replace(at, 17, "DCP_SHARDING_INFX");
    std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << bytes;
  }
  checkpoint::load(s, older.string());
  check_loaded(s, 5, "a checkpoint without DCP_SHARDING_INFO");
  checkpoint::load(s, good.string());
  check_loaded(s, 5, "the undamaged original");
}

TEST_CASE("metadata whose element or byte counts overflow int64 is refused, naming the tensor and shape",
          "[checkpoint]") {
  // One float32 tensor w of `shape` with one [256, 16] chunk (one checksum block).
  const auto metadata = [](const std::string& shape) {
    return Json::parse(R"({"format": "dtr-checkpoint", "version": 1, "world_size": 1, "checksum": "crc32c",
        "tensors": {"w": {"dtype": "float32", "shape": )" +
                       shape + R"(, "chunks": [{"offset": [0, 0], "shape": [256, 16], "file": "__0_0.safetensors",
        "byte_range": [64, 16448], "rows_per_block": 256, "crc32c": [0]}]}}})");
  };
  using checkpoint::internal::metadata_from_json;
  CHECK(metadata_from_json(metadata("[256, 16]"), "m").tensors.at("w").shape == Shape{256, 16});
  // (2^60 + 256) * 16 = 2^64 + 4096 wraps to the chunk's 4096 elements.
  CHECK_THROWS_MATCHES(metadata_from_json(metadata("[1152921504606847232, 16]"), "m"), ValueError,
                       MessageContains("tensor 'w': shape [1152921504606847232, 16] has too many elements"));
  // 2^62 * 2^62 wraps to 0.
  CHECK_THROWS_MATCHES(
      metadata_from_json(metadata("[4611686018427387904, 4611686018427387904]"), "m"), ValueError,
      MessageContains("tensor 'w': shape [4611686018427387904, 4611686018427387904] has too many elements"));
  // 2^62 float32 elements fit int64, their 2^64 bytes do not.
  CHECK_THROWS_MATCHES(metadata_from_json(metadata("[288230376151711744, 16]"), "m"), ValueError,
                       MessageContains("has too many elements: its size in bytes as float32 overflows int64"));
}

// A [24, 131072] bf16 tensor has 256 KiB rows: 4 rows per 1 MiB checksum block, 6 blocks.
TEST_CASE("ranks read and verify only the checksum blocks holding the rows they need", "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_blocks");
  const fs::path dir = root / "ckpt";
  const Shape shape{24, 131072};
  const Tensor full = testing::random_tensor(shape, kBFloat16, 5);
  {
    const DeviceMesh mesh = single_rank_mesh();  // one process, no group
    State s;
    s.tensors["embed"] = sharded(full, mesh, {Shard(0)});
    checkpoint::save(s, dir.string());
  }
  const Json chunk = read_metadata(dir)["tensors"]["embed"]["chunks"][0];
  CHECK(chunk["rows_per_block"] == 4);
  REQUIRE(chunk["crc32c"].size() == 6);
  auto check_box = [&](const State& s, const std::string& what) {
    const DTensor& t = s.tensors.at("embed");
    INFO(what << ": " << t.to_string());
    CHECK(same_bits(t.to_local(), chunk_of(full, t.spec().local_chunk())));
  };
  // Rows 8:16 start in block 2; on 2x2, rows 12:24 start inside block 3 and the columns split.
  run_ranks(3, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    State s;
    DTensorSpec spec(mesh, {Shard(0)}, shape, kBFloat16);
    s.tensors["embed"] = DTensor(zeros(spec.local_shape(), kBFloat16), spec);
    checkpoint::load(s, dir.string());
    check_box(s, "rows over 3 ranks");
  });
  run_ranks(4, [&](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 2});
    State s;
    DTensorSpec spec(mesh, {Shard(0), Shard(1)}, shape, kBFloat16);
    s.tensors["embed"] = DTensor(zeros(spec.local_shape(), kBFloat16), spec);
    checkpoint::load(s, dir.string());
    check_box(s, "(S(0), S(1)) on 2x2");
  });
  // A flipped byte in block 0 (rows 0:4) or block 5 (rows 20:24): only the rank whose rows
  // it holds (0 or 2) reads that block and finds it; the others learn of it from that rank.
  const int64_t row_bytes = shape[1] * 2;
  for (const auto& [row, owner, rows] : {std::tuple{1, 0, "0:4"}, std::tuple{21, 2, "20:24"}}) {
    const fs::path damaged = root / fmt::format("flipped_row_{}", row);
    fs::copy(dir, damaged, fs::copy_options::recursive);
    {
      std::fstream f(damaged / rank_file(0), std::ios::in | std::ios::out | std::ios::binary);
      const int64_t at = chunk["byte_range"][0].get<int64_t>() + row * row_bytes + 5;
      f.seekg(at);
      const char byte = static_cast<char>(f.get());
      f.seekp(at);
      f.put(static_cast<char>(byte ^ 0x01));
    }
    run_ranks(3, [&, owner = owner, rows = std::string(rows)](int rank, int n) {
      const DeviceMesh mesh = init_device_mesh(kCPU, {n});
      State s;
      DTensorSpec spec(mesh, {Shard(0)}, shape, kBFloat16);
      s.tensors["embed"] = DTensor(zeros(spec.local_shape(), kBFloat16), spec);
      try {
        checkpoint::load(s, damaged.string());
        FAIL("a corrupt block loaded");
      } catch (const ValueError& e) {
        CHECK_THAT(e.what(), Catch::Contains("checksum mismatch in rows " + rows + " ") &&
                                 Catch::Contains("tensor 'embed'") && Catch::Contains(rank_file(0)));
        if (rank == owner) {
          CHECK_THAT(e.what(), !Catch::Contains("failed:"));
        } else {
          CHECK_THAT(e.what(), Catch::Contains(fmt::format("rank {} failed:", owner)));
        }
      }
    });
  }
}

TEST_CASE("load names a tensor missing from the checkpoint and shape or dtype mismatches", "[checkpoint]") {
  const fs::path dir = testing::make_temp_dir("checkpoint_mismatch") / "ckpt";
  save_at(2, dir, 4);
  run_ranks(1, [&](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {1});
    {
      State s = load_targets(mesh);
      s.tensors["layers.9.w"] = sharded(zeros({2, 2}), mesh, {Shard(0)});
      CHECK_THROWS_MATCHES(
          checkpoint::load(s, dir.string()), ValueError,
          MessageContains("tensor 'layers.9.w' is not in the checkpoint") && MessageContains("it holds 7 tensors"));
    }
    {
      State s = load_targets(mesh);
      s.tensors["layers.0.w"] = sharded(zeros({7, 6}), mesh, {Shard(0)});
      CHECK_THROWS_MATCHES(checkpoint::load(s, dir.string()), ValueError,
                           MessageContains("tensor 'layers.0.w' is float32[7, 5] in the checkpoint but float32[7, 6]"));
    }
    {
      State s = load_targets(mesh);
      s.tensors["ids"] = sharded(zeros({6, 3}, kInt32), mesh, {Replicate()});
      CHECK_THROWS_MATCHES(checkpoint::load(s, dir.string()), ValueError,
                           MessageContains("tensor 'ids' is int64[6, 3] in the checkpoint but int32[6, 3]"));
    }
    {
      // Another model altogether: a count and the first problems, one readable line.
      State s;
      for (int i = 0; i < 40; ++i) {
        s.tensors[fmt::format("other.{}.w", i)] = sharded(zeros({2, 2}), mesh, {Shard(0)});
      }
      try {
        checkpoint::load(s, dir.string());
        FAIL("loading another model's tensors did not throw");
      } catch (const ValueError& e) {
        const std::string message = e.what();
        CHECK_THAT(message, Catch::Contains("40 problem(s): tensor 'other.0.w' is not in the checkpoint") &&
                                Catch::Contains("; and 35 more (it holds 7 tensors"));
        CHECK(message.size() < 800);
      }
    }
    // A subset of the checkpoint's tensors loads (the rest are not read).
    State s;
    DTensorSpec spec(mesh, {Shard(0)}, {7, 5}, kFloat32);
    s.tensors["layers.0.w"] = DTensor(zeros({7, 5}), spec);
    checkpoint::load(s, dir.string());
    CHECK(same_bits(s.tensors["layers.0.w"].to_local(), full_value(case_named("layers.0.w"), 4)));
  });
}

TEST_CASE("a save replaces the previous checkpoint; an interrupted one leaves it loadable", "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_commit");
  const fs::path dir = root / "ckpt";
  save_at(2, dir, 21);
  save_at(3, dir, 22);  // replaces it
  CHECK(leftovers(dir).empty());
  CHECK(read_metadata(dir)["world_size"] == 3);
  CHECK_FALSE(fs::exists(dir / rank_file(3)));

  // A save that died after writing part of its files: its temp directory has no metadata.
  const fs::path partial = root / "ckpt.tmp-12345-dead";
  fs::create_directories(partial);
  std::ofstream(partial / rank_file(0), std::ios::binary) << "{\"ids\": {\"dtype\"";
  run_ranks(2, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    State s = load_targets(mesh);
    checkpoint::load(s, dir.string());
    check_loaded(s, 22, "after an interrupted save");
    CHECK_THROWS_MATCHES(checkpoint::load(s, partial.string()), ValueError, MessageContains("incomplete checkpoint"));
  });

  // A rank killed while it writes its file: rank 1 may write files of 1 MiB only, so the
  // kernel kills it (SIGXFSZ) inside write() of its 4 MiB chunk. The other rank fails (its peer's
  // connection closes), nothing is committed, and rank 0 removes the temporary directory.
  testing::RanksOptions options;
  options.group_timeout = 20000ms;  // a fallback: the closed connection is seen at once
  options.deadline = std::chrono::seconds(60);
  options.may_die = {1};
  run_ranks(
      2,
      [&](int rank, int n) {
        const DeviceMesh mesh = init_device_mesh(kCPU, {n});
        State s;
        s.tensors["big"] = sharded(full({2048, 1024}, 1.5), mesh, {Shard(0)});
        s.extra = {{"step", 999}};
        if (rank == 1) {
          const rlimit no_core{0, 0}, one_mib{1 << 20, 1 << 20};
          REQUIRE(::setrlimit(RLIMIT_CORE, &no_core) == 0);
          REQUIRE(::setrlimit(RLIMIT_FSIZE, &one_mib) == 0);
        }
        CHECK_THROWS_AS(checkpoint::save(s, dir.string()), DistributedError);
        CHECK(rank == 0);  // rank 1 never gets here
      },
      options);
  CHECK(leftovers(dir).empty());
  CHECK(read_metadata(dir)["extra"] == extra_for(22));
  run_ranks(3, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    State s = load_targets(mesh);
    checkpoint::load(s, dir.string());
    check_loaded(s, 22, "after a rank died mid-save");
  });
  // The next save clears a leftover temp directory once a committed checkpoint is there.
  fs::create_directories(partial);
  save_at(1, dir, 23);
  CHECK(leftovers(dir).empty());
  CHECK(read_metadata(dir)["extra"] == extra_for(23));
}

// --- async_save ---

// Overwrites every rank's local of every tensor of `s` with the values of `seed`'s state
// (in place: the storage async_save was called with).
void overwrite_locals(State& s, uint64_t seed) {
  for (const Case& c : cases()) {
    Tensor local = s.tensors.at(c.name).to_local();
    local.copy_(chunk_of(full_value(c, seed), s.tensors.at(c.name).spec().local_chunk()));
  }
  s.extra = extra_for(seed);
}

TEST_CASE("async_save saves the state at the call even though the tensors change right after", "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_async");
  for (int world : {1, 2}) {
    const fs::path dir = root / fmt::format("ckpt{}", world);
    run_ranks(world, [&](int, int n) {
      const DeviceMesh mesh = init_device_mesh(kCPU, {n});
      State s = saved_state(mesh, 31);
      checkpoint::AsyncSave pending = checkpoint::async_save(s, dir.string());
      overwrite_locals(s, 32);  // training goes on
      pending.wait();
      CHECK(pending.done());
      pending.wait();  // done: returns without communicating
      State loaded = load_targets(mesh);
      checkpoint::load(loaded, dir.string());
      check_loaded(loaded, 31, "async_save, then the tensors changed");
    });
    check_files(dir, world, 31);
    CHECK(leftovers(dir).empty());
  }
}

TEST_CASE("a second async_save waits for the first, which is committed when it returns", "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_async_twice");
  const fs::path dir = root / "ckpt";
  run_ranks(2, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    State s = saved_state(mesh, 41);
    checkpoint::AsyncSave first = checkpoint::async_save(s, dir.string());
    overwrite_locals(s, 42);
    checkpoint::AsyncSave second = checkpoint::async_save(s, dir.string());
    CHECK(first.done());
    first.wait();
    State loaded = load_targets(mesh);
    checkpoint::load(loaded, dir.string());  // the first, committed; the second is still pending
    check_loaded(loaded, 41, "after the second async_save returned");
    overwrite_locals(s, 43);
    second.wait();
    checkpoint::load(loaded, dir.string());
    check_loaded(loaded, 42, "after the second async_save's wait()");
  });
  CHECK(leftovers(dir).empty());
}

TEST_CASE("a failed background write throws at wait() (or the next async_save) on every rank", "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_async_fail");
  const fs::path dir = root / "ckpt";
  save_at(2, dir, 51);
  run_ranks(2, [&](int rank, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    State s;
    s.tensors["big"] = sharded(full({2048, 1024}, 1.5), mesh, {Shard(0)});  // 4 MiB per rank
    rlimit limit{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &limit) == 0);
    const rlim_t unlimited = limit.rlim_cur;
    auto limit_files = [&](rlim_t bytes) {
      if (rank != 1) return;
      limit.rlim_cur = bytes;
      REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
    };
    // Rank 1 may write files of 1 MiB only; with SIGXFSZ ignored, write() fails with EFBIG.
    REQUIRE(std::signal(SIGXFSZ, SIG_IGN) != SIG_ERR);
    limit_files(1 << 20);
    checkpoint::AsyncSave pending = checkpoint::async_save(s, dir.string());
    if (rank == 0) {
      CHECK_THROWS_MATCHES(pending.wait(), OSError, MessageContains("rank 1 failed"));
    } else {
      CHECK_THROWS_AS(pending.wait(), OSError);
    }
    CHECK(pending.done());
    CHECK_THROWS_AS(pending.wait(), OSError);  // the same error again, without communicating

    // Not waited for: the next async_save throws its error and starts nothing.
    checkpoint::AsyncSave unwaited = checkpoint::async_save(s, dir.string());
    CHECK_THROWS_AS(checkpoint::async_save(s, dir.string()), OSError);
    CHECK_THROWS_AS(unwaited.wait(), OSError);

    limit_files(unlimited);
    State previous = load_targets(mesh);
    checkpoint::load(previous, dir.string());
    check_loaded(previous, 51, "after failed async saves");
    checkpoint::async_save(s, dir.string()).wait();
  });
  CHECK(leftovers(dir).empty());
  CHECK(read_metadata(dir)["tensors"].contains("big"));
}

TEST_CASE("training collectives overlap an async_save's background write on 2 ranks", "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_async_train");
  const fs::path dir = root / "ckpt";
  run_ranks(2, [&](int, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    State s;
    for (int i = 0; i < 4; ++i) {
      s.tensors[fmt::format("w{}", i)] = sharded(full({1024, 1024}, i + 0.5), mesh, {Shard(0)});  // 4 MiB each
    }
    s.extra = {{"step", 7}};
    const Tensor x_full = testing::random_tensor({64, 256}, kFloat32, 5);
    DTensor x = sharded(x_full, mesh, {Shard(0)});
    checkpoint::AsyncSave pending = checkpoint::async_save(s, dir.string());
    for (int step = 0; step < 50; ++step) {
      CHECK(same_bits(x.redistribute({Replicate()}).to_local(), x_full));  // an all-gather per step
      for (auto& [name, t] : s.tensors) {
        Tensor local = t.to_local();
        local.copy_(full(local.shape(), -1.0));
      }
    }
    pending.wait();
    State loaded;
    for (int i = 0; i < 4; ++i) {
      loaded.tensors[fmt::format("w{}", i)] = sharded(zeros({1024, 1024}), mesh, {Shard(0)});
    }
    checkpoint::load(loaded, dir.string());
    for (int i = 0; i < 4; ++i) {
      const DTensor& t = loaded.tensors.at(fmt::format("w{}", i));
      CHECK(same_bits(t.to_local(), full(t.to_local().shape(), i + 0.5)));
    }
    CHECK(loaded.extra == Json{{"step", 7}});
  });
}

TEST_CASE("save, async_save and load report non-decreasing progress ending at this rank's bytes on 2 ranks",
          "[checkpoint]") {
  const fs::path root = testing::make_temp_dir("checkpoint_progress");
  run_ranks(2, [&](int rank, int n) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {n});
    State s;
    s.tensors["w"] = sharded(full({8, 4}, 1.5), mesh, {Shard(0)});               // 4 x 4 float32 a rank: 64 bytes
    s.tensors["r"] = sharded(full({3}, 2.5).to(kFloat64), mesh, {Replicate()});  // 24 bytes, written by rank 0
    // Bytes of the chunks this rank writes, and of the chunks it loads (every chunk of both).
    const int64_t written = rank == 0 ? 64 + 24 : 64, read = 64 + 24;
    auto check_calls = [](const std::vector<checkpoint::Progress>& calls, int64_t total) {
      REQUIRE(!calls.empty());
      for (size_t i = 0; i < calls.size(); ++i) {
        CHECK(calls[i].total_bytes == total);
        CHECK(calls[i].done_bytes <= total);
        if (i > 0) CHECK(calls[i].done_bytes >= calls[i - 1].done_bytes);
      }
      CHECK(calls.back().done_bytes == total);
    };
    std::vector<checkpoint::Progress> calls;
    checkpoint::save(s, (root / "sync").string(), [&](const checkpoint::Progress& p) { calls.push_back(p); });
    check_calls(calls, written);

    // The writer thread appends; wait() joins it before the vector is read here.
    std::vector<checkpoint::Progress> async_calls;
    std::thread::id caller = std::this_thread::get_id(), called;
    checkpoint::AsyncSave pending =
        checkpoint::async_save(s, (root / "async").string(), [&](const checkpoint::Progress& p) {
          async_calls.push_back(p);
          called = std::this_thread::get_id();
        });
    pending.wait();
    check_calls(async_calls, written);
    CHECK(called != caller);  // the background writer's thread

    for (const char* dir : {"sync", "async"}) {
      State loaded;
      loaded.tensors["w"] = sharded(zeros({8, 4}), mesh, {Shard(0)});
      loaded.tensors["r"] = sharded(zeros({3}).to(kFloat64), mesh, {Replicate()});
      calls.clear();
      checkpoint::load(loaded, (root / dir).string(), [&](const checkpoint::Progress& p) { calls.push_back(p); });
      check_calls(calls, read);
      CHECK(same_bits(loaded.tensors.at("w").to_local(), full({4, 4}, 1.5)));
    }
  });
}

}  // namespace
}  // namespace dtr
