// CUDA kernels of the transformer math; see cuda_transformer.hpp for the reductions'
// order and determinism, backend.hpp for each kernel's semantics.
#include "kernels/cuda_transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "kernels/cuda_launch.hpp"
#include "kernels/cuda_ops.hpp"
#include "kernels/elementwise.hpp"
#include "shardscope/cuda_check.hpp"

namespace shardscope::cuda_ops {
namespace {

// One block per row (norms, softmax); rows beyond the grid are strided.
constexpr int kRowThreads = 256;
constexpr std::int64_t kMaxRowBlocks = 65535;

unsigned int row_blocks(std::int64_t rows) {
  return static_cast<unsigned int>(std::min(rows, kMaxRowBlocks));
}

#define SS_ROW_STRIDE(row, rows) \
  for (std::int64_t row = blockIdx.x; row < (rows); row += gridDim.x)

// ---- block reductions (blockDim.x a multiple of 32, at most 1024) --------------------
// Every thread gets the same result: a butterfly within each warp (commutative, so all
// lanes agree), then the warps' partials combined in warp order. `scratch` holds 32 floats;
// the leading barrier lets consecutive calls reuse it.
__device__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) r += scratch[w];
  return r;
}

__device__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) r = fmaxf(r, scratch[w]);
  return r;
}

// ---- element-wise: GELU and SiLU are elementwise.hpp's, the host's own code (CUDA's expf
// and tanhf on the device) ---------------------------------------------------------------
__global__ void gelu_tanh_forward_kernel(float* y, const float* x, std::size_t n) {
  SS_GRID_STRIDE(i, n) y[i] = math::gelu_tanh(x[i]);
}
__global__ void gelu_tanh_backward_kernel(float* dx, const float* dy, const float* x, std::size_t n) {
  SS_GRID_STRIDE(i, n) dx[i] = math::gelu_tanh_grad(dy[i], x[i]);
}
__global__ void silu_forward_kernel(float* y, const float* x, std::size_t n) {
  SS_GRID_STRIDE(i, n) y[i] = math::silu(x[i]);
}
__global__ void silu_backward_kernel(float* dx, const float* dy, const float* x, std::size_t n) {
  SS_GRID_STRIDE(i, n) dx[i] = math::silu_grad(dy[i], x[i]);
}
__global__ void mul_kernel(float* out, const float* a, const float* b, std::size_t n) {
  SS_GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}

// ---- embeddings ------------------------------------------------------------------------
__global__ void embedding_forward_kernel(float* out, const std::int64_t* ids, const float* table,
                                         std::size_t n, std::size_t dim) {
  SS_GRID_STRIDE(i, n) {
    const std::size_t row = i / dim;
    out[i] = table[static_cast<std::size_t>(ids[row]) * dim + i % dim];
  }
}

// dtable already holds beta * dtable; adds each token's dy row at its id. An id outside
// [0, vocab) is a bug upstream: the kernel traps, and the next CUDA check reports it.
__global__ void embedding_scatter_kernel(float* dtable, const std::int64_t* ids, const float* dy,
                                         std::size_t n, std::size_t dim, std::int64_t vocab) {
  SS_GRID_STRIDE(i, n) {
    const std::int64_t id = ids[i / dim];
    if (id < 0 || id >= vocab) __trap();
    atomicAdd(&dtable[static_cast<std::size_t>(id) * dim + i % dim], dy[i]);
  }
}

__global__ void add_positions_kernel(float* out, const float* pos, std::size_t n,
                                     std::size_t per_sequence) {
  SS_GRID_STRIDE(i, n) out[i] += pos[i % per_sequence];
}

