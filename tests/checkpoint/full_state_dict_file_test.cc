// Full state dicts as files on real ranks: save_full_state_dict of a fully_shard-ed small
// Transformer on 1, 2 and 3 ranks (uneven shards) loads with load_full_state_dict_file into a
// fresh sharded model on every other world size (also with Shard(1) matrices, which read one
// run per row) bit for bit, and with safetensors::load_file (the independent reader) under PyTorch's
// names; a non-zero rank's allocator peak stays within two full tensors of the largest entry
// while saving and below its shard plus one tensor while loading. Hugging Face's layout
// round-trips with several files and a correct index. Files PyTorch wrote
// (tests/checkpoint/testdata/make_checkpoint_testdata.py: safetensors.torch.save_file and DCP's
// HuggingFaceStorageWriter) load with PyTorch's closed-form values; with
// DTR_CHECKPOINT_INTEROP_DIR set, dtr's files (a full state dict, Hugging Face's layout and a
// checkpoint::save directory written by 3 ranks) are left there for that script's --verify.
// Truncated files, missing tensors, wrong shapes and dtypes are typed errors naming them; a
// failure on any rank (rank 0's write, another rank's read) is thrown on every rank with its
// type, and a failed load changes no rank's module.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <type_traits>

#include "checkpoint/full_state_dict.h"
#include "checkpoint/full_state_dict_file.h"
#include "checkpoint/load.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/save.h"
#include "collectives/init.h"
#include "core/allocator.h"
#include "core/error.h"
#include "kernels/fill.h"
#include "nn/fully_shard.h"
#include "nn/init.h"
#include "nn/transformer.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using checkpoint::full_state_dict;
using checkpoint::load_full_state_dict_file;
using checkpoint::load_hf_checkpoint;
using checkpoint::save_full_state_dict;
using checkpoint::save_hf_checkpoint;
using safetensors::load_file;
using safetensors::save_file;

namespace fs = std::filesystem;
using testing::MessageContains;

constexpr int64_t kVocab = 32, kSeq = 8;

enum class Matrices : uint8_t { kShard0, kShard1 };

