#include "harness/comm/watchdog.hpp"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "shardscope/check.hpp"

namespace shardscope {

void Backoff::pause() {
  if (Clock::now() - start_ < kBusyFor) {
    sched_yield();  // other ranks sharing this core run; alone, this returns at once
    return;
  }
  sleep_ = sleep_.count() == 0 ? kFirstSleep : std::min(2 * sleep_, kLongestSleep);
  std::this_thread::sleep_for(sleep_);
}

StallHook stall_hook_from_env() {
  StallHook hook;
  const char* v = std::getenv("SHARDSCOPE_TEST_STALL");
  if (v == nullptr || *v == '\0') return hook;
  const std::string text = v;
  const std::size_t colon = text.find(':');
  char* end = nullptr;
  const long rank = colon == std::string::npos ? -1 : std::strtol(text.c_str(), &end, 10);
  const bool rank_ok = colon != std::string::npos && end == text.c_str() + colon && colon > 0 && rank >= 0 &&
                       rank < (1L << 20);
  double seconds = -1.0;
  if (rank_ok) {
    const char* s = text.c_str() + colon + 1;
    seconds = std::strtod(s, &end);
    if (end == s || *end != '\0') seconds = -1.0;
  }
  if (!rank_ok || !std::isfinite(seconds) || seconds <= 0.0 || seconds > 3600.0)
    throw UsageError("environment variable SHARDSCOPE_TEST_STALL=" + text +
                     ": expected RANK:SECONDS (a test hook; 0 < SECONDS <= 3600), e.g. 1:5");
  hook.rank = static_cast<int>(rank);
  hook.seconds = seconds;
  return hook;
}

std::string seconds_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", seconds);
  return buf;
}

}  // namespace shardscope