// ---- norms -------------------------------------------------------------------------------
__global__ void layer_norm_forward_kernel(float* y, float* mean, float* rstd, const float* x,
                                          const float* gamma, const float* bias, int rows, int dim,
                                          float eps) {
  __shared__ float scratch[32];
  SS_ROW_STRIDE(row, rows) {
    const float* xr = x + row * dim;
    float s = 0.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) s += xr[d];
    const float m = block_sum(s, scratch) / static_cast<float>(dim);
    float v = 0.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
      const float c = xr[d] - m;
      v += c * c;
    }
    const float var = block_sum(v, scratch) / static_cast<float>(dim);
    const float rs = 1.0f / sqrtf(var + eps);
    float* yr = y + row * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
      const float out = (xr[d] - m) * rs * gamma[d];
      yr[d] = bias != nullptr ? out + bias[d] : out;
    }
    if (threadIdx.x == 0) {
      mean[row] = m;
      rstd[row] = rs;
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, xhat = (x - mean) * rstd;
// RMSNorm is the same without the mean (mean == nullptr: xhat = x * rstd, no mean(g) term).
__global__ void norm_backward_dx_kernel(float* dx, const float* dy, const float* x,
                                        const float* mean, const float* rstd, const float* gamma,
                                        int rows, int dim) {
  __shared__ float scratch[32];
  SS_ROW_STRIDE(row, rows) {
    const std::size_t base = static_cast<std::size_t>(row) * dim;
    const float m = mean != nullptr ? mean[row] : 0.0f;
    const float rs = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
      const float g = dy[base + d] * gamma[d];
      sg += g;
      sgx += g * ((x[base + d] - m) * rs);
    }
    const float mean_g = mean != nullptr ? block_sum(sg, scratch) / static_cast<float>(dim) : 0.0f;
    const float mean_gx = block_sum(sgx, scratch) / static_cast<float>(dim);
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
      const float g = dy[base + d] * gamma[d];
      const float xhat = (x[base + d] - m) * rs;
      dx[base + d] = rs * (g - mean_g - xhat * mean_gx);
    }
  }
}

// dgamma(dim) = beta * dgamma + sum over rows of dy * xhat, as bias_grad's kernel: block
// (32, 8), 32 adjacent columns, 8 row lanes summed in double and combined in a fixed order.
constexpr int kColSumCols = 32;
constexpr int kColSumRowLanes = 8;

__global__ void norm_gamma_grad_kernel(float* dgamma, const float* dy, const float* x,
                                       const float* mean, const float* rstd, int rows, int dim,
                                       float beta) {
  __shared__ double partial[kColSumRowLanes][kColSumCols + 1];
  const int c = blockIdx.x * kColSumCols + threadIdx.x;
  double s = 0.0;
  if (c < dim) {
    for (int r = threadIdx.y; r < rows; r += kColSumRowLanes) {
      const std::size_t i = static_cast<std::size_t>(r) * dim + c;
      const float m = mean != nullptr ? mean[r] : 0.0f;
      s += static_cast<double>(dy[i] * ((x[i] - m) * rstd[r]));
    }
  }
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < dim) {
    double total = 0.0;
    for (int k = 0; k < kColSumRowLanes; ++k) total += partial[k][threadIdx.x];
    const float sum = static_cast<float>(total);
    dgamma[c] = beta == 0.0f ? sum : beta * dgamma[c] + sum;
  }
}

__global__ void rms_norm_forward_kernel(float* y, float* rstd, const float* x, const float* gamma,
                                        int rows, int dim, float eps) {
  __shared__ float scratch[32];
  SS_ROW_STRIDE(row, rows) {
    const float* xr = x + row * dim;
    float s = 0.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) s += xr[d] * xr[d];
    const float rs = 1.0f / sqrtf(block_sum(s, scratch) / static_cast<float>(dim) + eps);
    float* yr = y + row * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) yr[d] = xr[d] * rs * gamma[d];
    if (threadIdx.x == 0) rstd[row] = rs;
  }
}