// The small causal model, initialised from `seed`; sharded over `world` ranks (blocks, then
// the root) unless world is 0.
std::unique_ptr<Transformer> make_model(uint64_t seed, int world, Matrices matrices = Matrices::kShard0) {
  manual_seed(seed);
  auto model = std::make_unique<Transformer>(testing::small_causal_lm(kVocab, kSeq));
  if (world == 0) return model;
  const DeviceMesh mesh = init_device_mesh(kCPU, {world}, {"dp"});
  FullyShardOptions options;
  if (matrices == Matrices::kShard1) {
    options.shard_placement_fn = [](const std::string&, const DTensor& p) -> std::optional<Placement> {
      return p.dim() == 2 ? std::optional(Shard(1)) : std::nullopt;
    };
  }
  for (auto& [name, m] : model->named_modules()) {
    if (m->type_name() == "TransformerBlock") fully_shard(*m, mesh, options);
  }
  fully_shard(*model, mesh, options);
  return model;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.to(kCPU).contiguous(), y = b.to(kCPU).contiguous();
  return std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

// Every entry of `actual` equals `expected`'s bit for bit, with the same names.
void check_same(const TensorMap& actual, const TensorMap& expected, const std::string& what) {
  INFO(what);
  REQUIRE(actual.size() == expected.size());
  for (const auto& [name, t] : expected) {
    INFO(name);
    REQUIRE(actual.contains(name));
    CHECK(same_bytes(actual.at(name), t));
  }
}

int64_t model_bytes(const TensorMap& tensors, int64_t* largest) {
  int64_t total = 0;
  *largest = 0;
  for (const auto& [name, t] : tensors) {
    total += static_cast<int64_t>(t.nbytes());
    *largest = std::max(*largest, static_cast<int64_t>(t.nbytes()));
  }
  return total;
}

std::string file_for(const fs::path& dir, int world) { return (dir / fmt::format("w{}.safetensors", world)).string(); }

TEST_CASE("save_full_state_dict on 1, 2 and 3 ranks loads on every world size, bit for bit",
          "[nn][full_state_dict_file]") {
  const fs::path dir = testing::make_temp_dir("full_state_dict");
  for (int world : {1, 2, 3}) {
    testing::run_ranks(world, [&](int rank, int world) {
      INFO("saved on " << world << " ranks, rank " << rank);
      const std::unique_ptr<Transformer> model = make_model(42, world);
      reset_peak_memory_stats(kCPU);
      const int64_t before = memory_stats(kCPU).bytes_in_use;
      save_full_state_dict(*model, file_for(dir, world));
      const int64_t extra = memory_stats(kCPU).peak_bytes - before;
      const TensorMap expected = full_state_dict(*make_model(42, 0));
      int64_t largest = 0;
      const int64_t total = model_bytes(expected, &largest);
      INFO("peak extra " << extra << " bytes; largest entry " << largest << ", model " << total);
      if (rank != 0) CHECK(extra <= 2 * largest + 4096);  // a gather's buffer and its result
      // PyTorch's names and the values, through the independent reader.
      check_same(load_file(file_for(dir, world)), expected, "safetensors::load_file of the saved file");
      CHECK_FALSE(fs::exists(file_for(dir, world) + ".tmp"));
    });
  }
  for (int world : {1, 2, 3}) {
    testing::run_ranks(world, [&](int rank, int world) {
      const TensorMap expected = full_state_dict(*make_model(42, 0));
      int64_t largest = 0;
      const int64_t total = model_bytes(expected, &largest);
      for (Matrices matrices : {Matrices::kShard0, Matrices::kShard1}) {
        for (int saved : {1, 2, 3}) {
          INFO("saved on " << saved << " ranks, loaded on " << world << ", rank " << rank << ", Shard("
                           << (matrices == Matrices::kShard1 ? 1 : 0) << ") matrices");
          const std::unique_ptr<Transformer> model = make_model(7, world, matrices);  // other values
          reset_peak_memory_stats(kCPU);
          const int64_t before = memory_stats(kCPU).bytes_in_use;
          const LoadResult result = load_full_state_dict_file(*model, file_for(dir, saved));
          const int64_t extra = memory_stats(kCPU).peak_bytes - before;
          CHECK(result.missing_keys.empty());
          CHECK(result.unexpected_keys.empty());
          INFO("peak extra " << extra << " bytes; model " << total);
          if (rank != 0 && world > 1) CHECK(extra < total / world + largest + 4096);
          check_same(full_state_dict(*model), expected, "loaded model");
        }
      }
    });
  }
}

TEST_CASE("Hugging Face's sharded layout round-trips with several files and a correct index",
          "[nn][full_state_dict_file]") {
  const fs::path dir = testing::make_temp_dir("hf") / "checkpoint";  // save creates it
  constexpr int64_t kMaxShardBytes = 8192;
  testing::run_ranks(2, [&](int, int world) {
    const std::unique_ptr<Transformer> model = make_model(42, world);
    save_hf_checkpoint(*model, dir.string(), kMaxShardBytes);
  });
  const TensorMap expected = [] {
    const std::unique_ptr<Transformer> model = make_model(42, 0);
    return full_state_dict(*model);
  }();
  std::ifstream in(dir / "model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  int64_t largest = 0;
  CHECK(index["metadata"]["total_size"] == model_bytes(expected, &largest));
  std::map<std::string, std::vector<std::string>> names_by_file;
  for (const auto& [name, file] : index["weight_map"].items()) names_by_file[file.get<std::string>()].push_back(name);
  REQUIRE(names_by_file.size() >= 3);
  const int n = static_cast<int>(names_by_file.size());
  TensorMap all;
  int k = 1;
  for (const auto& [file, names] : names_by_file) {
    INFO(file);
    CHECK(file == fmt::format("model-{:05d}-of-{:05d}.safetensors", k++, n));
    const TensorMap tensors = load_file((dir / file).string());
    CHECK(tensors.size() == names.size());
    int64_t bytes = 0;
    for (const auto& [name, t] : tensors) bytes += static_cast<int64_t>(t.nbytes());
    CHECK((bytes <= kMaxShardBytes || tensors.size() == 1));
    for (const std::string& name : names) CHECK(tensors.contains(name));
    all.insert(tensors.begin(), tensors.end());
  }
  check_same(all, expected, "the files the index names, read with safetensors::load_file");
  for (int world : {1, 3}) {
    testing::run_ranks(world, [&](int, int world) {
      INFO("loaded on " << world << " ranks");
      const std::unique_ptr<Transformer> model = make_model(7, world);
      load_hf_checkpoint(*model, dir.string());
      check_same(full_state_dict(*model), expected, "loaded model");
    });
  }
}

// The model tests/checkpoint/testdata/make_checkpoint_testdata.py writes.
TransformerConfig interop_config() {
  return {.vocab_size = 8, .dim = 8, .n_layers = 1, .n_heads = 2, .causal = true, .max_seq_len = 4, .final_norm = true};
}

// PyTorch's closed form: the j-th entry, flattened, holds j + i / 1024 at element i.
void check_closed_form(const TensorMap& state) {
  std::set<int64_t> firsts;
  for (const auto& [name, t] : state) {
    INFO(name);
    const std::vector<double> v = testing::to_f64(t);
    REQUIRE(!v.empty());
    const double j = v[0];
    CHECK(j == std::floor(j));
    firsts.insert(static_cast<int64_t>(j));
    bool exact = true;
    for (size_t i = 0; i < v.size(); ++i) exact = exact && v[i] == j + static_cast<double>(i) / 1024;
    CHECK(exact);
  }
  CHECK(firsts.size() == state.size());
}

TEST_CASE("files PyTorch wrote load with PyTorch's values; dtr's are left for the script to check",
          "[nn][full_state_dict_file]") {
  const std::string torch_file = "tests/checkpoint/testdata/hf/torch_model.safetensors";
  const std::string dcp_dir = "tests/checkpoint/testdata/hf/dcp_hf";
  const TensorMap reference = load_file(torch_file);
  check_closed_form(reference);
  const char* keep = std::getenv("DTR_CHECKPOINT_INTEROP_DIR");
  testing::run_ranks(3, [&](int, int world) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {world}, {"dp"});
    for (const bool hf : {false, true}) {
      INFO((hf ? "HuggingFaceStorageWriter's layout" : "safetensors.torch.save_file's file"));
      manual_seed(3);
      Transformer model(interop_config());
      fully_shard(model, mesh);
      const LoadResult result = hf ? load_hf_checkpoint(model, dcp_dir) : load_full_state_dict_file(model, torch_file);
      CHECK(result.missing_keys.empty());
      CHECK(result.unexpected_keys.empty());
      const TensorMap loaded = full_state_dict(model);
      check_same(loaded, reference, "loaded model");
      if (keep != nullptr && !hf) {
        save_full_state_dict(model, (fs::path(keep) / "model.safetensors").string());
        save_hf_checkpoint(model, (fs::path(keep) / "hf").string(), 2048);
        // A distributed checkpoint written by the 3 ranks, each its shards, which PyTorch's
        // HuggingFaceStorageReader reads through each rank file's DCP_SHARDING_INFO.
        checkpoint::State sharded;
        for (const auto& [name, value] : model.state_dict()) sharded.tensors.emplace(name, value);
        checkpoint::save(sharded, (fs::path(keep) / "sharded").string());
      }
    }
  });
}

