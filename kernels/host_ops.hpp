// Host implementations of every backend kernel, with the same signatures as the
// Backend's math (backend.hpp). The CPU backend calls them (GEMM by cblas_sgemm when
// OpenBLAS is built in, else `gemm_loops`), and the tests use them as the reference
// for the CUDA kernels. Row-major fp32.
#pragma once

#include <cstddef>
#include <vector>

#include "shardscope/kernel_args.hpp"

namespace shardscope::host {

// C(m,n) = alpha * op(A) op(B) + beta * C with plain loops (reference; no BLAS).
void gemm_loops(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                const float* b, int ldb, float beta, float* c, int ldc);
// C(m,n) by cblas_sgemm when built with OpenBLAS, else gemm_loops.
void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);
void bias_activation(float* y, const float* bias, int rows, int cols, Activation act);
void relu_backward(float* dz, const float* a, std::size_t n);
void bias_grad(float* db, const float* dz, int rows, int cols, float beta);
void loss(Loss kind, const float* y, const float* target, float* dy, float* loss_out, int rows,
          int cols, float scale);
void adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors);

}  // namespace shardscope::host
