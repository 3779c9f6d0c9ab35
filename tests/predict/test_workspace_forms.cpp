// A backend's own resident bytes (harness/predict/workspace_forms.hpp): cuBLAS's 32 MiB
// workspace on cuda, nothing on cpu, added once to a rank's resting bytes and its peak.
#include <gtest/gtest.h>

#include "harness/backends/cpu_backend.hpp"
#include "harness/predict/workspace_forms.hpp"

namespace shardscope {
namespace {

TEST(WorkspaceForms, CudaHoldsCublasWorkspaceCpuNothing) {
  // NVIDIA's advice for Hopper (cublasSetWorkspace): 32 MiB.
  EXPECT_EQ(kCudaWorkspaceBytes, 33'554'432);
  EXPECT_EQ(backend_workspace_bytes("cuda"), 33'554'432);
  EXPECT_EQ(backend_workspace_bytes("cpu"), 0);
  EXPECT_EQ(backend_workspace_bytes(""), 0);
}

Prediction sample_prediction() {
  Prediction p;
  p.resting[Category::param] = 1000;
  p.resting[Category::grad] = 1000;
  p.peak_by_category[Category::param] = 1000;
  p.peak_by_category[Category::grad] = 1000;
  p.peak_by_category[Category::activation] = 500;
  p.peak_total = 2500;
  return p;
}

TEST(WorkspaceForms, AddsTheWorkspaceToRestAndPeakOnCudaOnly) {
  Prediction cpu = sample_prediction();
  add_backend_workspace(cpu, "cpu");
  EXPECT_EQ(cpu.resting, sample_prediction().resting);
  EXPECT_EQ(cpu.peak_by_category, sample_prediction().peak_by_category);
  EXPECT_EQ(cpu.peak_total, 2500);

  Prediction cuda = sample_prediction();
  add_backend_workspace(cuda, "cuda");
  EXPECT_EQ(cuda.resting.total(), 2000 + 33'554'432);
  EXPECT_EQ(cuda.resting[Category::workspace], 33'554'432);
  EXPECT_EQ(cuda.peak_by_category[Category::workspace], 33'554'432);
  EXPECT_EQ(cuda.peak_total, 2500 + 33'554'432);
  EXPECT_EQ(cuda.peak_by_category.total(), cuda.peak_total);

  // A peak without a closed form stays without one (zero, not a prediction).
  Prediction unknown;
  unknown.peak_known = false;
  add_backend_workspace(unknown, "cuda");
  EXPECT_EQ(unknown.resting[Category::workspace], 33'554'432);
  EXPECT_EQ(unknown.peak_total, 0);

  StageForms stage;
  stage.resting[Category::param] = 10;
  stage.peak[Category::param] = 10;
  add_backend_workspace(stage, "cuda");
  EXPECT_EQ(stage.resting.total(), 10 + 33'554'432);
  EXPECT_EQ(stage.peak.total(), 10 + 33'554'432);
}

// The CPU backend holds no workspace: none reported, none tracked, before and after math.
TEST(WorkspaceForms, TheCpuBackendHoldsNoWorkspace) {
  CpuBackend be;
  EXPECT_EQ(be.workspace_bytes(), 0);
  EXPECT_EQ(be.tracker().current()[Category::workspace], 0);
  EXPECT_EQ(be.tracker().current_total(), 0);
  Buffer a = be.alloc(Category::param, 4), c = be.alloc(Category::temp, 4);
  be.fill(a.data(), 1.0f, 4);
  be.gemm(Trans::no, Trans::no, 2, 2, 2, 1.0f, a.data(), 2, a.data(), 2, 0.0f, c.data(), 2);
  be.synchronize();
  EXPECT_EQ(be.tracker().current()[Category::workspace], 0);
  EXPECT_EQ(be.tracker().peak().by_category[Category::workspace], 0);
}

}  // namespace
}  // namespace shardscope
