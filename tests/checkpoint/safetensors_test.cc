// .safetensors files: bitwise round trips of every dtype, the layout on disk, saves that
// fail without damaging the old file, every kind of malformed file refused with a typed
// error naming the file and the tensor, a file written by PyTorch, and the fuzz corpus.
#include "checkpoint/safetensors.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "core/error.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using safetensors::load_file;
using safetensors::save_file;

namespace fs = std::filesystem;
using testing::MessageContains;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// Same dtype, shape and bytes.
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

// A tensor of `dtype` holding random bytes that are valid values of it.
Tensor random_tensor(Shape shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dtype, kCPU);
  std::mt19937_64 gen(seed);
  auto* bytes = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(dtype == kBool ? gen() % 2 : gen());
  return t;
}

TEST_CASE("save_file then load_file is bitwise for every dtype, with metadata", "[safetensors]") {
  const fs::path dir = testing::make_temp_dir("safetensors_test");
  TensorMap tensors;
  uint64_t seed = 1;
  for (DType d : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kBool}) {
    tensors.emplace(fmt::format("layers.{}.weight", dtype_name(d)), random_tensor({3, 5}, d, seed++));
  }
  tensors.emplace("scalar", random_tensor({}, kFloat32, seed++));
  tensors.emplace("empty", random_tensor({0, 4}, kInt64, seed++));
  tensors.emplace("view", random_tensor({4, 6}, kFloat64, seed++).narrow(1, 1, 3));  // not contiguous
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"step", "12"}};
  const fs::path path = dir / "model.safetensors";
  save_file(tensors, path, metadata);
  SafetensorsMetadata read_metadata;
  const TensorMap loaded = load_file(path, &read_metadata);
  CHECK(read_metadata == metadata);
  REQUIRE(loaded.size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    REQUIRE(loaded.count(name) == 1);
    CHECK(same_bits(loaded.at(name), t));
  }
  // Saving what was loaded gives the same file, byte for byte.
  save_file(loaded, dir / "again.safetensors", metadata);
  CHECK(read_bytes(dir / "again.safetensors") == read_bytes(path));
  CHECK_FALSE(fs::exists(dir / "model.safetensors.tmp"));
}

TEST_CASE("the layout on disk: length, JSON header, aligned data, largest elements first", "[safetensors]") {
  const fs::path dir = testing::make_temp_dir("safetensors_test");
  const fs::path path = dir / "layout.safetensors";
  save_file({{"a", random_tensor({3}, kBFloat16, 1)}, {"b", random_tensor({2}, kFloat64, 2)}}, path);
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(bytes[i]);
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + 2 * 8 + 3 * 2);
  const std::string json = bytes.substr(8, n);
  CHECK(json.starts_with(R"({"a":{"data_offsets":[16,22],"dtype":"BF16","shape":[3]},)"
                         R"("b":{"data_offsets":[0,16],"dtype":"F64","shape":[2]}})"));
  const SafetensorsHeader header = parse_safetensors_header(json, 22, "layout");
  REQUIRE(header.entries.size() == 2);
  CHECK(header.entries[0].name == "b");  // offset order
  CHECK(header.entries[1].shape == std::vector<int64_t>{3});
}

