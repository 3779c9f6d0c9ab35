// CUDA kernels of the CUDA backend (docs/design.md §5): the same math and signatures as the host
// reference (kernels/host_ops.hpp), plus the stream to enqueue on. Every function is
// asynchronous; each launch is followed by a cudaGetLastError check (CUDA_CHECK_LAUNCH)
// and throws RunError on failure. All pointers are device pointers; row-major fp32.
// Element-wise math comes from kernels/elementwise.hpp (shared with the CPU backend).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "shardscope/kernel_args.hpp"

namespace shardscope::cuda_ops {

// y(rows, cols) += bias(cols), then the activation, in place.
void bias_activation(float* y, const float* bias, int rows, int cols, Activation act,
                     cudaStream_t stream);
// dz(n) *= (a > 0).
void relu_backward(float* dz, const float* a, std::size_t n, cudaStream_t stream);
// db(cols) = beta * db + column sums of dz(rows, cols). beta == 0 overwrites db without
// reading it (BLAS convention), so db may hold garbage then. Sums accumulate in double,
// in a fixed order (deterministic).
void bias_grad(float* db, const float* dz, int rows, int cols, float beta, cudaStream_t stream);
// loss_out[0] (device) = scale * loss(y, target) when loss_out != nullptr; dy =
// d(scale * loss)/dy when dy != nullptr (for `sum`, y may then be null: dy = scale).
// The loss value is reduced in double by one block in a fixed order (deterministic).
void loss(Loss kind, const float* y, const float* target, float* dy, float* loss_out, int rows,
          int cols, float scale, cudaStream_t stream);
// torch.optim.AdamW over every tensor in the list, multi-tensor style: the list is cut
// into batches of up to kAdamWTensorsPerLaunch tensors whose descriptors travel by value
// as a kernel parameter (as PyTorch's multi_tensor_apply does), one launch per batch.
inline constexpr int kAdamWTensorsPerLaunch = 32;
void adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors, cudaStream_t stream);
void fill(float* dst, float value, std::size_t n, cudaStream_t stream);
void scale(float* x, float s, std::size_t n, cudaStream_t stream);
// dst += src
void add(float* dst, const float* src, std::size_t n, cudaStream_t stream);

}  // namespace shardscope::cuda_ops
