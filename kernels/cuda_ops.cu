// CUDA kernels of the CUDA backend; see cuda_ops.hpp. Element-wise math is the shared
// __host__ __device__ code of elementwise.hpp, so both backends compute the same thing.
#include "kernels/cuda_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "kernels/cuda_launch.hpp"
#include "kernels/elementwise.hpp"
#include "shardscope/cuda_check.hpp"

namespace shardscope::cuda_ops {
namespace {

__global__ void bias_activation_kernel(float* y, const float* bias, std::size_t n,
                                       std::size_t cols, bool relu) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float v = y[i];
    if (bias != nullptr) v += bias[i % cols];
    y[i] = relu ? math::relu(v) : v;
  }
}

__global__ void relu_backward_kernel(float* dz, const float* a, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dz[i] = math::relu_grad(dz[i], a[i]);
  }
}

// Block (32, 8): threadIdx.x walks 32 adjacent columns (coalesced rows), threadIdx.y
// strides the rows; the 8 partial sums of a column are added in a fixed order.
constexpr int kBiasGradCols = 32;
constexpr int kBiasGradRowLanes = 8;

__global__ void bias_grad_kernel(float* db, const float* dz, int rows, int cols, float beta) {
  __shared__ double partial[kBiasGradRowLanes][kBiasGradCols + 1];
  const int c = blockIdx.x * kBiasGradCols + threadIdx.x;
  double s = 0.0;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += kBiasGradRowLanes) {
      s += static_cast<double>(dz[static_cast<std::size_t>(r) * cols + c]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double total = 0.0;
    for (int k = 0; k < kBiasGradRowLanes; ++k) total += partial[k][threadIdx.x];
    const float sum = static_cast<float>(total);
    db[c] = beta == 0.0f ? sum : beta * db[c] + sum;
  }
}

// One block reduces the whole tensor: each thread strides over the elements, then a
// shared-memory tree in a fixed order. Deterministic, and the loss is one number per
// (micro-)batch, so a single block is ample.
constexpr int kLossThreads = 1024;

template <bool kMse>
__global__ void loss_value_kernel(const float* y, const float* target, std::size_t n,
                                  float scale, float* loss_out) {
  __shared__ double buf[kLossThreads];
  double s = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += kLossThreads) {
    if (kMse) {
      const double d = static_cast<double>(y[i]) - static_cast<double>(target[i]);
      s += d * d;
    } else {
      s += static_cast<double>(y[i]);
    }
  }
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kLossThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) buf[threadIdx.x] += buf[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double total = kMse ? buf[0] / static_cast<double>(n) : buf[0];
    loss_out[0] = static_cast<float>(static_cast<double>(scale) * total);
  }
}

__global__ void mse_grad_kernel(float* dy, const float* y, const float* target, std::size_t n,
                                float scale_over_n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dy[i] = math::mse_grad(y[i], target[i], scale_over_n);
  }
}

__global__ void fill_kernel(float* dst, float value, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}

__global__ void scale_kernel(float* x, float s, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

__global__ void add_kernel(float* dst, const float* src, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] += src[i];
  }
}

// ---- fused multi-tensor AdamW ----------------------------------------------------------
// Each tensor is cut into chunks of kAdamWChunk elements, one block per chunk. The batch
// of descriptors is a kernel parameter (about 2.3 KB, under the classic 4 KB limit).
constexpr int kAdamWChunk = 4096;
constexpr int kAdamWThreads = 256;

struct AdamWBatch {
  float* param[kAdamWTensorsPerLaunch];
  const float* grad[kAdamWTensorsPerLaunch];
  float* exp_avg[kAdamWTensorsPerLaunch];
  float* exp_avg_sq[kAdamWTensorsPerLaunch];
  long long n[kAdamWTensorsPerLaunch];
  math::AdamWScalars scalars[kAdamWTensorsPerLaunch];  // per tensor: each has its own step
  int block_begin[kAdamWTensorsPerLaunch + 1];  // first block of tensor t; [count] = total
  int count;
};

__global__ void adamw_kernel(AdamWBatch b) {
  const int block = static_cast<int>(blockIdx.x);
  int t = 0;
  while (t + 1 < b.count && block >= b.block_begin[t + 1]) ++t;
  const long long begin = static_cast<long long>(block - b.block_begin[t]) * kAdamWChunk;
  const long long end = begin + kAdamWChunk < b.n[t] ? begin + kAdamWChunk : b.n[t];
  float* __restrict__ p = b.param[t];
  const float* __restrict__ g = b.grad[t];
  float* __restrict__ m = b.exp_avg[t];
  float* __restrict__ v = b.exp_avg_sq[t];
  const math::AdamWScalars sc = b.scalars[t];
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float pi = p[i];
    float mi = m[i];
    float vi = v[i];
    math::adamw_update(pi, g[i], mi, vi, sc);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

void launch_adamw(const AdamWBatch& b, cudaStream_t stream) {
  if (b.count == 0) return;
  const int blocks = b.block_begin[b.count];
  adamw_kernel<<<blocks, kAdamWThreads, 0, stream>>>(b);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void bias_activation(float* y, const float* bias, int rows, int cols, Activation act,
                     cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols >= 0, "bias_activation: negative shape");
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (n == 0) return;
  bias_activation_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      y, bias, n, static_cast<std::size_t>(cols), act == Activation::relu);
  CUDA_CHECK_LAUNCH();
}