TEST_CASE("a failed save leaves the existing file intact", "[safetensors][errors]") {
  const fs::path dir = testing::make_temp_dir("safetensors_test");
  const fs::path path = dir / "ckpt.safetensors";
  save_file({{"w", random_tensor({4}, kFloat32, 3)}}, path);
  const std::string before = read_bytes(path);
  fs::create_directory(dir / "ckpt.safetensors.tmp");  // the temporary file cannot be opened
  CHECK_THROWS_MATCHES(save_file({{"w", random_tensor({8}, kFloat32, 4)}}, path), OSError,
                       MessageContains("save_file: open(") && MessageContains("ckpt.safetensors.tmp"));
  CHECK(read_bytes(path) == before);
  CHECK(fs::is_directory(dir / "ckpt.safetensors.tmp"));  // not the save's own: left alone
  // A save whose rename fails (a non-empty directory stands at the path) removes its temporary file.
  const fs::path blocked = dir / "blocked.safetensors";
  fs::create_directories(blocked / "inside");
  CHECK_THROWS_MATCHES(save_file({{"w", random_tensor({8}, kFloat32, 4)}}, blocked), OSError,
                       MessageContains("save_file: rename(") && MessageContains("blocked.safetensors.tmp"));
  CHECK_FALSE(fs::exists(dir / "blocked.safetensors.tmp"));
  CHECK(fs::is_directory(blocked / "inside"));
  CHECK_THROWS_MATCHES(load_file((dir / "missing.safetensors").string()), OSError,
                       MessageContains("missing.safetensors") && MessageContains("No such file"));
}

// A file image: the header of `entries` (or `json` when given) and `data_size` zero bytes.
std::string image(const std::string& json, size_t data_size) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(json.size() >> (8 * i));
  return bytes + json + std::string(data_size, '\0');
}

