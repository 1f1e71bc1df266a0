// checkpoint_tool: a dtr checkpoint (checkpoint/save.h) inspected, assembled into one
// safetensors file of full tensors, or written from one.
//
//   checkpoint_tool list DIR                                every tensor, its chunks and bytes
//   checkpoint_tool to-full DIR OUT.safetensors              full tensors, one at a time
//   checkpoint_tool to-sharded IN.safetensors DIR --ranks N  as if saved by N ranks, Shard(0)
//   checkpoint_tool export CKPT OUT.safetensors | --hf DIR    a train checkpoint's model under
//                                                            PyTorch's names (train --init-from
//                                                            and PyTorch's load_state_dict read it)
//
// Neither replaces what is already there (an OUT file, a DIR holding anything) unless
// --force is given; never an output inside the checkpoint it reads, nor (export --hf) a
// directory that is not an earlier export.
// to-full streams: the header comes from the metadata, then each tensor is assembled from
// its chunks with load's own reader (every checksum block verified, the chunks disjoint and
// covering the tensor) and written before the next is read, so memory holds one full tensor
// at a time. to-sharded starts N ranks of itself (launch_self) that each take their Shard(0)
// chunk (Replicate for 0-d tensors) and call checkpoint::save, so the files are exactly what
// a real N-rank save writes.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/chunk_file.h"
#include "checkpoint/full_state_dict_file.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_header.h"
#include "checkpoint/save.h"
#include "collectives/init.h"
#include "core/error.h"
#include "core/posix_file.h"
#include "core/temp_path.h"
#include "core/tensor.h"
#include "dtensor/device_mesh.h"
#include "dtensor/dtensor.h"
#include "dtensor/dtensor_spec.h"
#include "tools/command_line.h"
#include "tools/launcher/self_launch.h"
#include "tools/tool_main.h"

