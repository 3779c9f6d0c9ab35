// The CUDA backend's memory accounting (tracker vs the pool's own counters), its profiler
// ranges, and its error paths. Skips without a device. The pool tests print both figures
// ("[pool] ..."), so a real run shows how the driver counts.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"
#include "kernels/host_ops.hpp"
#include "nvtx_counter.hpp"
#include "shardscope/check.hpp"

namespace shardscope::testing {
namespace {

// cuBLAS's workspace: tracked, in the pool, from the backend's start to its end.
constexpr std::int64_t kWorkspace = CudaBackend::kWorkspaceBytes;

PoolStats stats_of(CudaBackend& b) {
  PoolStats s;
  EXPECT_TRUE(b.pool_stats(&s));
  return s;
}

void print_stats(const char* when, const PoolStats& s, const Tracker& t) {
  std::printf("[pool] %-28s used %lld (tracker rounded %lld, requested %lld)  used_high %lld "
              "(tracker rounded peak %lld)  reserved %lld  reserved_high %lld\n",
              when, static_cast<long long>(s.used_current),
              static_cast<long long>(t.rounded_current()),
              static_cast<long long>(t.current_total()), static_cast<long long>(s.used_high),
              static_cast<long long>(t.rounded_peak()), static_cast<long long>(s.reserved_current),
              static_cast<long long>(s.reserved_high));
}

// The rule of cuda_pool_rounded_bytes, measured: each request alone (and a second one of
// the same size beside it), its UsedMemCurrent delta against the function's answer, and
// how far apart the two pointers landed.
TEST_F(CudaTest, PoolRoundingMatchesUsedMemCurrent) {
  const std::vector<long long> sizes = {
      4,         8,         12,        100,           252,         256,         260,
      508,       512,       516,       1000,          1020,        1024,        1028,
      2044,      2048,      2052,      3000,          4096,        4100,        10000,
      65536,     65540,     100000,    (1 << 20) - 4, 1 << 20,     (1 << 20) + 4,
      1000000,   (2 << 20) - 4, 2 << 20, (2 << 20) + 4, 3000000,   (4 << 20) + 4,
      10000000,  (32 << 20) + 4, 100000000};
  std::printf("[pool-rounding] %12s %12s %12s %14s %12s\n", "requested", "used delta",
              "2nd delta", "rounded_bytes", "ptr gap");
  for (long long bytes : sizes) {
    const auto floats = static_cast<std::size_t>(bytes / 4);
    const PoolStats before = stats_of(*backend_);
    Buffer first = backend_->alloc(Category::temp, floats);
    const PoolStats one = stats_of(*backend_);
    Buffer second = backend_->alloc(Category::temp, floats);
    const PoolStats two = stats_of(*backend_);
    const long long d1 = one.used_current - before.used_current;
    const long long d2 = two.used_current - one.used_current;
    const long long gap = reinterpret_cast<long long>(second.data()) -
                          reinterpret_cast<long long>(first.data());
    const long long expected = backend_->rounded_bytes(bytes);
    std::printf("[pool-rounding] %12lld %12lld %12lld %14lld %12lld%s\n", bytes, d1, d2, expected,
                gap, d1 == expected && d2 == expected ? "" : "   <-- differs");
    EXPECT_EQ(d1, expected) << "request of " << bytes << " B";
    EXPECT_EQ(d2, expected) << "second request of " << bytes << " B";
    first.reset();
    second.reset();
  }
  // Many small ones side by side: the per-allocation charge when they pack together.
  {
    const PoolStats before = stats_of(*backend_);
    std::vector<Buffer> many;
    for (int i = 0; i < 100; ++i) many.push_back(backend_->alloc(Category::temp, 1));
    const PoolStats after = stats_of(*backend_);
    std::printf("[pool-rounding] 100 x 4 B: used delta %lld (%lld each); rounded_bytes(4) = %lld\n",
                static_cast<long long>(after.used_current - before.used_current),
                static_cast<long long>((after.used_current - before.used_current) / 100),
                static_cast<long long>(backend_->rounded_bytes(4)));
    EXPECT_EQ(after.used_current - before.used_current, 100 * backend_->rounded_bytes(4));
  }
  const PoolStats end = stats_of(*backend_);
  print_stats("after the probe", end, backend_->tracker());
  EXPECT_EQ(end.used_current, kWorkspace);
}

// After allocations and frees and a sync, UsedMemCurrent is the tracker's rounded figure.
// A fresh backend holds cuBLAS's workspace alone.
TEST_F(CudaTest, PoolUsedCurrentEqualsTrackedRounded) {
  PoolStats s = stats_of(*backend_);
  print_stats("fresh backend", s, backend_->tracker());
  EXPECT_EQ(s.used_current, kWorkspace);
  EXPECT_EQ(backend_->tracker().rounded_current(), kWorkspace);

  const std::vector<std::size_t> floats = {1,     3,      127,     128,       129,     1000,
                                           4096,  65537,  262144,  1 << 20,   (1 << 20) + 1,
                                           3000000, 17,   555555};
  std::vector<Buffer> live;
  for (std::size_t i = 0; i < floats.size(); ++i)
    live.push_back(backend_->alloc(static_cast<Category>(i % kCategoryCount), floats[i]));
  for (std::size_t i = 0; i < live.size(); i += 2) live[i].reset();  // free every other one
  for (std::size_t f : {7u, 70000u, 2000000u}) live.push_back(backend_->alloc(Category::temp, f));

  s = stats_of(*backend_);
  print_stats("after allocs and frees", s, backend_->tracker());
  EXPECT_GT(backend_->tracker().rounded_current(), 0);
  EXPECT_EQ(s.used_current, backend_->tracker().rounded_current());
  EXPECT_GE(s.reserved_current, s.used_current);

  live.clear();
  s = stats_of(*backend_);
  print_stats("after freeing everything", s, backend_->tracker());
  EXPECT_EQ(s.used_current, kWorkspace);
  EXPECT_EQ(backend_->tracker().rounded_current(), kWorkspace);
  EXPECT_GT(s.reserved_current, 0) << "release threshold UINT64_MAX keeps freed memory reserved";
}

// A step window: reset both high-water marks at the same moment, run allocations and frees
// queued behind slow kernels (so frees are still pending on the stream when later
// allocations are made), then compare UsedMemHigh with the tracker's rounded peak.
TEST_F(CudaTest, PoolUsedHighEqualsTrackedRoundedPeak) {
  Buffer resting = backend_->alloc(Category::param, 300000);
  Buffer busy = backend_->alloc(Category::temp, 256u << 20);  // 1 GiB to keep the GPU busy
  busy.reset();
  backend_->reset_pool_high();
  backend_->tracker().reset_peak();
  PoolStats s = stats_of(*backend_);
  print_stats("window start", s, backend_->tracker());
  EXPECT_EQ(s.used_high, s.used_current);

  Buffer work = backend_->alloc(Category::temp, 64u << 20);  // 256 MiB
  for (int i = 0; i < 4; ++i) backend_->fill(work.data(), 1.0f, work.count());
  Buffer a = backend_->alloc(Category::activation, 1u << 20);
  Buffer b = backend_->alloc(Category::activation, 3u << 20);
  a.reset();
  Buffer c = backend_->alloc(Category::comm, 1u << 17);
  b.reset();
  work.reset();
  Buffer d = backend_->alloc(Category::grad_unsharded, 5u << 20);
  d.reset();
  c.reset();

  s = stats_of(*backend_);
  print_stats("window end", s, backend_->tracker());
  EXPECT_EQ(s.used_high, backend_->tracker().rounded_peak());
  EXPECT_EQ(s.used_current, backend_->tracker().rounded_current());
}

TEST_F(CudaTest, OutOfMemoryIsARunErrorAndTheBackendStaysUsable) {
  const std::size_t huge = std::size_t{1} << 40;  // 4 TiB of floats
  EXPECT_THROW(backend_->alloc(Category::activation, huge), RunError);
  EXPECT_EQ(backend_->tracker().current_total(), kWorkspace);
  Buffer ok = backend_->alloc(Category::temp, 1000);
  backend_->fill(ok.data(), 2.0f, ok.count());
  EXPECT_TRUE(all_close(to_host(ok), std::vector<float>(1000, 2.0f), 0.0, 0.0));
}

TEST_F(CudaTest, DescribesTheDeviceAndMemoryOutsideThePool) {
  const std::string d = backend_->device_description();
  std::printf("[device] %s\n", d.c_str());
  EXPECT_NE(d.find("CUDA runtime"), std::string::npos) << d;
  Buffer b = backend_->alloc(Category::param, 16u << 20);  // 64 MiB in the pool
  const OutsidePool outside = backend_->outside_pool();
  const PoolStats s = stats_of(*backend_);
  ASSERT_NE(outside.source, nullptr);
  std::printf("[device] outside the pool: %lld B (source %s, pool reserved %lld B); "
              "cuBLAS workspace %lld B\n",
              static_cast<long long>(outside.bytes), outside.source, static_cast<long long>(s.reserved_current),
              static_cast<long long>(backend_->workspace_bytes()));
  // NVML's figure when it lists this process, else the cudaMemGetInfo delta since the
  // backend started; either way a figure, and the source says which.
  const std::string source = outside.source;
  EXPECT_TRUE(source == "nvml" || source == "cuda_mem_get_info_delta") << source;
  // cuBLAS's workspace is in the pool now, not outside it.
  EXPECT_GE(s.reserved_current, backend_->workspace_bytes() + (64 << 20));
}

// The parts outside the pool measured as the backend was made: cuBLAS's always (NVML's or
// cudaMemGetInfo's figure), the context's with NVML; no NCCL communicator yet.
TEST_F(CudaTest, MeasuresTheContextAndCublasOutsideThePool) {
  OutsidePoolBreakdown b;
  ASSERT_TRUE(backend_->outside_pool_breakdown(&b));
  const OutsidePool outside = backend_->outside_pool();
  ASSERT_NE(outside.source, nullptr);
  std::printf("[device] outside the pool by part: context %lld B (%s), cuBLAS %lld B (%s), of %lld B (%s)\n",
              static_cast<long long>(b.cuda_context.bytes), b.cuda_context.source.c_str(),
              static_cast<long long>(b.cublas.bytes), b.cublas.source.c_str(), static_cast<long long>(outside.bytes),
              outside.source);
  EXPECT_GE(b.cublas.bytes, 0) << b.cublas.source;
  EXPECT_EQ(b.cublas.source, std::string(outside.source));
  if (std::string(outside.source) == "nvml") {
    EXPECT_GT(b.cuda_context.bytes, 0);
    EXPECT_GE(outside.bytes, b.cuda_context.bytes + b.cublas.bytes);
  } else {
    EXPECT_EQ(b.cuda_context.source, "not measured");
  }
  EXPECT_TRUE(b.nccl.empty());
}

// cuBLAS's workspace: 33,554,432 B of category workspace from the backend's pool as soon as
// it is made, the only thing a fresh backend holds; GEMMs large enough for cuBLAS to want a
// workspace still match the host, and the workspace stays as it was.
TEST_F(CudaTest, CublasWorkspaceIsTrackedInThePool) {
  ASSERT_EQ(kWorkspace, 33'554'432);
  EXPECT_EQ(backend_->workspace_bytes(), kWorkspace);
  const Tracker& t = backend_->tracker();
  EXPECT_EQ(t.current()[Category::workspace], kWorkspace);
  EXPECT_EQ(t.current_total(), kWorkspace);
  EXPECT_EQ(t.live_allocations(), 1);
  const PoolStats fresh = stats_of(*backend_);
  EXPECT_EQ(fresh.used_current, kWorkspace);

  const int m = 512, n = 384, k = 1024;
  const auto a = random_floats(static_cast<std::size_t>(m) * k, 21);
  const auto b = random_floats(static_cast<std::size_t>(k) * n, 22);
  std::vector<float> c_ref(static_cast<std::size_t>(m) * n, 0.0f);
  {
    Buffer da = to_device(a), db = to_device(b), dc = to_device(c_ref);
    backend_->gemm(Trans::no, Trans::no, m, n, k, 1.0f, da.data(), k, db.data(), n, 0.0f, dc.data(), n);
    host::gemm_loops(Trans::no, Trans::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c_ref.data(), n);
    EXPECT_TRUE(all_close(to_host(dc), c_ref, 1e-4, 1e-4));
    // Batched too (cublasSgemmStridedBatched, the same handle and workspace).
    Buffer dcb = to_device(std::vector<float>(2 * static_cast<std::size_t>(m) * n, 0.0f));
    backend_->gemm_batched(Trans::no, Trans::no, m, n, k, 1.0f, da.data(), k, 0, db.data(), n, 0, 0.0f, dcb.data(),
                           n, static_cast<std::int64_t>(m) * n, 2);
    const auto cb = to_host(dcb);
    EXPECT_TRUE(all_close(std::vector<float>(cb.begin() + static_cast<std::ptrdiff_t>(m) * n, cb.end()), c_ref,
                          1e-4, 1e-4));
  }
  EXPECT_EQ(t.current()[Category::workspace], kWorkspace);
  EXPECT_EQ(stats_of(*backend_).used_current, kWorkspace);
}

TEST_F(CudaTest, ReportsFreeDeviceMemory) {
  const std::int64_t before = backend_->device_free_bytes();
  std::printf("[device] free: %lld B\n", static_cast<long long>(before));
  EXPECT_GT(before, 0);
  Buffer b = backend_->alloc(Category::temp, 256u << 20);  // 1 GiB: the pool must grow
  backend_->synchronize();
  EXPECT_LT(backend_->device_free_bytes(), before);
}

// --comm mpi stages device buffers through the backend's staging memory: pinned on CUDA,
// untracked, kept between calls.
TEST_F(CudaTest, StagingMemoryIsPinnedAndUntracked) {
  float* h = backend_->staging(0, 1 << 16);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, h), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(backend_->staging(0, 16), h);
  EXPECT_EQ(backend_->tracker().current_total(), kWorkspace);
  Buffer d = to_device(std::vector<float>(1 << 16, 2.5f));
  backend_->download(h, d.data(), 1 << 16);
  EXPECT_EQ(h[(1 << 16) - 1], 2.5f);

