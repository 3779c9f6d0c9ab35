// The watchdog on every collective (docs/design.md §5, docs/cli.md `--comm-timeout`): no wait
// for a collective or a p2p exchange is unbounded. A communicator polls its operation
// (MPI_Testall; cudaStreamQuery with ncclCommGetAsyncError) through wait_until, which backs
// off between polls so that a long wait does not burn a core, and gives up when the
// communicator's timeout has passed.
#pragma once

#include <chrono>
#include <string>

namespace shardscope {

// Paces a polling loop: polls at once, then with sched_yield between polls for the first
// kBusyFor (a short collective's completion is seen within microseconds, as a blocking
// MPI call would see it), then sleeps between polls, from kFirstSleep doubling to
// kLongestSleep (a long wait costs a poll per half millisecond, and is seen at most that
// late).
class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kBusyFor{10'000};
  static constexpr std::chrono::microseconds kFirstSleep{20};
  static constexpr std::chrono::microseconds kLongestSleep{500};

  explicit Backoff(Clock::time_point start) : start_(start) {}
  void pause();

 private:
  Clock::time_point start_;
  std::chrono::microseconds sleep_{0};
};

// Calls `done()` until it returns true (then returns true) or until `timeout_s` seconds
// have passed since the call (then returns false, after one last poll). `done` may throw.
template <class Done>
bool wait_until(Done&& done, double timeout_s) {
  const auto start = Backoff::Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Backoff::Clock::duration>(std::chrono::duration<double>(timeout_s));
  Backoff backoff(start);
  for (;;) {
    if (done()) return true;
    if (Backoff::Clock::now() >= deadline) return done();
    backoff.pause();
  }
}

// A test hook for the watchdog (scripts/gpu-check.sh, tests/cli/test_stuck_rank.cpp):
// SHARDSCOPE_TEST_STALL=R:S makes rank R stall its first timed collective for S seconds
// (the host sleeps before posting on MPI; a host function sleeps on the stream before the
// NCCL call), as a peer that is alive but stuck would. {-1, 0} when unset; throws
// UsageError naming the variable when it is set but malformed.
struct StallHook {
  int rank = -1;
  double seconds = 0.0;
};
StallHook stall_hook_from_env();

// "2", "0.5", "300": seconds as the flag takes them.
std::string seconds_text(double seconds);

}  // namespace shardscope