TEST_CASE("malformed files are typed errors naming the file and the tensor", "[safetensors][errors]") {
  const fs::path dir = testing::make_temp_dir("safetensors_test");
  int k = 0;
  auto load = [&](const std::string& bytes) {
    const fs::path path = dir / fmt::format("bad{}.safetensors", k++);
    write_bytes(path, bytes);
    return load_file(path);
  };
  const std::string w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  CHECK_NOTHROW(load(image("{" + w + "}", 8)));
  CHECK_THROWS_MATCHES(load("abc"), ValueError, MessageContains("3 bytes, too short"));
  CHECK_THROWS_MATCHES(load(image("{" + w + "}", 8).substr(0, 20)), ValueError, MessageContains("truncated"));
  std::string huge(8, '\0');
  huge[4] = 1;  // 2^32 bytes of header
  CHECK_THROWS_MATCHES(load(huge + "{}"), ValueError, MessageContains("over the 100000000-byte limit"));
  CHECK_THROWS_MATCHES(load(image("[1]", 0)), ValueError, MessageContains("does not start with '{'"));
  CHECK_THROWS_MATCHES(load(image("{\"w\":", 0)), ValueError, MessageContains("not valid JSON"));
  // A byte that is not UTF-8 (a corrupt header): the parser's message echoes it, escaped.
  try {
    load(image("{\"__metadata\xa0\": 1}", 0));
    FAIL("a header that is not UTF-8 loaded");
  } catch (const ValueError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("not valid JSON") && Catch::Contains("'\"__metadata\\xa0'"));
    CHECK(std::all_of(what.begin(), what.end(), [](char c) { return c >= 0x20 && c < 0x7f; }));
  }
  CHECK_THROWS_MATCHES(load(image("{" + w + "," + w + "}", 8)), ValueError,
                       MessageContains("tensor 'w' appears twice"));
  CHECK_THROWS_MATCHES(load(image(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 8)), TypeError,
                       MessageContains("tensor 'w': dtype 'U8' is not one dtr reads"));
  CHECK_THROWS_MATCHES(load(image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)), ValueError,
                       MessageContains("tensor 'w': a F32 tensor of shape [3] needs 12 bytes but data_offsets [0,8] "
                                       "hold 8"));
  CHECK_THROWS_MATCHES(load(image(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)), ValueError,
                       MessageContains("holds '-2', not a size"));
  CHECK_THROWS_MATCHES(load(image(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8)), ValueError,
                       MessageContains("holds '2.5', not a size"));
  CHECK_THROWS_MATCHES(
      load(image(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", 8)),
      ValueError, MessageContains("too many elements"));
  CHECK_THROWS_MATCHES(load(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)), ValueError,
                       MessageContains("begin <= end"));
  CHECK_THROWS_MATCHES(load(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8)), ValueError,
                       MessageContains("unknown field 'x'"));
  CHECK_THROWS_MATCHES(load(image("{" + w + R"(,"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)),
                       ValueError, MessageContains("tensor 'v': data_offsets [4, 12] overlap"));
  CHECK_THROWS_MATCHES(load(image("{" + w + R"(,"v":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16)),
                       ValueError, MessageContains("tensor 'v': data_offsets [12, 16] leave a gap after"));
  CHECK_THROWS_MATCHES(load(image("{" + w + "}", 4)), ValueError,
                       MessageContains("the tensors hold 8 bytes but the data section has 4 (truncated file?)"));
  CHECK_THROWS_MATCHES(load(image("{" + w + "}", 12)), ValueError,
                       MessageContains("the tensors hold 8 bytes but the data section has 12"));
  CHECK_THROWS_MATCHES(load(image(R"({"__metadata__":{"a":1}})", 0)), ValueError,
                       MessageContains("__metadata__ 'a' is not a string"));
  std::string bad_bool = image(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", 2);
  bad_bool.back() = 2;
  CHECK_THROWS_MATCHES(load(bad_bool), ValueError, MessageContains("tensor 'm': a BOOL byte is neither 0 nor 1"));
}

TEST_CASE("a file written by PyTorch's safetensors loads", "[safetensors]") {
  // tests/checkpoint/testdata/make_safetensors_testdata.py: safetensors.torch.save_file of these tensors.
  SafetensorsMetadata metadata;
  const TensorMap t = load_file("tests/checkpoint/testdata/torch_written.safetensors", &metadata);
  CHECK(metadata == SafetensorsMetadata{{"written_by", "safetensors.torch.save_file"}});
  REQUIRE(t.size() == 7);
  testing::check_equal(t.at("f32"), Shape{2, 3}, {0, 1.5, -2, 3.25, 4, -5.5}, "f32");
  testing::check_equal(t.at("f64"), Shape{2}, {0.1, -0.2}, "f64");
  testing::check_equal(t.at("bf16"), Shape{3}, {1, -2, 0.5}, "bf16");
  testing::check_equal(t.at("f16"), Shape{2}, {0.25, 65504}, "f16");
  testing::check_equal(t.at("i32"), Shape{3}, {-7, 8, 2147483647}, "i32");
  CHECK(t.at("i64").data_ptr<int64_t>()[0] == std::numeric_limits<int64_t>::lowest());
  CHECK(t.at("i64").data_ptr<int64_t>()[1] == std::numeric_limits<int64_t>::max());
  testing::check_equal(t.at("mask"), Shape{4}, {1, 0, 1, 1}, "bool");
  CHECK(t.at("mask").dtype() == kBool);
}

TEST_CASE("the fuzz corpus: every input parses or is a typed user error, never an internal one",
          "[safetensors][fuzz]") {
  // tools/fuzz/run_safetensors_fuzzer.sh grows this corpus with libFuzzer.
  int inputs = 0;
  for (const fs::directory_entry& e : fs::directory_iterator("tests/checkpoint/testdata/safetensors_corpus")) {
    const std::string bytes = read_bytes(e.path());
    INFO(e.path());
    try {
      const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
      const int64_t n = safetensors_header_length(std::span(data, bytes.size()), static_cast<int64_t>(bytes.size()),
                                                  e.path().string());
      parse_safetensors_header(std::string_view(bytes).substr(8, n), static_cast<int64_t>(bytes.size()) - 8 - n,
                               e.path().string());
    } catch (const InternalError& e) {  // an Error too, but a failed internal assert: a dtr bug
      FAIL_CHECK("an internal assert failed: " << e.what());
    } catch (const Error&) {  // a typed user error is the other acceptable outcome
    }
    ++inputs;
  }
  CHECK(inputs >= 10);
}

}  // namespace
}  // namespace dtr::nn