// ---- rotary embedding (Hugging Face's rotate_half) --------------------------------------
// One thread per (token, head, pair i < head_dim / 2). The angle is computed in fp32 as
// Hugging Face does: inv_freq = 1 / theta^(2i / head_dim), angle = pos * inv_freq.
__global__ void rope_kernel(float* x, int ld, int seq, int heads, int head_dim, float theta,
                            bool inverse, std::size_t n) {
  const int half = head_dim / 2;
  SS_GRID_STRIDE(idx, n) {
    const int i = static_cast<int>(idx % half);
    const int h = static_cast<int>((idx / half) % heads);
    const std::size_t row = idx / (static_cast<std::size_t>(half) * heads);
    const int pos = static_cast<int>(row % seq);
    const float inv_freq =
        1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
    const float angle = static_cast<float>(pos) * inv_freq;
    const float c = cosf(angle);
    const float s = inverse ? -sinf(angle) : sinf(angle);
    float* p = x + row * ld + static_cast<std::size_t>(h) * head_dim;
    const float x1 = p[i], x2 = p[i + half];
    p[i] = x1 * c - x2 * s;
    p[i + half] = x2 * c + x1 * s;
  }
}

// ---- softmax ---------------------------------------------------------------------------
// Row r of the count * seq rows is row i = r % seq of its matrix.
__global__ void causal_softmax_kernel(float* p, std::int64_t rows, int seq, float scale) {
  __shared__ float scratch[32];
  SS_ROW_STRIDE(row, rows) {
    float* pr = p + row * seq;
    const int i = static_cast<int>(row % seq);
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, scale * pr[j]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
      const float e = expf(scale * pr[j] - m);
      pr[j] = e;
      s += e;
    }
    s = block_sum(s, scratch);
    for (int j = threadIdx.x; j < seq; j += blockDim.x) pr[j] = j <= i ? pr[j] / s : 0.0f;
  }
}

__global__ void softmax_backward_kernel(float* dp, const float* p, std::int64_t rows, int cols) {
  __shared__ float scratch[32];
  SS_ROW_STRIDE(row, rows) {
    float* dr = dp + row * cols;
    const float* pr = p + row * cols;
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += dr[j] * pr[j];
    s = block_sum(s, scratch);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) dr[j] = pr[j] * (dr[j] - s);
  }
}

// Head-major index i = ((b * heads + h) * seq + s) * head_dim + d; token-major offset
// (b * seq + s) * ld + h * head_dim + d.
__global__ void permute_heads_kernel(float* dst, const float* src, int ld, int seq, int heads,
                                     int head_dim, bool to_heads, std::size_t n) {
  SS_GRID_STRIDE(i, n) {
    const std::size_t d = i % head_dim;
    const std::size_t s = (i / head_dim) % seq;
    const std::size_t h = (i / (static_cast<std::size_t>(head_dim) * seq)) % heads;
    const std::size_t b = i / (static_cast<std::size_t>(head_dim) * seq * heads);
    const std::size_t t = (b * seq + s) * ld + h * head_dim + d;
    if (to_heads) {
      dst[i] = src[t];
    } else {
      dst[t] = src[i];
    }
  }
}

// ---- cross-entropy -----------------------------------------------------------------------
__global__ void log_softmax_kernel(float* logprobs, const float* logits, std::int64_t rows, int cols) {
  __shared__ float scratch[32];
  SS_ROW_STRIDE(row, rows) {
    const float* xr = logits + row * cols;
    float* yr = logprobs + row * cols;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - m);
    const float lse = logf(block_sum(s, scratch));
    for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = xr[j] - m - lse;
  }
}

// One block sums -logprobs(i, targets[i]) in double in a fixed order (deterministic). A
// target outside [0, cols) is a bug upstream: the kernel traps.
constexpr int kLossThreads = 1024;

__global__ void nll_loss_kernel(float* loss_out, const float* logprobs, const std::int64_t* targets,
                                std::int64_t rows, int cols, float scale) {
  __shared__ double buf[kLossThreads];
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < rows; i += kLossThreads) {
    const std::int64_t t = targets[i];
    if (t < 0 || t >= cols) __trap();
    s -= static_cast<double>(logprobs[i * cols + t]);
  }
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kLossThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) buf[threadIdx.x] += buf[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    loss_out[0] = static_cast<float>(static_cast<double>(scale) * (buf[0] / static_cast<double>(rows)));
  }
}

