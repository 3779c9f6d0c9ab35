// CUDA bf16 kernels (cuda_bf16.hpp): __nv_bfloat16 holds Bf16's bits; conversions round
// to nearest even (__float2bfloat16_rn), as the host's to_bf16.
#include "kernels/cuda_bf16.hpp"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda_launch.hpp"
#include "shardscope/cuda_check.hpp"

namespace shardscope::cuda_ops {
namespace {

__nv_bfloat16* nv(Bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
const __nv_bfloat16* nv(const Bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

__global__ void to_bf16_kernel(__nv_bfloat16* dst, const float* src, std::size_t n) {
  SS_GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void from_bf16_kernel(float* dst, const __nv_bfloat16* src, std::size_t n, float beta) {
  SS_GRID_STRIDE(i, n) dst[i] = (beta == 0.0f ? 0.0f : beta * dst[i]) + __bfloat162float(src[i]);
}

__global__ void bias_activation_bf16_kernel(__nv_bfloat16* y, const __nv_bfloat16* bias, std::size_t n,
                                            std::size_t cols, bool relu) {
  SS_GRID_STRIDE(i, n) {
    float v = __bfloat162float(y[i]);
    if (bias != nullptr) v += __bfloat162float(bias[i % cols]);
    if (relu && !(v > 0.0f)) v = 0.0f;
    y[i] = __float2bfloat16_rn(v);
  }
}

__global__ void relu_backward_bf16_kernel(__nv_bfloat16* dz, const __nv_bfloat16* a, std::size_t n) {
  SS_GRID_STRIDE(i, n) {
    if (!(__bfloat162float(a[i]) > 0.0f)) dz[i] = __float2bfloat16_rn(0.0f);
  }
}

// One thread a column, summing its rows in fp32 in order (deterministic).
__global__ void bias_grad_bf16_kernel(__nv_bfloat16* db, const __nv_bfloat16* dz, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int r = 0; r < rows; ++r) s += __bfloat162float(dz[static_cast<std::size_t>(r) * cols + c]);
  db[c] = __float2bfloat16_rn(s);
}

__global__ void fill_bf16_kernel(__nv_bfloat16* dst, float value, std::size_t n) {
  const __nv_bfloat16 v = __float2bfloat16_rn(value);
  SS_GRID_STRIDE(i, n) dst[i] = v;
}

__global__ void sum_bf16_kernel(float* out, const __nv_bfloat16* x, std::size_t n, float scale) {
  __shared__ float partial[kThreads];
  float s = 0.0f;
  for (std::size_t i = threadIdx.x; i < n; i += kThreads) s += __bfloat162float(x[i]);
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = scale * partial[0];
}


}  // namespace

void cast_to_bf16(Bf16* dst, const float* src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(nv(dst), src, n);
  CUDA_CHECK_LAUNCH();
}

void cast_from_bf16(float* dst, const Bf16* src, std::size_t n, float beta, cudaStream_t stream) {
  if (n == 0) return;
  from_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, nv(src), n, beta);
  CUDA_CHECK_LAUNCH();
}

void bias_activation_bf16(Bf16* y, const Bf16* bias, int rows, int cols, Activation act, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  if (n == 0) return;
  bias_activation_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(nv(y), nv(bias), n, static_cast<std::size_t>(cols),
                                                                      act == Activation::relu);
  CUDA_CHECK_LAUNCH();
}

void relu_backward_bf16(Bf16* dz, const Bf16* a, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_backward_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(nv(dz), nv(a), n);
  CUDA_CHECK_LAUNCH();
}

void bias_grad_bf16(Bf16* db, const Bf16* dz, int rows, int cols, cudaStream_t stream) {
  if (cols == 0) return;
  const unsigned int blocks = static_cast<unsigned int>((cols + kThreads - 1) / kThreads);
  bias_grad_bf16_kernel<<<blocks, kThreads, 0, stream>>>(nv(db), nv(dz), rows, cols);
  CUDA_CHECK_LAUNCH();
}

void fill_bf16(Bf16* dst, float value, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(nv(dst), value, n);
  CUDA_CHECK_LAUNCH();
}

void sum_bf16(float* out, const Bf16* x, std::size_t n, float scale, cudaStream_t stream) {
  sum_bf16_kernel<<<1, kThreads, 0, stream>>>(out, nv(x), n, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace shardscope::cuda_ops