void relu_backward(float* dz, const float* a, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dz, a, n);
  CUDA_CHECK_LAUNCH();
}

void bias_grad(float* db, const float* dz, int rows, int cols, float beta, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols >= 0, "bias_grad: negative shape");
  if (cols == 0) return;
  const dim3 block(kBiasGradCols, kBiasGradRowLanes);
  const dim3 grid(static_cast<unsigned int>((cols + kBiasGradCols - 1) / kBiasGradCols));
  // rows == 0 still runs: db = beta * db (column sums of nothing are zero).
  bias_grad_kernel<<<grid, block, 0, stream>>>(db, dz, rows, cols, beta);
  CUDA_CHECK_LAUNCH();
}

void loss(Loss kind, const float* y, const float* target, float* dy, float* loss_out, int rows,
          int cols, float scale, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols >= 0, "loss: negative shape");
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (n == 0) {
    if (loss_out != nullptr) CUDA_CHECK(cudaMemsetAsync(loss_out, 0, sizeof(float), stream));
    return;
  }
  if (kind == Loss::sum) {
    if (loss_out != nullptr) {
      SHARDSCOPE_REQUIRE(y != nullptr, "loss: the sum's value needs y");
      loss_value_kernel<false><<<1, kLossThreads, 0, stream>>>(y, nullptr, n, scale, loss_out);
      CUDA_CHECK_LAUNCH();
    }
    if (dy != nullptr) fill(dy, scale, n, stream);  // d(scale * sum(y))/dy = scale; y unused
    return;
  }
  if (loss_out == nullptr && dy == nullptr) return;
  SHARDSCOPE_REQUIRE(y != nullptr && target != nullptr, "loss: mse needs y and a target");
  if (loss_out != nullptr) {
    loss_value_kernel<true><<<1, kLossThreads, 0, stream>>>(y, target, n, scale, loss_out);
    CUDA_CHECK_LAUNCH();
  }
  if (dy != nullptr) {
    // As the host reference: the ratio in double, then fp32.
    const auto scale_over_n =
        static_cast<float>(static_cast<double>(scale) / static_cast<double>(n));
    mse_grad_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dy, y, target, n, scale_over_n);
    CUDA_CHECK_LAUNCH();
  }
}

void adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors, cudaStream_t stream) {
  AdamWBatch b{};
  b.count = 0;
  b.block_begin[0] = 0;
  for (const AdamWTensor& t : tensors) {
    if (t.n == 0) continue;
    SHARDSCOPE_REQUIRE(t.step >= 1, "adamw: step must be >= 1 (the step after increment)");
    const long long chunks = static_cast<long long>((t.n + kAdamWChunk - 1) / kAdamWChunk);
    // Block indices are int: keep every launch well under 2^31 blocks.
    constexpr long long kMaxBlocksPerLaunch = 1LL << 30;
    SHARDSCOPE_REQUIRE(chunks < kMaxBlocksPerLaunch,
                       "adamw: tensor of " + std::to_string(t.n) + " elements is too large");
    if (b.count == kAdamWTensorsPerLaunch || b.block_begin[b.count] + chunks > kMaxBlocksPerLaunch) {
      launch_adamw(b, stream);
      b.count = 0;
      b.block_begin[0] = 0;
    }
    const int i = b.count;
    b.param[i] = t.param;
    b.grad[i] = t.grad;
    b.exp_avg[i] = t.exp_avg;
    b.exp_avg_sq[i] = t.exp_avg_sq;
    b.n[i] = static_cast<long long>(t.n);
    // As torch computes them: in double (Python floats), then used in fp32 math.
    b.scalars[i] = math::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, t.step);
    b.block_begin[i + 1] = b.block_begin[i] + static_cast<int>(chunks);
    b.count = i + 1;
  }
  launch_adamw(b, stream);
}

void fill(float* dst, float value, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, value, n);
  CUDA_CHECK_LAUNCH();
}

void scale(float* x, float s, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, s, n);
  CUDA_CHECK_LAUNCH();
}

void add(float* dst, const float* src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace shardscope::cuda_ops
