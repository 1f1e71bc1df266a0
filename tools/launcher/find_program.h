// find_program: the file that execvp() would run for a command name, found before forking.
//
// A name containing '/' is a path (relative to the working directory) and is used as is;
// any other name is looked up in the directories of $PATH, in order, where an empty entry
// means the working directory (POSIX's rule). The launcher resolves the program once, up
// front, so that a typo fails with one clear message instead of N ranks exiting 127, and so
// that each rank can be started with execve() and its own environment.
#pragma once

#include <string>

namespace dtr::launcher {

// The executable to run for `name`; throws ValueError naming `name` and the
// directories searched when there is no executable regular file by that name.
std::string find_program(const std::string& name);

}  // namespace dtr::launcher