namespace dtr::tools {
namespace {

namespace fs = std::filesystem;
using checkpoint::internal::CheckpointMetadata;
using checkpoint::internal::SavedChunk;
using checkpoint::internal::SavedTensor;
using Json = nlohmann::json;

CheckpointMetadata read_metadata(const std::string& dir, std::string_view op) {
  const fs::path path = fs::path(dir) / checkpoint::internal::kMetadataFile;
  std::error_code ec;
  DTR_CHECK(fs::is_directory(dir, ec), ValueError, "{}: '{}' is not a directory", op, dir);
  DTR_CHECK(fs::is_regular_file(path, ec), ValueError,
            "{}: '{}' has no {}: not a dtr checkpoint, or an incomplete one (a save that did not finish)", op, dir,
            checkpoint::internal::kMetadataFile);
  return checkpoint::internal::read_metadata_file(path.string(), op);
}

// Whether `path` is `dir` or lies under it, symlinks resolved (a part of `path` that does
// not exist yet is taken as written).
bool is_within(const fs::path& path, const fs::path& dir) {
  const fs::path p = fs::weakly_canonical(path), d = fs::weakly_canonical(dir);
  return std::mismatch(d.begin(), d.end(), p.begin(), p.end()).first == d.end();
}

// Refuses an output inside the checkpoint directory it reads: --force would replace a file
// of the input (or a save would later swap the output away with the checkpoint).
void check_outside(const std::string& path, const std::string& flag_name, const std::string& dir, std::string_view op) {
  DTR_CHECK(!is_within(path, dir), ValueError,
            "{}: {} '{}' is the checkpoint directory '{}' it reads or inside it; write it outside that directory", op,
            flag_name, path, dir);
}

// What an output path must be: a file (OUT.safetensors) or a directory.
enum class Output { kFile, kDirectory };

// Refuses to write over `path` (a file, or a directory that is not empty) without --force;
// a file output is never written over a directory.
void check_replace(const std::string& path, const std::string& flag_name, Output kind, bool force,
                   std::string_view op) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  const bool is_dir = fs::is_directory(path, ec);
  DTR_CHECK(kind == Output::kDirectory || !is_dir, ValueError,
            "{}: {} '{}' is a directory; give the path of the .safetensors file to write", op, flag_name, path);
  DTR_CHECK(force || (is_dir && fs::is_empty(path, ec)), ValueError,
            "{}: {} '{}' already exists{}; pass --force to replace it", op, flag_name, path,
            is_dir ? " and is not empty" : "");
}

// Whether `name` is a file export --hf writes: a shard model-0000k-of-0000N.safetensors or the index.
bool is_hf_export_file(const std::string& name) {
  return name == checkpoint::kHfIndexName ||
         (name.starts_with("model-") && name.ends_with(".safetensors") && name.find("-of-") != std::string::npos);
}

// --force replaces an earlier export's directory, never one holding anything else (a
// training run's directory, say).
void check_hf_export_dir(const std::string& hf_dir) {
  std::error_code ec;
  if (!fs::is_directory(hf_dir, ec)) return;
  for (const fs::directory_entry& e : fs::directory_iterator(hf_dir)) {
    const std::string name = e.path().filename().string();
    DTR_CHECK(e.is_regular_file(ec) && is_hf_export_file(name), ValueError,
              "export: --hf '{}' holds '{}', which export does not write; --force replaces only an earlier export "
              "(model-*-of-*.safetensors and {}): remove the directory yourself or pick another",
              hf_dir, name, checkpoint::kHfIndexName);
  }
}

int64_t tensor_bytes(const SavedTensor& t) { return shape_numel(t.shape) * static_cast<int64_t>(itemsize(t.dtype)); }

// A tensor's informational mesh as "cpu [2] ranks [0,1]", with "?" for what is missing or
// not an object: load never reads it, so list takes what load accepts.
std::string mesh_text(const Json& mesh) {
  if (!mesh.is_object()) return "?";
  const auto field = [&](const char* key) {
    const auto it = mesh.find(key);
    if (it == mesh.end()) return std::string("?");
    return it->is_string() ? it->get<std::string>() : it->dump();
  };
  return fmt::format("{} {} ranks {}", field("device_type"), field("shape"), field("ranks"));
}

int list(const std::string& dir) {
  const CheckpointMetadata meta = read_metadata(dir, "list");
  int64_t total = 0;
  for (const auto& [name, t] : meta.tensors) total += tensor_bytes(t);
  fmt::print("checkpoint {}: saved by {} ranks, {} tensors, {} bytes\n", dir, meta.world_size, meta.tensors.size(),
             total);
  fmt::print("extra: {}\n", meta.extra.dump());
  for (const auto& [name, t] : meta.tensors) {
    fmt::print("{}: {} {} bytes {} mesh {} placements {} chunks {}\n", name, dtype_name(t.dtype), t.shape,
               tensor_bytes(t), mesh_text(t.mesh),
               t.placements.empty() ? "?" : fmt::format("[{}]", fmt::join(t.placements, ", ")), t.chunks.size());
    for (const SavedChunk& c : t.chunks) {
      fmt::print("  offset {} shape {} file {} bytes [{}, {})\n", c.offset, c.shape, c.file, c.begin, c.end);
    }
  }
  return 0;
}

// The full value of tensor `name`, assembled from its chunks with load's checks: every
// checksum block verified, the chunks disjoint and covering every element.
Tensor assemble(const std::string& name, const SavedTensor& t, checkpoint::internal::ChunkFileReader& files) {
  Tensor full = Tensor::empty(t.shape, t.dtype, kCPU);
  files.read_region(name, t, LocalChunk{Shape(t.shape.size(), 0), t.shape}, full);
  return full;
}

// One output tensor: its name in the file and the checkpoint tensor it holds.
struct Written {
  std::string name, source;
};

// Writes `tensors` of checkpoint `dir` into one safetensors file `out` (through out.tmp,
// fsync'ed and renamed), assembling one full tensor at a time; returns the data bytes.
int64_t write_full(const std::string& dir, const CheckpointMetadata& meta, std::vector<Written> tensors,
                   const std::string& out, std::string_view op) {
  // Largest element size first (every tensor aligned), then by name: safetensors::save_file's order.
  std::stable_sort(tensors.begin(), tensors.end(), [&](const Written& a, const Written& b) {
    return itemsize(meta.tensors.at(a.source).dtype) > itemsize(meta.tensors.at(b.source).dtype);
  });
  std::vector<SafetensorsEntry> entries;
  int64_t offset = 0;
  for (const Written& w : tensors) {
    const SavedTensor& t = meta.tensors.at(w.source);
    entries.push_back({w.name, t.dtype, t.shape, offset, offset + tensor_bytes(t)});
    offset += tensor_bytes(t);
  }
  const std::string name = out + ".tmp";
  std::error_code ec;
  fs::remove(name, ec);  // a leftover of an interrupted run
  FileDescriptor fd = open_file(name, O_WRONLY | O_CREAT | O_EXCL, op);
  TempPath temp(name);  // removed on any failure from here on
  const std::string header = safetensors_header_bytes(entries, {});
  write_all(fd.get(), header.data(), header.size(), name, op);
  checkpoint::internal::ChunkFileReader files(dir);
  for (const Written& w : tensors) {
    const Tensor full = assemble(w.source, meta.tensors.at(w.source), files);
    write_all(fd.get(), full.data(), full.nbytes(), name, op);
  }
  sync_and_close(std::move(fd), name, op);
  temp.rename_to(out, op);
  return offset;
}

int to_full(const std::string& dir, const std::string& out, bool force) {
  const CheckpointMetadata meta = read_metadata(dir, "to-full");
  check_outside(out, "OUT", dir, "to-full");
  check_replace(out, "OUT", Output::kFile, force, "to-full");
  std::vector<Written> tensors;
  for (const auto& [name, t] : meta.tensors) tensors.push_back({name, name});
  const int64_t bytes = write_full(dir, meta, tensors, out, "to-full");
  fmt::print("wrote {} tensors ({} bytes of data) to {}\n", tensors.size(), bytes, out);
  return 0;
}

// A train checkpoint's model as PyTorch names it: "model.<name>" -> "<name>" (optimizer
// state left out). A checkpoint without output.weight but with embed.weight saved a tied
// model (train --arch gpt: the output is the embedding): the embedding is written under
// both names, as the tied PyTorch module's state_dict() holds both.
std::vector<Written> model_tensors(const CheckpointMetadata& meta, const std::string& dir) {
  constexpr std::string_view kModel = "model.";
  std::vector<Written> out;
  for (const auto& [name, t] : meta.tensors) {
    if (name.starts_with(kModel)) out.push_back({name.substr(kModel.size()), name});
  }
  DTR_CHECK(!out.empty(), ValueError,
            "export: '{}' holds no model.* tensors: not a checkpoint the train program saved (to-full writes every "
            "tensor under its checkpoint name)",
            dir);
  const bool has_output = meta.tensors.contains("model.output.weight");
  if (!has_output && meta.tensors.contains("model.embed.weight"))
    out.push_back({"output.weight", "model.embed.weight"});
  return out;
}

int export_model(const std::string& dir, const std::string& out, const std::string& hf_dir, int64_t max_shard_bytes,
                 bool force) {
  const CheckpointMetadata meta = read_metadata(dir, "export");
  const std::vector<Written> tensors = model_tensors(meta, dir);
  DTR_CHECK(out.empty() != hf_dir.empty(), ValueError,
            "export: give OUT.safetensors or --hf DIR (Hugging Face's sharded layout), one of them");
  if (!out.empty()) {
    check_outside(out, "OUT", dir, "export");
    check_replace(out, "OUT", Output::kFile, force, "export");
    const int64_t bytes = write_full(dir, meta, tensors, out, "export");
    fmt::print("exported {} tensors ({} bytes of data) to {}\n", tensors.size(), bytes, out);
    return 0;
  }
  // Hugging Face's layout: shards of at most max_shard_bytes (a larger tensor alone), in
  // name order, and model.safetensors.index.json, written into a temporary directory that
  // replaces DIR only when complete.
  check_outside(hf_dir, "--hf", dir, "export");
  check_replace(hf_dir, "--hf", Output::kDirectory, force, "export");
  check_hf_export_dir(hf_dir);
  std::vector<int64_t> bytes;
  std::vector<std::string> names;
  for (const Written& w : tensors) {
    bytes.push_back(tensor_bytes(meta.tensors.at(w.source)));
    names.push_back(w.name);
  }
  const checkpoint::HfLayout layout = checkpoint::plan_hf_layout(bytes, max_shard_bytes);
  const fs::path name = hf_dir + ".tmp";
  std::error_code ec;
  fs::remove_all(name, ec);  // a leftover of an interrupted run
  fs::create_directories(name);
  TempPath temp(name);  // removed, with what it holds, on any failure from here on
  for (size_t f = 0; f < layout.files.size(); ++f) {
    std::vector<Written> file;
    for (size_t i : layout.files[f]) file.push_back(tensors[i]);
    write_full(dir, meta, file, (name / layout.file_names[f]).string(), "export");
  }
  std::ofstream(name / checkpoint::kHfIndexName) << layout.index_json(names);
  fs::remove_all(hf_dir, ec);  // only what --force allowed
  temp.rename_to(hf_dir, "export");
  fmt::print("exported {} tensors ({} bytes of data) to {} as {} file(s) and {}\n", tensors.size(), layout.total_bytes,
             hf_dir, layout.files.size(), checkpoint::kHfIndexName);
  return 0;
}

// The parent's check of IN before it starts ranks: it exists and its header parses.
void check_safetensors(const std::string& in) {
  FileDescriptor fd = open_file(in, O_RDONLY, "to-sharded");
  const int64_t size = file_size(fd.get(), in, "to-sharded");
  std::vector<uint8_t> prefix(8);
  const size_t got = read_at(fd.get(), prefix.data(), prefix.size(), 0, in, "to-sharded");
  prefix.resize(got);
  const int64_t length = safetensors_header_length(prefix, size, in);
  std::string json(static_cast<size_t>(length), '\0');
  read_at(fd.get(), json.data(), json.size(), 8, in, "to-sharded");
  parse_safetensors_header(json, size - 8 - length, in);
}

// One rank of to-sharded: its Shard(0) chunk of every tensor (0-d ones Replicate), saved.
int to_sharded_rank(const std::string& in, const std::string& dir) {
  init_process_group(Backend::kGloo);
  const DeviceMesh mesh = init_device_mesh(kCPU, {default_group()->size()});
  checkpoint::State state;
  SafetensorsMetadata metadata;
  for (const auto& [name, full] : safetensors::load_file(in, &metadata)) {
    const Placements placements = {full.dim() == 0 ? Placement(Replicate()) : Placement(Shard(0))};
    DTensorSpec spec(mesh, placements, full.shape(), full.dtype());
    state.tensors[name] = DTensor(chunk_of(full, spec.local_chunk()).contiguous(), spec);
  }
  state.extra = {{"converted_from", in}};
  checkpoint::save(state, dir);
  if (mesh.this_rank() == 0) fmt::print("wrote {} tensors to {} as {} ranks\n", state.tensors.size(), dir, mesh.size());
  destroy_process_group();
  return 0;
}

}  // namespace
}  // namespace dtr::tools