__global__ void cross_entropy_backward_kernel(float* dlogits, const float* logprobs,
                                              const std::int64_t* targets, std::size_t n, int cols,
                                              float scale_over_rows) {
  SS_GRID_STRIDE(i, n) {
    // torch's order (log_softmax's backward of nll's gradient): f exp(logprobs), less f
    // at the target.
    const std::int64_t col = static_cast<std::int64_t>(i % cols);
    const float at_target = targets[i / cols] == col ? scale_over_rows : 0.0f;
    dlogits[i] = scale_over_rows * expf(logprobs[i]) - at_target;
  }
}

void launch_gamma_grad(float* dgamma, const float* dy, const float* x, const float* mean,
                       const float* rstd, int rows, int dim, float beta, cudaStream_t stream) {
  const dim3 block(kColSumCols, kColSumRowLanes);
  const dim3 grid(static_cast<unsigned int>((dim + kColSumCols - 1) / kColSumCols));
  norm_gamma_grad_kernel<<<grid, block, 0, stream>>>(dgamma, dy, x, mean, rstd, rows, dim, beta);
  CUDA_CHECK_LAUNCH();
}

std::size_t count(std::int64_t a, std::int64_t b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
}

}  // namespace

// ---- element-wise ------------------------------------------------------------------------

void gelu_tanh_forward(float* y, const float* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_tanh_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  CUDA_CHECK_LAUNCH();
}

void gelu_tanh_backward(float* dx, const float* dy, const float* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_tanh_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dx, dy, x, n);
  CUDA_CHECK_LAUNCH();
}

void silu_forward(float* y, const float* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  silu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  CUDA_CHECK_LAUNCH();
}

void silu_backward(float* dx, const float* dy, const float* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  silu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dx, dy, x, n);
  CUDA_CHECK_LAUNCH();
}

void mul(float* out, const float* a, const float* b, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  mul_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, a, b, n);
  CUDA_CHECK_LAUNCH();
}

// ---- embeddings ------------------------------------------------------------------------

void embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                       cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && dim >= 0, "embedding_forward: negative shape");
  const std::size_t n = count(rows, dim);
  if (n == 0) return;
  embedding_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, ids, table, n,
                                                                   static_cast<std::size_t>(dim));
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                        int vocab, float beta, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && dim >= 0 && vocab >= 0, "embedding_backward: negative shape");
  const std::size_t table = count(vocab, dim);
  if (table == 0) return;
  if (beta == 0.0f) {
    CUDA_CHECK(cudaMemsetAsync(dtable, 0, table * sizeof(float), stream));
  } else if (beta != 1.0f) {
    scale(dtable, beta, table, stream);
  }
  const std::size_t n = count(rows, dim);
  if (n == 0) return;
  embedding_scatter_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      dtable, ids, dy, n, static_cast<std::size_t>(dim), vocab);
  CUDA_CHECK_LAUNCH();
}

void add_positions(float* out, const float* pos, int batch, int seq, int dim, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(batch >= 0 && seq >= 0 && dim >= 0, "add_positions: negative shape");
  const std::size_t n = count(batch, count(seq, dim));
  if (n == 0) return;
  add_positions_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, pos, n, count(seq, dim));
  CUDA_CHECK_LAUNCH();
}

// dpos(seq, dim) is the column sums of dy read as (batch, seq * dim): bias_grad's kernel.
void positions_backward(float* dpos, const float* dy, int batch, int seq, int dim, float beta,
                        cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(batch >= 0 && seq >= 0 && dim >= 0, "positions_backward: negative shape");
  const std::size_t cols = count(seq, dim);
  SHARDSCOPE_REQUIRE(cols <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                     "positions_backward: seq * dim of " + std::to_string(cols) + " exceeds 2^31 - 1");
  bias_grad(dpos, dy, batch, static_cast<int>(cols), beta, stream);
}

