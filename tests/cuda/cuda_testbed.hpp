// Shared testbed of the CUDA tests: skip without a device, seeded data, closeness checks
// (atol + rtol·|ref|, CUTLASS-style: inputs are checked to be non-zero first).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "harness/backends/cuda_backend.hpp"
#include "support/random_data.hpp"
#include "shardscope/backend.hpp"

namespace shardscope::testing {

#define SHARDSCOPE_SKIP_WITHOUT_GPU()                                                      \
  do {                                                                                     \
    if (::shardscope::cuda_visible_devices() == 0)                                         \
      GTEST_SKIP() << "no CUDA device is visible (cudaGetDeviceCount failed or found none)"; \
  } while (0)


inline ::testing::AssertionResult nonzero(const std::vector<float>& v, const char* what) {
  for (float x : v)
    if (x != 0.0f) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " (" << v.size() << " floats) is all zeros";
}

// Every element within atol + rtol·|ref|; on failure, how many and the first few.
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& ref, double atol,
                                            double rtol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs reference " << ref.size();
  std::size_t bad = 0;
  std::ostringstream first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    const bool ok = std::isnan(r) ? std::isnan(g) : std::fabs(g - r) <= atol + rtol * std::fabs(r);
    if (!ok) {
      if (bad < 5) first << "\n  [" << i << "] got " << g << ", reference " << r;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size()
                                       << " elements outside atol " << atol << " + rtol " << rtol
                                       << " x |ref|:" << first.str();
}

// A fresh backend (own stream and pool) on device 0 per test.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SHARDSCOPE_SKIP_WITHOUT_GPU();
    backend_ = std::make_unique<CudaBackend>(0);
  }

  Buffer to_device(const std::vector<float>& host, Category c = Category::temp) {
    Buffer b = backend_->alloc(c, host.size());
    backend_->upload(b.data(), host.data(), host.size());
    return b;
  }
  std::vector<float> to_host(const float* p, std::size_t n) {
    std::vector<float> h(n);
    backend_->download(h.data(), p, n);
    return h;
  }
  std::vector<float> to_host(const Buffer& b) { return to_host(b.data(), b.count()); }

  std::unique_ptr<CudaBackend> backend_;
};

}  // namespace shardscope::testing
