// Small helpers for tests that drive the real binary through a shell.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace shardscope::testing {

// The environment variable `name`, or "" when unset.
inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Runs `cmd` with /bin/sh; its exit code, or -1 when it did not exit normally.
inline int shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The first line of a file ("" when it cannot be read).
inline std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace shardscope::testing