// ---- norms -------------------------------------------------------------------------------

void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                        const float* bias, int rows, int dim, float eps, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && dim > 0, "layer_norm_forward: rows >= 0 and dim > 0");
  if (rows == 0) return;
  layer_norm_forward_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(y, mean, rstd, x, gamma,
                                                                         bias, rows, dim, eps);
  CUDA_CHECK_LAUNCH();
}

void layer_norm_backward(float* dx, float* dgamma, float* dbias, const float* dy, const float* x,
                         const float* mean, const float* rstd, const float* gamma, int rows, int dim,
                         float beta, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && dim > 0, "layer_norm_backward: rows >= 0 and dim > 0");
  if (rows > 0) {
    norm_backward_dx_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(dx, dy, x, mean, rstd,
                                                                         gamma, rows, dim);
    CUDA_CHECK_LAUNCH();
  }
  launch_gamma_grad(dgamma, dy, x, mean, rstd, rows, dim, beta, stream);
  if (dbias != nullptr) bias_grad(dbias, dy, rows, dim, beta, stream);
}

void rms_norm_forward(float* y, float* rstd, const float* x, const float* gamma, int rows, int dim,
                      float eps, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && dim > 0, "rms_norm_forward: rows >= 0 and dim > 0");
  if (rows == 0) return;
  rms_norm_forward_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(y, rstd, x, gamma, rows,
                                                                       dim, eps);
  CUDA_CHECK_LAUNCH();
}

void rms_norm_backward(float* dx, float* dgamma, const float* dy, const float* x, const float* rstd,
                       const float* gamma, int rows, int dim, float beta, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && dim > 0, "rms_norm_backward: rows >= 0 and dim > 0");
  if (rows > 0) {
    norm_backward_dx_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(dx, dy, x, nullptr, rstd,
                                                                         gamma, rows, dim);
    CUDA_CHECK_LAUNCH();
  }
  launch_gamma_grad(dgamma, dy, x, nullptr, rstd, rows, dim, beta, stream);
}

// ---- attention pieces ----------------------------------------------------------------------

void rope(float* x, int ld, int batch, int seq, int heads, int head_dim, float theta, bool inverse,
          cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(batch >= 0 && seq >= 0 && heads >= 0, "rope: negative shape");
  SHARDSCOPE_REQUIRE(head_dim > 0 && head_dim % 2 == 0,
                     "rope: head_dim must be even and positive, not " + std::to_string(head_dim));
  const std::size_t n = count(batch, count(seq, count(heads, head_dim / 2)));
  if (n == 0) return;
  rope_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, ld, seq, heads, head_dim, theta, inverse, n);
  CUDA_CHECK_LAUNCH();
}

void causal_softmax_forward(float* p, int count_, int seq, float scale, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(count_ >= 0 && seq >= 0, "causal_softmax_forward: negative shape");
  const std::int64_t rows = static_cast<std::int64_t>(count_) * seq;
  if (rows == 0) return;
  causal_softmax_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(p, rows, seq, scale);
  CUDA_CHECK_LAUNCH();
}

void softmax_backward(float* dp, const float* p, std::int64_t rows, int cols, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols >= 0, "softmax_backward: negative shape");
  if (rows == 0 || cols == 0) return;
  softmax_backward_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(dp, p, rows, cols);
  CUDA_CHECK_LAUNCH();
}

void permute_heads(float* dst, const float* src, int ld_tokens, int batch, int seq, int heads,
                   int head_dim, bool to_heads, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(batch >= 0 && seq >= 0 && heads >= 0 && head_dim >= 0,
                     "permute_heads: negative shape");
  SHARDSCOPE_REQUIRE(ld_tokens >= heads * head_dim, "permute_heads: ld_tokens below heads * head_dim");
  const std::size_t n = count(batch, count(seq, count(heads, head_dim)));
  if (n == 0) return;
  permute_heads_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, ld_tokens, seq, heads,
                                                               head_dim, to_heads, n);
  CUDA_CHECK_LAUNCH();
}

