// CUDA kernels of --precision bf16: the math and signatures of the host ones
// (kernels/host_bf16.hpp), plus the stream. Device pointers; asynchronous; each launch
// checked. The GEMM is the backend's (cublasGemmEx, CUDA_R_16BF inputs, CUBLAS_COMPUTE_32F).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "shardscope/dtype.hpp"
#include "shardscope/kernel_args.hpp"

namespace shardscope::cuda_ops {

void cast_to_bf16(Bf16* dst, const float* src, std::size_t n, cudaStream_t stream);
void cast_from_bf16(float* dst, const Bf16* src, std::size_t n, float beta, cudaStream_t stream);
void bias_activation_bf16(Bf16* y, const Bf16* bias, int rows, int cols, Activation act, cudaStream_t stream);
void relu_backward_bf16(Bf16* dz, const Bf16* a, std::size_t n, cudaStream_t stream);
void bias_grad_bf16(Bf16* db, const Bf16* dz, int rows, int cols, cudaStream_t stream);
void fill_bf16(Bf16* dst, float value, std::size_t n, cudaStream_t stream);
// out[0] = scale * sum(x): one block, a fixed order (deterministic), fp32.
void sum_bf16(float* out, const Bf16* x, std::size_t n, float scale, cudaStream_t stream);

}  // namespace shardscope::cuda_ops
