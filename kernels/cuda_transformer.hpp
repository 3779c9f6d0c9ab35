// CUDA kernels of the transformer math (backend.hpp, "transformer math"; layouts in
// transformer_args.hpp): the same semantics as the Backend's declarations, plus the
// stream to enqueue on. Asynchronous; every launch is followed by CUDA_CHECK_LAUNCH and
// a failure throws RunError. All pointers are device pointers; row-major fp32, token ids
// int64. The batched GEMM is cuBLAS's (CudaBackend::gemm_batched); flash attention is in
// cuda_flash_attention.hpp.
//
// Reductions: a row's statistics (norms, softmax, log-softmax) are one block per row,
// summed in float in a fixed order (deterministic). Column sums over rows (dgamma, dbias,
// dpos) and the loss accumulate in double in a fixed order (deterministic). The
// embedding's gradient is the one scatter: dtable is scaled by beta (beta 0: zeroed),
// then every token's dy row is added with float atomicAdd, so rows named by several
// tokens sum in an order that can change from run to run (the last bits only).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace shardscope::cuda_ops {

void embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                       cudaStream_t stream);
void embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                        int vocab, float beta, cudaStream_t stream);
void add_positions(float* out, const float* pos, int batch, int seq, int dim, cudaStream_t stream);
void positions_backward(float* dpos, const float* dy, int batch, int seq, int dim, float beta,
                        cudaStream_t stream);

void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                        const float* bias, int rows, int dim, float eps, cudaStream_t stream);
void layer_norm_backward(float* dx, float* dgamma, float* dbias, const float* dy, const float* x,
                         const float* mean, const float* rstd, const float* gamma, int rows, int dim,
                         float beta, cudaStream_t stream);
void rms_norm_forward(float* y, float* rstd, const float* x, const float* gamma, int rows, int dim,
                      float eps, cudaStream_t stream);
void rms_norm_backward(float* dx, float* dgamma, const float* dy, const float* x, const float* rstd,
                       const float* gamma, int rows, int dim, float beta, cudaStream_t stream);

void gelu_tanh_forward(float* y, const float* x, std::size_t n, cudaStream_t stream);
void gelu_tanh_backward(float* dx, const float* dy, const float* x, std::size_t n, cudaStream_t stream);
void silu_forward(float* y, const float* x, std::size_t n, cudaStream_t stream);
void silu_backward(float* dx, const float* dy, const float* x, std::size_t n, cudaStream_t stream);
void mul(float* out, const float* a, const float* b, std::size_t n, cudaStream_t stream);

void rope(float* x, int ld, int batch, int seq, int heads, int head_dim, float theta, bool inverse,
          cudaStream_t stream);
void causal_softmax_forward(float* p, int count, int seq, float scale, cudaStream_t stream);
void softmax_backward(float* dp, const float* p, std::int64_t rows, int cols, cudaStream_t stream);
void permute_heads(float* dst, const float* src, int ld_tokens, int batch, int seq, int heads,
                   int head_dim, bool to_heads, cudaStream_t stream);

void log_softmax_forward(float* logprobs, const float* logits, std::int64_t rows, int cols,
                         cudaStream_t stream);
void nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                      std::int64_t rows, int cols, float scale, cudaStream_t stream);
void cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                            std::int64_t rows, int cols, float scale, cudaStream_t stream);

// Vocabulary-parallel pieces (backend.hpp): a rank's rows [first, first + count).
void vocab_embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                             std::int64_t first, int count, cudaStream_t stream);
void vocab_embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                              std::int64_t first, int count, float beta, cudaStream_t stream);
void row_max(float* max, const float* x, std::int64_t rows, int cols, cudaStream_t stream);
void row_sum_exp(float* sum, const float* x, const float* max, std::int64_t rows, int cols, cudaStream_t stream);
void log_softmax_given(float* logprobs, const float* x, const float* max, const float* sum, std::int64_t rows,
                       int cols, cudaStream_t stream);
void vocab_nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                            std::int64_t rows, int cols, std::int64_t first, float scale, cudaStream_t stream);
void vocab_cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                  std::int64_t rows, int cols, std::int64_t first, float scale,
                                  cudaStream_t stream);

}  // namespace shardscope::cuda_ops
