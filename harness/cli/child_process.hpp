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
  double timeout_s = 600.0;            // seconds, may be fractional (what is left of a job's)
};

struct ChildResult {
  enum class End { exited, signaled, timed_out, interrupted };
  End end = End::exited;
  int code = 0;    // exit code when End::exited
  int signal = 0;  // the signal when End::signaled; the one received when End::interrupted
  double seconds = 0.0;
};

// For its lifetime, SIGINT, SIGTERM, SIGHUP and SIGQUIT are caught instead of ending
// this process: they are recorded, and run_child passes them on to its child's process
// group (our children sit in their own groups, so a terminal's Ctrl-C or a closed
// terminal's SIGHUP reaches only us). The sweep holds one from start to end, so that it
// always stops its job and writes what completed. Guards nest; the outermost clears the
// record and restores the previous handlers.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  // The first of those signals received while a guard is held; 0 when none.
  static int received();

 private:
  bool outermost_ = false;
};

// Runs the child to its end. Past the timeout, or when this process receives one of the
// signals InterruptGuard names meanwhile (run_child holds a guard itself), the whole
// group gets SIGTERM, then SIGKILL 3 s later; a signal received before the call ends it
// at once the same way. Leftovers of the group are killed after the child ends. Throws
// RunError when the child cannot be started.
ChildResult run_child(const ChildSpec& spec);

// "exited with code 3", "killed by signal 9 (Killed)", "timed out after 600 s",
// "interrupted by SIGHUP".
std::string describe(const ChildResult& r, int timeout_s);

// "signal 2 (Interrupt)".
std::string signal_text(int signal);

// The name of an interrupting signal: "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"; nullptr
// for any other. Async-signal-safe (run's handler uses it).
const char* interrupt_name(int signal) noexcept;

// The same for messages: any other signal as signal_text.
std::string interrupt_text(int signal);

// The first executable `name` on PATH ("" when none); a name with a '/' is returned
// as it is when executable.
std::string find_executable(const std::string& name);

}  // namespace shardscope