// ---- cross-entropy -----------------------------------------------------------------------

void log_softmax_forward(float* logprobs, const float* logits, std::int64_t rows, int cols,
                         cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols > 0, "log_softmax_forward: rows >= 0 and cols > 0");
  if (rows == 0) return;
  log_softmax_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(logprobs, logits, rows, cols);
  CUDA_CHECK_LAUNCH();
}

void nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                      std::int64_t rows, int cols, float scale, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols > 0, "nll_loss_forward: rows >= 0 and cols > 0");
  if (rows == 0) {  // the mean of nothing: 0, as the host reference
    CUDA_CHECK(cudaMemsetAsync(loss_out, 0, sizeof(float), stream));
    return;
  }
  nll_loss_kernel<<<1, kLossThreads, 0, stream>>>(loss_out, logprobs, targets, rows, cols, scale);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                            std::int64_t rows, int cols, float scale, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols > 0, "cross_entropy_backward: rows >= 0 and cols > 0");
  const std::size_t n = count(rows, cols);
  if (n == 0) return;
  // The ratio in double, then fp32 (as the mse gradient).
  const auto scale_over_rows = static_cast<float>(static_cast<double>(scale) / static_cast<double>(rows));
  cross_entropy_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dlogits, logprobs, targets,
                                                                        n, cols, scale_over_rows);
  CUDA_CHECK_LAUNCH();
}

// ---- vocabulary-parallel pieces ----------------------------------------------------------
namespace {

__global__ void vocab_embedding_forward_kernel(float* out, const std::int64_t* ids, const float* table,
                                               std::size_t n, std::size_t dim, std::int64_t first,
                                               std::int64_t count) {
  SS_GRID_STRIDE(i, n) {
    const std::int64_t v = ids[i / dim] - first;
    out[i] = v >= 0 && v < count ? table[static_cast<std::size_t>(v) * dim + i % dim] : 0.0f;
  }
}

__global__ void vocab_embedding_scatter_kernel(float* dtable, const std::int64_t* ids, const float* dy,
                                               std::size_t n, std::size_t dim, std::int64_t first,
                                               std::int64_t count) {
  SS_GRID_STRIDE(i, n) {
    const std::int64_t v = ids[i / dim] - first;
    if (v >= 0 && v < count) atomicAdd(&dtable[static_cast<std::size_t>(v) * dim + i % dim], dy[i]);
  }
}

__global__ void row_max_kernel(float* max, const float* x, std::int64_t rows, int cols) {
  __shared__ float scratch[32];
  SS_ROW_STRIDE(row, rows) {
    const float* xr = x + row * cols;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m, scratch);
    if (threadIdx.x == 0) max[row] = m;
  }
}

__global__ void row_sum_exp_kernel(float* sum, const float* x, const float* max, std::int64_t rows, int cols) {
  __shared__ float scratch[32];
  SS_ROW_STRIDE(row, rows) {
    const float* xr = x + row * cols;
    const float m = max[row];
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - m);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) sum[row] = s;
  }
}

__global__ void log_softmax_given_kernel(float* logprobs, const float* x, const float* max, const float* sum,
                                         std::size_t n, int cols) {
  SS_GRID_STRIDE(i, n) {
    const std::size_t row = i / static_cast<std::size_t>(cols);
    logprobs[i] = x[i] - max[row] - logf(sum[row]);
  }
}

__global__ void vocab_nll_loss_kernel(float* loss_out, const float* logprobs, const std::int64_t* targets,
                                      std::int64_t rows, int cols, std::int64_t first, float scale) {
  __shared__ double buf[kLossThreads];
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < rows; i += kLossThreads) {
    const std::int64_t v = targets[i] - first;
    if (v >= 0 && v < cols) s -= static_cast<double>(logprobs[i * cols + v]);
  }
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kLossThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) buf[threadIdx.x] += buf[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    loss_out[0] = static_cast<float>(static_cast<double>(scale) * (buf[0] / static_cast<double>(rows)));
  }
}

