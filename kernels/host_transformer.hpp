// Host implementations of the Backend's transformer math (backend.hpp, "transformer
// math"; layouts in transformer_args.hpp), with the same signatures. The CPU backend calls
// them, and the CUDA tests use them as the reference. Row-major fp32.
//
// Accumulation: a row's statistics (the norms' mean, variance and sums, softmax and
// log-softmax sums, flash attention's D) are summed in eight fp32 lanes added in double
// (host_reduce.hpp), which vectorises; nll's mean over rows in double; sums over rows into
// a parameter's gradient (dgamma, dbias, dpos, the embedding table) are fp32 in the output
// itself, as bias_grad; flash attention's running max and sum per query are fp32, as
// FlashAttention's are. Exponentials are math::fast_exp (elementwise.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardscope/kernel_args.hpp"
#include "shardscope/transformer_args.hpp"

namespace shardscope::host {

// Flash attention's tiles: a block of kFlashBlock queries against blocks of kFlashBlock keys.
constexpr int kFlashBlock = 64;

void gemm_batched(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                  std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta, float* c,
                  int ldc, std::int64_t stride_c, int batch);
void embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim);
void embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim, int vocab,
                        float beta);
void add_positions(float* out, const float* pos, int batch, int seq, int dim);
void positions_backward(float* dpos, const float* dy, int batch, int seq, int dim, float beta);
void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma, const float* bias,
                        int rows, int dim, float eps);
void layer_norm_backward(float* dx, float* dgamma, float* dbias, const float* dy, const float* x,
                         const float* mean, const float* rstd, const float* gamma, int rows, int dim, float beta);
void rms_norm_forward(float* y, float* rstd, const float* x, const float* gamma, int rows, int dim, float eps);
void rms_norm_backward(float* dx, float* dgamma, const float* dy, const float* x, const float* rstd,
                       const float* gamma, int rows, int dim, float beta);
void gelu_tanh_forward(float* y, const float* x, std::size_t n);
void gelu_tanh_backward(float* dx, const float* dy, const float* x, std::size_t n);
void silu_forward(float* y, const float* x, std::size_t n);
void silu_backward(float* dx, const float* dy, const float* x, std::size_t n);
void mul(float* out, const float* a, const float* b, std::size_t n);
void rope(float* x, int ld, int batch, int seq, int heads, int head_dim, float theta, bool inverse);
void causal_softmax_forward(float* p, int count, int seq, float scale);
void softmax_backward(float* dp, const float* p, std::int64_t rows, int cols);
void permute_heads(float* dst, const float* src, int ld_tokens, int batch, int seq, int heads, int head_dim,
                   bool to_heads);
void flash_attention_forward(const AttentionArgs& a, float* out, int ldo, float* lse);
void flash_attention_backward(const AttentionArgs& a, const float* out, int ldo, const float* dout,
                              const float* lse, float* dq, float* dk, float* dv);
void log_softmax_forward(float* logprobs, const float* logits, std::int64_t rows, int cols);
void nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets, std::int64_t rows,
                      int cols, float scale);
void cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                            std::int64_t rows, int cols, float scale);

// Vocabulary-parallel pieces (backend.hpp): a rank's rows [first, first + count).
void vocab_embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                             std::int64_t first, int count);
void vocab_embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                              std::int64_t first, int count, float beta);
void row_max(float* max, const float* x, std::int64_t rows, int cols);
void row_sum_exp(float* sum, const float* x, const float* max, std::int64_t rows, int cols);
void log_softmax_given(float* logprobs, const float* x, const float* max, const float* sum, std::int64_t rows,
                       int cols);
void vocab_nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets, std::int64_t rows,
                            int cols, std::int64_t first, float scale);
void vocab_cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                  std::int64_t rows, int cols, std::int64_t first, float scale);

}  // namespace shardscope::host
