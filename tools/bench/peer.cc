#include "tools/bench/peer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace dtr::bench {

std::string default_peer_python() {
  const char* home = std::getenv("HOME");
  if (home == nullptr) return "python3";
  const std::string venv = std::string(home) + "/torch-venv/bin/python3";
  return ::access(venv.c_str(), X_OK) == 0 ? venv : "python3";
}

void enter_workspace() {
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    if (::chdir(ws) != 0) throw OSError(errno, fmt::format("chdir('{}')", ws));
  }
}

std::string command_output(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen((command + " 2>&1").c_str(), "r"), ::pclose);
  if (!pipe) return "";
  std::string out;
  std::array<char, 512> buffer;
  while (std::fgets(buffer.data(), buffer.size(), pipe.get())) out += buffer.data();
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string torch_version(const std::string& python) {
  const std::string out =
      command_output(fmt::format("{} -c 'import torch; print(\"torch\", torch.__version__)'", shell_quote(python)));
  return out.starts_with("torch ") && out.find('\n') == std::string::npos ? out.substr(6) : "";
}

}  // namespace dtr::bench
