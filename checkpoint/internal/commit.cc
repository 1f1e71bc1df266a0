#include "checkpoint/internal/commit.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc 2.28)
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>

#include "checkpoint/metadata.h"
#include "core/error.h"
#include "core/posix_file.h"

namespace dtr::checkpoint::internal {

namespace fs = std::filesystem;

fs::path checkpoint_path(const std::string& dir, std::string_view op) {
  DTR_CHECK(!dir.empty(), ValueError, "{}: the checkpoint directory is an empty string", op);
  fs::path p = fs::absolute(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "ckpt/" -> "ckpt"
  DTR_CHECK(p.has_filename() && p.filename() != "." && p.filename() != "..", ValueError,
            "{}: '{}' does not name a directory that can be replaced (it has no last component)", op, dir);
  return p;
}

std::string rank_file(int rank) { return fmt::format("__{}_0.safetensors", rank); }

bool is_checkpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / internal::kMetadataFile, ec);
}

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

void commit(TempPath temp, const fs::path& target, const std::string& token) {
  const std::string parent = target.parent_path().string();
  auto make_durable = [&] {
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
    if (::rename(temp.path().c_str(), target.c_str()) != 0) {
      throw OSError(errno, fmt::format("{}: rename('{}', '{}')", kSave, temp.string(), target.string()));
    }
    temp.release();
    make_durable();
    return;
  }
  if (::renameat2(AT_FDCWD, temp.path().c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    make_durable();  // then `temp` removes the previous checkpoint, now under the temporary name
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
  if (::rename(temp.path().c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::rename(old.c_str(), target.c_str());  // put the previous checkpoint back
    throw OSError(error, fmt::format("{}: rename('{}', '{}')", kSave, temp.string(), target.string()));
  }
  temp.release();
  make_durable();
  fs::remove_all(old, ec);
}

}  // namespace dtr::checkpoint::internal
