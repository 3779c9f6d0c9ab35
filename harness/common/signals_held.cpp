#include "harness/common/signals_held.hpp"

#include <pthread.h>

#include <csignal>
#include <initializer_list>

namespace shardscope {
namespace {

volatile std::sig_atomic_t g_writing = 0;   // a result file is being written
volatile std::sig_atomic_t g_deferred = 0;  // a signal that came meanwhile

}  // namespace

SignalsHeld::SignalsHeld() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, &old_);
  g_writing = 1;
}

SignalsHeld::~SignalsHeld() {
  g_writing = 0;
  const int deferred = g_deferred;
  g_deferred = 0;
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);  // a signal blocked here arrives now
  if (deferred != 0) std::raise(deferred);
}

bool writing_result_file() noexcept { return g_writing != 0; }

void defer_signal(int sig) noexcept { g_deferred = sig; }

}  // namespace shardscope