TEST_CASE("a tied weight loads from either of its names, or both when they are equal", "[nn][full_state_dict_file]") {
  // PyTorch's safetensors.torch.save_model and Hugging Face's save_pretrained keep one name
  // of a tied tensor (here output.weight is embed.weight).
  const fs::path dir = testing::make_temp_dir("tied");
  const TensorMap reference = full_state_dict(*make_model(7, 0));
  REQUIRE(reference.contains("output.weight"));
  REQUIRE(reference.contains("embed.weight"));
  for (const std::string& dropped : {"output.weight", "embed.weight"}) {
    TensorMap one_name = reference;
    one_name.erase(dropped);
    const std::string file = (dir / ("without_" + dropped + ".safetensors")).string();
    save_file(one_name, file);
    testing::run_ranks(2, [&](int, int world) {
      const std::unique_ptr<Transformer> model = make_model(8, world);
      const LoadResult result = load_full_state_dict_file(*model, file);
      CHECK(result.missing_keys.empty());
      check_same(full_state_dict(*model), reference, "loaded without " + dropped);
    });
  }
  TensorMap differ = reference;
  differ["output.weight"] = full(reference.at("output.weight").shape(), 0.5);
  const std::string differ_file = (dir / "differ.safetensors").string();
  save_file(differ, differ_file);
  const std::unique_ptr<Transformer> model = make_model(8, 0);
  CHECK_THROWS_MATCHES(load_full_state_dict_file(*model, differ_file), ValueError,
                       MessageContains("'embed.weight' and 'output.weight', which the module ties"));
  const std::string both = (dir / "both.safetensors").string();
  save_file(reference, both);
  load_full_state_dict_file(*model, both);
  check_same(full_state_dict(*model), reference, "loaded with both names");
}

