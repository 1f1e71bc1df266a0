// Running a benchmark's optional PyTorch peer: a Python script in tools/bench/ that runs the
// same work in PyTorch and prints one line of figures (or "torch missing").
#pragma once

#include <string>

namespace dtr::bench {

// The Python that runs peers: $HOME/torch-venv/bin/python3 (where the notes install
// PyTorch), else python3 on PATH.
std::string default_peer_python();

// Makes the workspace the working directory under `bazel run` (which starts in the
// runfiles tree), so that peers are found at tools/bench/. OSError when it cannot.
void enter_workspace();

// Runs `command` through the shell and returns what it printed (stdout and stderr), without
// its trailing newlines; "" when it could not be started.
std::string command_output(const std::string& command);

// `s` as one shell word (single-quoted).
std::string shell_quote(const std::string& s);

// The version of torch that `python` imports, or "" when it cannot.
std::string torch_version(const std::string& python);

}  // namespace dtr::bench
