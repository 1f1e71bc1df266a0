// launcher_probe: the program launcher_test starts as ranks under dtrrun.
//
// Its arguments are a script of actions run in order (listed above main), each reading
// RANK and DTR_RESTART_COUNT from the environment dtrrun gave it; it exits 0 at the end of
// the script.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

namespace {

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : -1;
}

std::string marker_path(const std::string& dir, const char* name) {
  return dir + "/" + name + "." + std::to_string(env_int("RANK"));
}

// Writes `size` bytes to `path` through a temporary file, so that a reader never sees a
// partly written file. Only async-signal-safe calls: the signal handler uses it.
void write_marker(const char* path, const char* temporary, const char* text, size_t size) {
  const int fd = ::open(temporary, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || ::write(fd, text, size) != static_cast<ssize_t>(size)) ::_exit(100);
  ::close(fd);
  ::rename(temporary, path);
}

// Set by on-signal before the handler is installed.
std::string signal_marker;
std::string signal_marker_temporary;

void on_signal(int signal) {
  const char text[] = {static_cast<char>('0' + signal / 10), static_cast<char>('0' + signal % 10)};
  write_marker(signal_marker.c_str(), signal_marker_temporary.c_str(), text, sizeof(text));
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

void print_env() {
  std::string line = "env";
  for (const char* name : {"RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                           "MASTER_PORT", "DTR_RESTART_COUNT", "DTR_RUN_ID", "OMP_NUM_THREADS"}) {
    const char* value = std::getenv(name);
    line += std::string(" ") + name + "=" + (value != nullptr ? value : "<unset>");
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

// The actions:
//   env                        print "env NAME=value ..." for torchrun's variables (stdout)
//   stderr TEXT                print TEXT and a newline to stderr
//   partial TEXT               print TEXT to stdout with no newline
//   pieces TEXT                print "TEXT from rank R\n" one byte per write(), 1 ms apart
//   exit-if-rank R CODE        exit with CODE if this is rank R
//   kill-if-rank R SIGNAL      raise SIGNAL if this is rank R
//   fail-before-restart N CODE exit with CODE while DTR_RESTART_COUNT < N
//   on-signal DIR              on SIGTERM or SIGINT: create DIR/signal.RANK holding the
//                              signal number (two digits), then die of that signal
//   ignore-sigterm             ignore SIGTERM (only SIGKILL stops it)
//   ready DIR                  create DIR/ready.RANK holding this process's pid
//   wait-for PATH              wait until PATH exists (another rank's ready file)
//   sleep SECONDS              sleep
int main(int argc, char** argv) {
  const int rank = env_int("RANK");
  for (int i = 1; i < argc; ++i) {
    const std::string_view action = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "launcher_probe: %s needs an argument\n", argv[i]);
        std::exit(101);
      }
      return argv[++i];
    };
    if (action == "env") {
      print_env();
    } else if (action == "stderr") {
      std::fprintf(stderr, "%s\n", next().c_str());
    } else if (action == "partial") {
      std::printf("%s", next().c_str());
      std::fflush(stdout);
    } else if (action == "pieces") {
      const std::string text = next() + " from rank " + std::to_string(rank) + "\n";
      for (char c : text) {
        if (::write(STDOUT_FILENO, &c, 1) != 1) return 102;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } else if (action == "exit-if-rank") {
      const int target = std::stoi(next());
      const int code = std::stoi(next());
      if (rank == target) return code;
    } else if (action == "kill-if-rank") {
      const int target = std::stoi(next());
      const int signal = std::stoi(next());
      if (rank == target) ::raise(signal);
    } else if (action == "fail-before-restart") {
      const int attempts = std::stoi(next());
      const int code = std::stoi(next());
      if (env_int("DTR_RESTART_COUNT") < attempts) return code;
    } else if (action == "on-signal") {
      signal_marker = marker_path(next(), "signal");
      signal_marker_temporary = signal_marker + ".tmp";
      ::signal(SIGTERM, on_signal);
      ::signal(SIGINT, on_signal);
    } else if (action == "ignore-sigterm") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (action == "ready") {
      const std::string path = marker_path(next(), "ready");
      const std::string pid = std::to_string(::getpid());
      write_marker(path.c_str(), (path + ".tmp").c_str(), pid.data(), pid.size());
    } else if (action == "wait-for") {
      const std::string path = next();
      while (::access(path.c_str(), F_OK) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    } else if (action == "sleep") {
      std::this_thread::sleep_for(std::chrono::duration<double>(std::stod(next())));
    } else {
      std::fprintf(stderr, "launcher_probe: unknown action '%s'\n", argv[i]);
      return 101;
    }
  }
  return 0;
}