TEST_CASE("truncated files, missing tensors, wrong shapes and dtypes are typed errors naming them",
          "[nn][full_state_dict_file]") {
  const fs::path dir = testing::make_temp_dir("errors");
  const std::unique_ptr<Transformer> model = make_model(42, 0);
  const std::string good = (dir / "good.safetensors").string();
  save_full_state_dict(*model, good);
  TensorMap state = load_file(good);

  const std::string truncated = (dir / "truncated.safetensors").string();
  fs::copy_file(good, truncated);
  fs::resize_file(truncated, fs::file_size(truncated) - 10);
  CHECK_THROWS_MATCHES(load_full_state_dict_file(*model, truncated), ValueError, MessageContains(truncated));

  TensorMap missing = state;
  missing.erase("layers.1.ffn.2.bias");
  missing.emplace("extra.weight", Tensor::empty({2}, kFloat32));
  const std::string missing_file = (dir / "missing.safetensors").string();
  save_file(missing, missing_file);
  CHECK_THROWS_MATCHES(
      load_full_state_dict_file(*model, missing_file), ValueError,
      MessageContains(missing_file) && MessageContains("layers.1.ffn.2.bias") && MessageContains("extra.weight"));
  const LoadResult partial = load_full_state_dict_file(*model, missing_file, Strict::kNo);
  CHECK(partial.missing_keys == std::vector<std::string>{"layers.1.ffn.2.bias"});
  CHECK(partial.unexpected_keys == std::vector<std::string>{"extra.weight"});

  TensorMap reshaped = state;
  reshaped["norm.bias"] = Tensor::empty({3}, kFloat32);
  const std::string reshaped_file = (dir / "reshaped.safetensors").string();
  save_file(reshaped, reshaped_file);
  CHECK_THROWS_MATCHES(load_full_state_dict_file(*model, reshaped_file), ValueError,
                       MessageContains(reshaped_file) && MessageContains("norm.bias") && MessageContains("[3]"));

  TensorMap retyped = state;
  retyped["norm.bias"] = state["norm.bias"].to(kFloat64);
  const std::string retyped_file = (dir / "retyped.safetensors").string();
  save_file(retyped, retyped_file);
  CHECK_THROWS_MATCHES(load_full_state_dict_file(*model, retyped_file), TypeError,
                       MessageContains(retyped_file) && MessageContains("norm.bias") && MessageContains("float64"));

  CHECK_THROWS_AS(load_full_state_dict_file(*model, (dir / "absent.safetensors").string()), OSError);
  CHECK_THROWS_AS(load_hf_checkpoint(*model, (dir / "absent").string()), OSError);
  CHECK_THROWS_AS(save_hf_checkpoint(*model, (dir / "hf").string(), 0), ValueError);

  // An index naming a tensor its file does not hold.
  const fs::path hf = dir / "hf";
  save_hf_checkpoint(*model, hf.string(), 1 << 20);
  nlohmann::json index = nlohmann::json::parse(std::ifstream(hf / "model.safetensors.index.json"));
  index["weight_map"]["ghost.weight"] = "model-00001-of-00001.safetensors";
  std::ofstream(hf / "model.safetensors.index.json") << index.dump();
  CHECK_THROWS_MATCHES(load_hf_checkpoint(*model, hf.string(), Strict::kNo), ValueError,
                       MessageContains("ghost.weight") && MessageContains("model-00001-of-00001.safetensors"));

  // A save over that checkpoint that stops midway (its shard cannot be renamed into place: a
  // non-empty directory stands there) leaves no index, so loading fails instead of reading
  // an old index over a mix of files.
  fs::remove(hf / "model-00001-of-00001.safetensors");
  fs::create_directories(hf / "model-00001-of-00001.safetensors" / "blocker");
  CHECK_THROWS_AS(save_hf_checkpoint(*model, hf.string(), 1 << 20), OSError);
  CHECK_FALSE(fs::exists(hf / "model.safetensors.index.json"));
  CHECK_THROWS(load_hf_checkpoint(*model, hf.string()));

  // Nothing changed by the failed loads: the model still holds the good file's values.
  check_same(full_state_dict(*model), state, "after the failed loads");
}

