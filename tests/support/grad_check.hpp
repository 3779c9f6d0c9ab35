// Comparisons for the transformer kernel tests: outputs against a float64 reference, and
// analytic gradients against central finite differences of the forward kernel.
//
// A backward is checked on a scalar loss L = sum(w * y) with random weights w (so every
// output counts, with its own weight): the analytic gradient is the backward kernel run
// on dy = w, the numeric one (L(x + h) - L(x - h)) / (x+h - x-h) with L summed in double
// and the forward in fp32, h = eps.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace shardscope::testing {

// |got - ref| <= atol + rtol * |ref| for every element (a NaN fails).
inline void expect_near_all(const std::vector<float>& got, const std::vector<double>& ref, const std::string& what,
                            double atol, double rtol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double tol = atol + rtol * std::fabs(ref[i]);
    if (!(std::fabs(static_cast<double>(got[i]) - ref[i]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << ref[i] << " (tol " << tol
                    << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements differ";
}

inline double weighted_sum(const std::vector<float>& y, const std::vector<float>& w) {
  double s = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(w[i]) * y[i];
  return s;
}

// Every index of an n-element input, or `count` of them spread over it (first and last
// included) when n is larger.
inline std::vector<std::size_t> sample_indices(std::size_t n, std::size_t count) {
  std::vector<std::size_t> at;
  if (n <= count) {
    for (std::size_t i = 0; i < n; ++i) at.push_back(i);
    return at;
  }
  for (std::size_t j = 0; j < count; ++j) at.push_back(j * (n - 1) / (count - 1));
  return at;
}

// d loss / d x[i] for i in `at` by central differences; `loss` reads x (captured).
template <typename Loss>
std::vector<double> central_differences(std::vector<float>& x, const std::vector<std::size_t>& at, float eps,
                                        Loss loss) {
  std::vector<double> g;
  for (std::size_t i : at) {
    const float saved = x[i];
    const float up = saved + eps, down = saved - eps;
    x[i] = up;
    const double l_up = loss();
    x[i] = down;
    const double l_down = loss();
    x[i] = saved;
    g.push_back((l_up - l_down) / (static_cast<double>(up) - static_cast<double>(down)));
  }
  return g;
}

// The analytic gradient `grad` at `at` against the numeric `numeric`: each within
// rtol * |numeric| + atol, atol = floor_frac * the largest |numeric| (fp32 forwards make
// differences noisy where the gradient is near 0). Also fails when everything is ~0,
// which would make the comparison empty.
inline void expect_gradient(const std::vector<float>& grad, const std::vector<std::size_t>& at,
                            const std::vector<double>& numeric, const std::string& what, double rtol = 1e-2,
                            double floor_frac = 1e-3) {
  ASSERT_EQ(at.size(), numeric.size()) << what;
  double largest = 0.0;
  for (double v : numeric) largest = std::max(largest, std::fabs(v));
  ASSERT_GT(largest, 1e-3) << what << ": the numeric gradient is ~0 everywhere";
  const double atol = floor_frac * largest;
  int bad = 0;
  for (std::size_t j = 0; j < at.size(); ++j) {
    const double ana = grad[at[j]];
    const double tol = atol + rtol * std::fabs(numeric[j]);
    if (!(std::fabs(ana - numeric[j]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << ": d/dx[" << at[j] << "] analytic " << ana << " numeric " << numeric[j] << " (tol "
                    << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << at.size() << " gradient elements differ";
}

}  // namespace shardscope::testing
