// What every benchmark program needs: a clock, medians, an optimisation barrier and
// seeded data. Header-only, included by the programs under bench/.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "harness/model/data.hpp"

namespace shardscope::bench {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline double ms_since(Clock::time_point t0) { return ms_between(t0, Clock::now()); }

// 0 for an empty list.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double minimum(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

// Tells the compiler that `p` is read and memory clobbered: the loop's work must happen.
template <class T>
inline void escape(T* p) {
  asm volatile("" : : "g"(p) : "memory");
}

// Fresh, seeded, non-zero data in [-1, 1).
inline std::vector<float> random_floats(std::size_t n, std::uint64_t stream) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = hashed_uniform(7, stream, i);
  return v;
}

// memcpy of `floats` floats: (read + write) bytes per second / 1e9, median of `reps`.
inline double copy_gbps(std::size_t floats, int reps) {
  std::vector<float> src = random_floats(floats, 99), dst(floats, 0.0f);
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), floats * sizeof(float));
    escape(dst.data());
    ms.push_back(ms_since(t0));
  }
  return 2.0 * static_cast<double>(floats * sizeof(float)) / (median(ms) * 1e6);
}

}  // namespace shardscope::bench
