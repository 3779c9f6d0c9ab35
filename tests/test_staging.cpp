// Backend::staging: host memory for staging device buffers through MPI. Slots are
// independent, grow on demand, keep their memory, and are never tracked.
#include <gtest/gtest.h>

#include <cstdint>

#include "harness/backends/cpu_backend.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

TEST(Staging, SlotsGrowAreKeptAndUntracked) {
  CpuBackend backend;
  float* a = backend.staging(0, 16);
  float* b = backend.staging(1, 1000);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  for (int i = 0; i < 16; ++i) a[i] = static_cast<float>(i);
  for (int i = 0; i < 1000; ++i) b[i] = -1.0f;  // slot 1 does not overlap slot 0
  EXPECT_EQ(backend.staging(0, 8), a);           // smaller request: same memory, same data
  EXPECT_EQ(a[15], 15.0f);
  float* grown = backend.staging(0, 1 << 20);  // larger: a new buffer
  ASSERT_NE(grown, nullptr);
  grown[(1 << 20) - 1] = 1.0f;
  EXPECT_EQ(backend.tracker().current_total(), 0);
  EXPECT_EQ(backend.tracker().live_allocations(), 0);
  EXPECT_THROW(backend.staging(-1, 4), RunError);
}

}  // namespace
}  // namespace shardscope