__global__ void vocab_cross_entropy_backward_kernel(float* dlogits, const float* logprobs,
                                                    const std::int64_t* targets, std::size_t n, int cols,
                                                    std::int64_t first, float scale_over_rows) {
  SS_GRID_STRIDE(i, n) {
    const std::int64_t col = static_cast<std::int64_t>(i % cols);
    const float at_target = targets[i / cols] - first == col ? scale_over_rows : 0.0f;
    dlogits[i] = scale_over_rows * expf(logprobs[i]) - at_target;
  }
}

}  // namespace

void vocab_embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                             std::int64_t first, int count, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && dim >= 0 && count >= 0, "vocab_embedding_forward: negative shape");
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(dim);
  if (n == 0) return;
  vocab_embedding_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, ids, table, n,
                                                                         static_cast<std::size_t>(dim), first, count);
  CUDA_CHECK_LAUNCH();
}

void vocab_embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                              std::int64_t first, int count, float beta, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && dim >= 0 && count >= 0, "vocab_embedding_backward: negative shape");
  const std::size_t table = static_cast<std::size_t>(count) * static_cast<std::size_t>(dim);
  if (table == 0) return;
  if (beta == 0.0f) {
    CUDA_CHECK(cudaMemsetAsync(dtable, 0, table * sizeof(float), stream));
  } else if (beta != 1.0f) {
    scale(dtable, beta, table, stream);
  }
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(dim);
  if (n == 0) return;
  vocab_embedding_scatter_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dtable, ids, dy, n,
                                                                         static_cast<std::size_t>(dim), first, count);
  CUDA_CHECK_LAUNCH();
}

void row_max(float* max, const float* x, std::int64_t rows, int cols, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols > 0, "row_max: rows >= 0 and cols > 0");
  if (rows == 0) return;
  row_max_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(max, x, rows, cols);
  CUDA_CHECK_LAUNCH();
}

void row_sum_exp(float* sum, const float* x, const float* max, std::int64_t rows, int cols, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols > 0, "row_sum_exp: rows >= 0 and cols > 0");
  if (rows == 0) return;
  row_sum_exp_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(sum, x, max, rows, cols);
  CUDA_CHECK_LAUNCH();
}

void log_softmax_given(float* logprobs, const float* x, const float* max, const float* sum, std::int64_t rows,
                       int cols, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols > 0, "log_softmax_given: rows >= 0 and cols > 0");
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (n == 0) return;
  log_softmax_given_kernel<<<blocks_for(n), kThreads, 0, stream>>>(logprobs, x, max, sum, n, cols);
  CUDA_CHECK_LAUNCH();
}

void vocab_nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                            std::int64_t rows, int cols, std::int64_t first, float scale, cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols > 0, "vocab_nll_loss_forward: rows >= 0 and cols > 0");
  if (rows == 0) {
    CUDA_CHECK(cudaMemsetAsync(loss_out, 0, sizeof(float), stream));
    return;
  }
  vocab_nll_loss_kernel<<<1, kLossThreads, 0, stream>>>(loss_out, logprobs, targets, rows, cols, first, scale);
  CUDA_CHECK_LAUNCH();
}

void vocab_cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                  std::int64_t rows, int cols, std::int64_t first, float scale,
                                  cudaStream_t stream) {
  SHARDSCOPE_REQUIRE(rows >= 0 && cols > 0, "vocab_cross_entropy_backward: rows >= 0 and cols > 0");
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (n == 0) return;
  const auto scale_over_rows = static_cast<float>(static_cast<double>(scale) / static_cast<double>(rows));
  vocab_cross_entropy_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dlogits, logprobs, targets, n, cols,
                                                                              first, scale_over_rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace shardscope::cuda_ops
