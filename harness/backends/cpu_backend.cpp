#include "harness/backends/cpu_backend.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/host_ops.hpp"

#ifdef SHARDSCOPE_WITH_BLAS
// OpenBLAS's cblas.h declares it, netlib's does not; an identical redeclaration is legal.
extern "C" void openblas_set_num_threads(int num_threads);
#endif

namespace shardscope {

CpuBackend::CpuBackend() {
#ifdef SHARDSCOPE_WITH_BLAS
  openblas_set_num_threads(1);
#endif
}

void CpuBackend::gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a,
                      int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  host::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CpuBackend::bias_activation(float* y, const float* bias, int rows, int cols,
                                 Activation act) {
  host::bias_activation(y, bias, rows, cols, act);
}

void CpuBackend::relu_backward(float* dz, const float* a, std::size_t n) {
  host::relu_backward(dz, a, n);
}

void CpuBackend::bias_grad(float* db, const float* dz, int rows, int cols, float beta) {
  host::bias_grad(db, dz, rows, cols, beta);
}

void CpuBackend::loss(Loss kind, const float* y, const float* target, float* dy,
                      float* loss_out, int rows, int cols, float scale) {
  host::loss(kind, y, target, dy, loss_out, rows, cols, scale);
}

void CpuBackend::adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors) {
  host::adamw(h, tensors);
}

// memcpy with a null pointer is undefined even for zero bytes, and empty Buffers
// (count 0) hold a null pointer: hence the guards.
void CpuBackend::copy(float* dst, const float* src, std::size_t n) {
  if (n != 0) std::memcpy(dst, src, n * sizeof(float));
}

void CpuBackend::fill(float* dst, float value, std::size_t n) { std::fill_n(dst, n, value); }

void CpuBackend::scale(float* x, float s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= s;
}

void CpuBackend::add(float* dst, const float* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
}

void CpuBackend::upload(float* dst, const float* host, std::size_t n) {
  if (n != 0) std::memcpy(dst, host, n * sizeof(float));
}

void CpuBackend::download(float* host, const float* src, std::size_t n) {
  if (n != 0) std::memcpy(host, src, n * sizeof(float));
}

std::int64_t CpuBackend::rounded_bytes(std::int64_t bytes) const {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

// aligned_alloc wants the size to be a multiple of the alignment.
void* CpuBackend::raw_alloc(std::size_t bytes) {
  const auto rounded = static_cast<std::size_t>(rounded_bytes(static_cast<std::int64_t>(bytes)));
  return std::aligned_alloc(static_cast<std::size_t>(kAlignment), rounded);
}

void CpuBackend::raw_free(void* p, std::size_t /*bytes*/) noexcept { std::free(p); }

}  // namespace shardscope
