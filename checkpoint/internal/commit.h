// The on-disk protocol of a checkpoint directory: its rank files and metadata, the
// temporary `<dir>.tmp-<token>` a save writes into, and the commit that moves it into place
// atomically (the previous checkpoint survives any crash before it, the new one any crash
// after). Leftovers of interrupted saves are found by name and cleared only while a
// committed checkpoint is there. docs/checkpoint.md tells the protocol step by step.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/temp_path.h"

namespace dtr::checkpoint::internal {

inline constexpr std::string_view kSave = "checkpoint::save";
inline constexpr std::string_view kLoad = "checkpoint::load";

// The checkpoint directory as an absolute path without a trailing separator.
std::filesystem::path checkpoint_path(const std::string& dir, std::string_view op);

// "__<rank>_0.safetensors": the file of one rank's chunks.
std::string rank_file(int rank);

// Whether `dir` holds a committed checkpoint (its metadata, written last, is there).
bool is_checkpoint(const std::filesystem::path& dir);

// Siblings `<dir>.tmp-*` (saves that did not commit) and `<dir>.old-*` (the previous
// checkpoint during a commit without an atomic exchange), sorted.
std::vector<std::filesystem::path> leftover_siblings(const std::filesystem::path& target);

// Rank 0's checks before anything is written: `dir` must be absent, empty or a checkpoint.
void check_replaceable(const std::filesystem::path& target);

// A token unique to one save (the process id and 64 random bits).
std::string make_token();

// Moves the complete `temp` to `target`. With an existing checkpoint there, renameat2's
// RENAME_EXCHANGE swaps the two directories in one atomic step and the previous one, now
// at the temporary name, goes with `temp`; where the filesystem cannot exchange, the
// previous one moves aside to `<dir>.old-<token>` first (a crash between the two renames
// leaves no `dir`, the previous checkpoint there and the new complete one at `temp`). Once
// the new checkpoint is at `target` the parent is fsync'ed (a failure then says the new
// checkpoint is in place). On a failure before that, `temp` goes with what it holds.
void commit(TempPath temp, const std::filesystem::path& target, const std::string& token);

}  // namespace dtr::checkpoint::internal
