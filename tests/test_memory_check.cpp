// The check before a run allocates (harness/run/memory_check): a device backend's free
// memory already lacks what the backend holds from its start (cuBLAS's workspace on cuda),
// so the predicted peak, which counts that workspace too, is compared less those bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "harness/run/memory_check.hpp"
#include "shardscope/check.hpp"
#include "shardscope/format.hpp"
#include "support/mathless_backend.hpp"

namespace shardscope {
namespace {

// A device-like backend: it holds a workspace of category workspace from its start, as
// the CUDA backend does, and reports a fixed figure of free device memory, the figure
// cudaMemGetInfo gives after that workspace was taken from it.
class DeviceLikeBackend final : public testing::MathlessBackend {
 public:
  DeviceLikeBackend(std::int64_t workspace_bytes, std::int64_t free_bytes) : free_(free_bytes) {
    workspace_ = alloc(Category::workspace, static_cast<std::size_t>(workspace_bytes) / sizeof(float));
  }
  ~DeviceLikeBackend() override { workspace_.reset(); }
  std::string name() const override { return "device-like"; }
  std::int64_t device_free_bytes() override { return free_; }
  void copy(float* dst, const float* src, std::size_t n) override { std::memmove(dst, src, n * sizeof(float)); }
  void fill(float* dst, float v, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) dst[i] = v;
  }
  void upload(float* dst, const float* host, std::size_t n) override { std::memcpy(dst, host, n * sizeof(float)); }
  void download(float* host, const float* src, std::size_t n) override { std::memcpy(host, src, n * sizeof(float)); }
  void synchronize() override {}

 private:
  std::int64_t free_;
  Buffer workspace_;
};

constexpr std::int64_t kWorkspace = std::int64_t{1} << 20;  // 1 MiB
constexpr std::int64_t kFree = std::int64_t{10} << 20;      // 10 MiB

TEST(MemoryCheck, TheWorkspaceAlreadyHeldIsNotCountedTwice) {
  DeviceLikeBackend backend(kWorkspace, kFree);
  ASSERT_EQ(backend.tracker().current().total(), kWorkspace);
  // A peak of every free byte plus the workspace it counts: exactly what the device can hold.
  const std::int64_t peak = kFree + kWorkspace;
  EXPECT_EQ(bytes_to_allocate(peak, backend), kFree);
  EXPECT_NO_THROW(check_memory(peak, backend, 0));
}

TEST(MemoryCheck, OneByteMoreIsRefusedNamingWhatIsLeftToAllocate) {
  DeviceLikeBackend backend(kWorkspace, kFree);
  const std::int64_t peak = kFree + kWorkspace + 1;
  EXPECT_EQ(bytes_to_allocate(peak, backend), kFree + 1);
  try {
    check_memory(peak, backend, 3);
    FAIL() << "a peak one byte above the device's free memory plus the workspace held was accepted";
  } catch (const RunError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("rank 3: predicted peak " + format_bytes(peak) + " less the " + format_bytes(kWorkspace) +
                        " already held (" + format_bytes(kFree + 1) + " to allocate) exceeds the free device memory " +
                        format_bytes(kFree)),
              std::string::npos)
        << text;
  }
}

TEST(MemoryCheck, NothingHeldComparesThePeakItself) {
  DeviceLikeBackend backend(0, kFree);
  EXPECT_EQ(bytes_to_allocate(kFree, backend), kFree);
  EXPECT_NO_THROW(check_memory(kFree, backend, 0));
  try {
    check_memory(kFree + 1, backend, 0);
    FAIL() << "a peak one byte above the free device memory was accepted";
  } catch (const RunError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("rank 0: predicted peak " + format_bytes(kFree + 1) + " exceeds the free device memory"),
              std::string::npos)
        << text;
  }
}

}  // namespace
}  // namespace shardscope
