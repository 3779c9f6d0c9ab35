// Starting a job's process for the sweep: its own process group (so a timeout or an
// interrupt can end mpirun and every rank together), stdout and stderr to files,
// stdin from /dev/null.
#pragma once

#include <string>
#include <vector>

namespace shardscope {

struct ChildSpec {
  std::vector<std::string> argv;        // argv[0]: a path to an executable
  std::string stdout_path;              // created or truncated
  std::string stderr_path;
  std::vector<std::string> extra_env;   // "NAME=value", added unless NAME is already set
  int timeout_s = 600;
};

struct ChildResult {
  enum class End { exited, signaled, timed_out, interrupted };
  End end = End::exited;
  int code = 0;    // exit code when End::exited
  int signal = 0;  // the signal when End::signaled
  double seconds = 0.0;
};

// Runs the child to its end. Past the timeout, or when this process receives SIGINT
// or SIGTERM meanwhile, the whole group gets SIGTERM, then SIGKILL 3 s later.
// Leftovers of the group are killed after the child ends. Throws RunError when the
// child cannot be started.
ChildResult run_child(const ChildSpec& spec);

// "exited with code 3", "killed by signal 9 (Killed)", "timed out after 600 s", "interrupted".
std::string describe(const ChildResult& r, int timeout_s);

// The first executable `name` on PATH ("" when none); a name with a '/' is returned
// as it is when executable.
std::string find_executable(const std::string& name);

}  // namespace shardscope
