// tool_main: the one catch of a tool's main (dtr's benchmarks and explainers).
//
// A tool's main parses its flags (tools/command_line.h) and hands the rest to tool_main,
// which first derives torchrun's variables from Slurm's srun or an MPI launcher where they
// are absent (collectives/launch_env.h), then runs it and
// turns whatever escapes into one line on stderr and exit code 1: "<tool>: <what()>" for a
// dtr error (ValueError, DistributedError, OSError, ...) or any other exception, with a
// "[rank <RANK>] " prefix when the process runs as a rank (RANK and WORLD_SIZE set, by
// dtrrun, torchrun or launch_self), so a failing rank names itself under any launcher.
// Nothing below main catches to print (STYLE.md, "Errors"). dtrrun, the launcher itself,
// reports its own errors as "[dtrrun] error: ...".
#pragma once

#include <functional>
#include <string_view>

namespace dtr {

// Runs `body` and returns its exit code, or 1 after printing the one line for an exception.
int tool_main(std::string_view tool, const std::function<int()>& body);

}  // namespace dtr