int main(int argc, char** argv) {
  CLI::App app{"Inspect dtr checkpoints and convert them to and from one safetensors file."};
  app.require_subcommand(1);
  std::string dir, file;
  int ranks = 1;
  bool force = false;
  CLI::App* list = app.add_subcommand("list", "every tensor: dtype, shape, mesh, placements, chunks, bytes");
  list->add_option("DIR", dir, "checkpoint directory")->required();
  CLI::App* to_full = app.add_subcommand("to-full", "assemble full tensors into one safetensors file");
  to_full->add_option("DIR", dir, "checkpoint directory")->required();
  to_full->add_option("OUT", file, "output .safetensors file")->required();
  to_full->add_flag("--force", force, "replace OUT if it exists");
  std::string hf_dir;
  int64_t max_shard_bytes = dtr::checkpoint::kDefaultMaxShardBytes;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "a train checkpoint's model as a full state dict under PyTorch's names (no optimizer state)");
  export_cmd->add_option("CKPT", dir, "a checkpoint the train program saved")->required();
  export_cmd->add_option("OUT", file, "output .safetensors file");
  CLI::Option* hf = export_cmd->add_option("--hf", hf_dir,
                                           "write Hugging Face's sharded layout (with its index) into this directory");
  export_cmd->add_option("--max-shard-size", max_shard_bytes, "bytes per file of --hf's layout")
      ->check(dtr::whole_number(1))
      ->capture_default_str()
      ->needs(hf);
  export_cmd->add_flag("--force", force, "replace OUT or the --hf directory if it exists");
  CLI::App* to_sharded = app.add_subcommand("to-sharded", "write a checkpoint as if saved by N ranks with Shard(0)");
  to_sharded->add_option("IN", file, "input .safetensors file")->required();
  to_sharded->add_option("DIR", dir, "checkpoint directory to write")->required();
  to_sharded->add_option("--ranks", ranks, "ranks of the saving world")->check(dtr::whole_number(1, 64));
  to_sharded->add_flag("--force", force, "replace what DIR holds");
  if (const std::optional<int> exit_code = dtr::parse_command_line("checkpoint_tool", app, argc, argv))
    return *exit_code;
  return dtr::tool_main("checkpoint_tool", [&] {
    if (*list) return dtr::tools::list(dir);
    if (*to_full) return dtr::tools::to_full(dir, file, force);
    if (*export_cmd) return dtr::tools::export_model(dir, file, hf_dir, max_shard_bytes, force);
    if (dtr::launcher::is_rank_process()) return dtr::tools::to_sharded_rank(file, dir);
    dtr::tools::check_safetensors(file);
    DTR_CHECK(!dtr::tools::is_within(file, dir), ValueError,
              "to-sharded: IN '{}' is inside DIR '{}', which the checkpoint replaces; give a DIR that does not hold IN",
              file, dir);
    dtr::tools::check_replace(dir, "DIR", dtr::tools::Output::kDirectory, force, "to-sharded");
    const dtr::launcher::SelfLaunchResult result = dtr::launcher::launch_self(ranks, std::span(argv, argc));
    if (result.exit_code != 0) std::cerr << "checkpoint_tool: " << result.failure << "\n";
    return result.exit_code;
  });
}
