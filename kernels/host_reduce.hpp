// Row reductions for the host kernels, written so that GCC vectorises them without
// fast-math: eight fp32 lanes, each summing every eighth term, added together in double
// at the end (torch's vectorised CPU reductions also keep fp32 lanes). A plain scalar
// loop would not vectorise, since reordering a float sum changes its rounding.
#pragma once

namespace shardscope::host {

constexpr int kLanes = 8;

// Sum of term(j) for j in [0, n).
template <typename Term>
double lane_sum(int n, Term term) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  double sum = 0.0;
  for (; j < n; ++j) sum += term(j);
  for (float a : acc) sum += a;
  return sum;
}

// max(start, x[0..n)).
inline float lane_max(const float* x, int n, float start) {
  float acc[kLanes];
  for (float& a : acc) a = start;
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  float mx = start;
  for (; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  for (float a : acc) mx = a > mx ? a : mx;
  return mx;
}

}  // namespace shardscope::host