  // A second slot is its own memory, and both carry data both ways at once.
  float* h1 = backend_->staging(1, 1 << 16);
  ASSERT_NE(h1, h);
  for (std::size_t i = 0; i < (1u << 16); ++i) h1[i] = static_cast<float>(i);
  backend_->upload(d.data(), h1, 1 << 16);
  backend_->download(h, d.data(), 1 << 16);
  EXPECT_EQ(h[12345], 12345.0f);
  EXPECT_EQ(h1[(1 << 16) - 1], static_cast<float>((1 << 16) - 1));

  // Growing a slot replaces its memory with a larger pinned block, still untracked.
  float* grown = backend_->staging(0, 1 << 20);
  ASSERT_EQ(cudaPointerGetAttributes(&attr, grown), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  Buffer big = to_device(std::vector<float>(1 << 20, -1.5f));
  backend_->download(grown, big.data(), 1 << 20);
  EXPECT_EQ(grown[(1 << 20) - 1], -1.5f);
  EXPECT_EQ(backend_->tracker().current_total(),
            kWorkspace + static_cast<std::int64_t>(((1 << 16) + (1 << 20)) * sizeof(float)));
}

TEST_F(CudaTest, RegistryMakesTheCudaBackend) {
  auto b = make_backend("cuda", 0);
  EXPECT_EQ(b->name(), "cuda");
  EXPECT_NE(dynamic_cast<CudaBackend*>(b.get()), nullptr);
}

TEST_F(CudaTest, NvtxRangesAreEmittedInTheShardscopeDomain) {
  backend_->range_push("warm-up");  // the process's NVTX tool is attached by now
  backend_->range_pop();
  if (!nvtx_counter_attached())
    GTEST_SKIP() << "another NVTX tool is injected (NVTX_INJECTION64_PATH), not the test's";
  const NvtxDomainCounts before = nvtx_counts("shardscope");
  {
    ScopedRange step(*backend_, "step 7");
    ScopedRange layer(*backend_, "layer 2");
    EXPECT_EQ(nvtx_counts("shardscope").last_message, "layer 2");
  }
  const NvtxDomainCounts after = nvtx_counts("shardscope");
  EXPECT_EQ(after.pushes - before.pushes, 2);
  EXPECT_EQ(after.pops - before.pops, 2);
  EXPECT_EQ(after.pushes, after.pops) << "every push is popped";
}

}  // namespace
}  // namespace shardscope::testing
