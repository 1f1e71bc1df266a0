#include "tools/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"

namespace dtr::train {
namespace {

namespace fs = std::filesystem;

// What rank 0 found for a directory.
enum class LockState : int { kHeld = 0, kBusy = 1, kNoFile = 2 };

// The pid the open lock file names, or 0 when it names none.
int64_t holder_pid(int fd) {
  char text[32] = {};
  const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
  return n > 0 ? std::strtoll(text, nullptr, 10) : 0;
}

}  // namespace

RunLock::RunLock(const TrainConfig& c, ProcessGroup& group) {
  const std::vector<std::pair<std::string, std::string>> dirs = output_dirs(c);
  // Rank 0's finding, shared: the directory (its index in dirs), its state, the holder's pid
  // or errno.
  std::vector<double> found(3, 0.0);
  if (group.rank() == 0) {
    std::set<fs::path> seen;  // one lock per directory: a second flock of it here would fail
    for (size_t i = 0; i < dirs.size(); ++i) {
      std::error_code ec;
      fs::path dir = fs::weakly_canonical(dirs[i].second, ec);
      if (ec) dir = dirs[i].second;  // the path as given still names the directory
      if (!seen.insert(dir).second) continue;
      const std::string path = (dir / ".lock").string();
      FileDescriptor fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
      LockState state = LockState::kHeld;
      int64_t detail = 0;
      if (!fd.valid()) {
        state = LockState::kNoFile;
        detail = errno;
      } else if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        state = LockState::kBusy;
        detail = holder_pid(fd.get());
      }
      if (state != LockState::kHeld) {
        found = {static_cast<double>(i), static_cast<double>(state), static_cast<double>(detail)};
        break;
      }
      // The pid is for the other run's message only: a failed write leaves it unnamed.
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd.get(), 0) == 0) (void)!::pwrite(fd.get(), pid.data(), pid.size(), 0);
      held_.push_back(std::move(fd));
    }
  }
  Tensor t = Tensor::from_vector<double>(found).to(group.device());
  group.broadcast(t, 0).wait();
  t = t.to(kCPU);
  const double* v = t.data_ptr<double>();
  const auto& [flag, dir] = dirs.at(static_cast<size_t>(v[0]));
  const auto state = static_cast<LockState>(static_cast<int>(v[1]));
  const auto detail = static_cast<int64_t>(v[2]);
  DTR_CHECK(state != LockState::kBusy, ValueError,
            "{} {}: another train run{} is using this directory; give each run its own {}", flag, dir,
            detail > 0 ? fmt::format(" (pid {})", detail) : std::string(), flag);
  DTR_CHECK(state != LockState::kNoFile, ValueError, "{} {}: cannot create the run's lock file .lock there: {}", flag,
            dir, std::strerror(static_cast<int>(detail)));
}

}  // namespace dtr::train