TEST_CASE("when rank 0 cannot write, every rank throws its error type instead of hanging",
          "[nn][full_state_dict_file]") {
  const fs::path dir = testing::make_temp_dir("unwritable");
  testing::run_ranks(2, [&](int rank, int world) {
    const std::unique_ptr<Transformer> model = make_model(42, world);
    const std::string path = (dir / "no_such_dir" / "model.safetensors").string();
    try {
      save_full_state_dict(*model, path);
      FAIL("the save into a missing directory succeeded");
    } catch (const OSError& e) {  // rank 0's own error; the other rank's names rank 0, with its errno
      CHECK(e.error_number() == ENOENT);
      CHECK_THAT(e.what(), Catch::Contains(path));
      if (rank == 0) {
        CHECK_THAT(e.what(), !Catch::Contains("failed:"));
      } else {
        CHECK_THAT(e.what(), Catch::Contains(fmt::format("save_full_state_dict '{}': rank 0 failed: ", path)));
      }
    }
    // Rank 0, which failed, left nothing in the directory (checked before the next save writes there).
    if (rank == 0) CHECK(fs::is_empty(dir));
    // The group is still usable: the next save succeeds on every rank.
    save_full_state_dict(*model, (dir / "model.safetensors").string());
  });
  CHECK(load_file((dir / "model.safetensors").string()).size() == full_state_dict(*make_model(42, 0)).size());
}

// Every rank loads its own `file` into `model`, a bad one on some ranks: every rank throws E,
// a rank whose file is bad its own error, the others one naming the lowest failed rank and
// quoting its message (which names `bad_file`); and no rank's module changes.
template <class E>
void check_every_rank_throws(Module& model, const std::string& file, const std::string& good, int lowest_failed,
                             const std::string& bad_file) {
  INFO("loading " << file);
  const TensorMap before = full_state_dict(model);
  try {
    load_full_state_dict_file(model, file);
    FAIL("the load succeeded");
  } catch (const E& e) {
    CHECK_THAT(e.what(), Catch::Contains(bad_file));
    if (file == good) {
      CHECK_THAT(e.what(),
                 Catch::Contains(fmt::format("load_full_state_dict_file '{}': rank {} failed: ", good, lowest_failed)));
    } else {
      CHECK_THAT(e.what(), !Catch::Contains("failed:"));
    }
    if constexpr (std::is_same_v<E, OSError>) CHECK(e.error_number() == ENOENT);
  }
  // A rank that read its chunks did not apply them.
  check_same(full_state_dict(model), before, "after the failed load");
}

TEST_CASE("when a non-zero rank cannot read its chunks, every rank throws its error type and no module changes",
          "[nn][full_state_dict_file]") {
  const fs::path dir = testing::make_temp_dir("rank_fails_to_load");
  const std::string good = (dir / "good.safetensors").string();
  save_full_state_dict(*make_model(42, 0), good);
  TensorMap reshaped = load_file(good), retyped = reshaped;
  reshaped["norm.bias"] = Tensor::empty({3}, kFloat32);
  retyped["norm.bias"] = retyped["norm.bias"].to(kFloat64);
  const std::string reshaped_file = (dir / "reshaped.safetensors").string();
  const std::string retyped_file = (dir / "retyped.safetensors").string();
  const std::string absent = (dir / "absent.safetensors").string();
  save_file(reshaped, reshaped_file);
  save_file(retyped, retyped_file);
  testing::run_ranks(3, [&](int rank, int world) {
    const std::unique_ptr<Transformer> model = make_model(7, world);  // values other than the file's
    // Rank 2 alone cannot open its file: an OSError on every rank, with its errno.
    check_every_rank_throws<OSError>(*model, rank == 2 ? absent : good, good, 2, absent);
    // Rank 1 finds a shape that differs (ValueError), rank 2 a dtype (TypeError): each throws
    // its own, and rank 0 that of rank 1, the lowest.
    if (rank == 2) {
      check_every_rank_throws<TypeError>(*model, retyped_file, good, 1, retyped_file);
    } else {
      check_every_rank_throws<ValueError>(*model, rank == 1 ? reshaped_file : good, good, 1, reshaped_file);
    }
    // load_hf_checkpoint follows the same protocol (here through a directory's lone model.safetensors).
    const fs::path lone = dir / "lone";
    if (rank == 0) {
      fs::create_directories(lone);
      fs::copy_file(good, lone / "model.safetensors");
    }
    load_full_state_dict_file(*model, good);  // collective: the barrier after which `lone` is there
    try {
      load_hf_checkpoint(*model, rank == 1 ? (dir / "no_such_dir").string() : lone.string());
      FAIL("load_hf_checkpoint succeeded");
    } catch (const OSError& e) {
      CHECK(e.error_number() == ENOENT);
      CHECK_THAT(e.what(), Catch::Contains("no_such_dir") && Catch::Contains("holds neither"));
      CHECK(Catch::Contains("rank 1 failed: ").match(e.what()) == (rank != 1));
    }
    // The group is still usable: every rank loads the good file.
    load_full_state_dict_file(*model, good);
    check_same(full_state_dict(*model), load_file(good), "loaded after the failures");
  });
}

}  // namespace
}  // namespace dtr::nn
