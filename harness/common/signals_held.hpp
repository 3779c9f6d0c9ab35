// Result files are whole or absent (docs/design.md §6), even when a signal comes while one is
// written: the writer holds the interrupting signals off for the write, and the
// process's handlers (the CLI's) defer a signal that lands meanwhile on another thread.
#pragma once

#include <signal.h>

namespace shardscope {

// Holds off SIGINT, SIGTERM, SIGHUP and SIGQUIT for its lifetime: a signal that arrives
// while a result file is written takes effect once the file is whole (or its temporary
// removed), never in between. In this thread through the mask; in any other thread
// through the handlers, which defer (see writing_result_file).
class SignalsHeld {
 public:
  SignalsHeld();
  ~SignalsHeld();  // raises a deferred signal again
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t old_;
};

// For signal handlers (async-signal-safe): while a result file is being written, a
// handler that would end the process calls defer_signal(sig) and returns instead;
// SignalsHeld raises the signal again once the file is whole (or its temporary
// removed). A mask alone is not enough: it holds only in the writing thread, and a
// process-directed signal may land on any other (OpenBLAS's, MPI's).
bool writing_result_file() noexcept;
void defer_signal(int sig) noexcept;

}  // namespace shardscope
