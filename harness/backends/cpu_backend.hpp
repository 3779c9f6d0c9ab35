// The CPU backend (docs/design.md §5): host memory through the tracking allocator, GEMM by
// OpenBLAS's cblas_sgemm on one thread per rank (plain loops without OpenBLAS), and
// the element-wise math of kernels/host_ops.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/backend.hpp"

namespace shardscope {

class CpuBackend : public Backend {
 public:
  // Allocations are aligned to (and rounded up to) this many bytes.
  static constexpr std::int64_t kAlignment = 64;

  // Sets OpenBLAS to one thread: every rank is its own process and owns one core.
  CpuBackend();

  std::string name() const override { return "cpu"; }

  void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override;
  void bias_activation(float* y, const float* bias, int rows, int cols, Activation act) override;
  void relu_backward(float* dz, const float* a, std::size_t n) override;
  void bias_grad(float* db, const float* dz, int rows, int cols, float beta) override;
  void loss(Loss kind, const float* y, const float* target, float* dy, float* loss_out, int rows,
            int cols, float scale) override;
  void adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors) override;
  void copy(float* dst, const float* src, std::size_t n) override;
  void fill(float* dst, float value, std::size_t n) override;
  void scale(float* x, float s, std::size_t n) override;
  void add(float* dst, const float* src, std::size_t n) override;

  void upload(float* dst, const float* host, std::size_t n) override;
  void download(float* host, const float* src, std::size_t n) override;
  void synchronize() override {}

  // Bytes rounded up to kAlignment: what aligned_alloc really reserves for the request.
  std::int64_t rounded_bytes(std::int64_t bytes) const override;

 protected:
  void* raw_alloc(std::size_t bytes) override;
  void raw_free(void* p, std::size_t bytes) noexcept override;
};

}  // namespace shardscope
