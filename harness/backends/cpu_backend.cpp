#include "harness/backends/cpu_backend.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/host_bf16.hpp"
#include "kernels/host_ops.hpp"
#include "kernels/host_transformer.hpp"

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

// ---- transformer math: the host kernels ----

void CpuBackend::gemm_batched(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                              std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta,
                              float* c, int ldc, std::int64_t stride_c, int batch) {
  host::gemm_batched(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
}

void CpuBackend::embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim) {
  host::embedding_forward(out, ids, table, rows, dim);
}

void CpuBackend::embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                                    int vocab, float beta) {
  host::embedding_backward(dtable, ids, dy, rows, dim, vocab, beta);
}

void CpuBackend::add_positions(float* out, const float* pos, int batch, int seq, int dim) {
  host::add_positions(out, pos, batch, seq, dim);
}

void CpuBackend::positions_backward(float* dpos, const float* dy, int batch, int seq, int dim, float beta) {
  host::positions_backward(dpos, dy, batch, seq, dim, beta);
}

void CpuBackend::layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                                    const float* bias, int rows, int dim, float eps) {
  host::layer_norm_forward(y, mean, rstd, x, gamma, bias, rows, dim, eps);
}

void CpuBackend::layer_norm_backward(float* dx, float* dgamma, float* dbias, const float* dy, const float* x,
                                     const float* mean, const float* rstd, const float* gamma, int rows, int dim,
                                     float beta) {
  host::layer_norm_backward(dx, dgamma, dbias, dy, x, mean, rstd, gamma, rows, dim, beta);
}

void CpuBackend::rms_norm_forward(float* y, float* rstd, const float* x, const float* gamma, int rows, int dim,
                                  float eps) {
  host::rms_norm_forward(y, rstd, x, gamma, rows, dim, eps);
}

void CpuBackend::rms_norm_backward(float* dx, float* dgamma, const float* dy, const float* x, const float* rstd,
                                   const float* gamma, int rows, int dim, float beta) {
  host::rms_norm_backward(dx, dgamma, dy, x, rstd, gamma, rows, dim, beta);
}

void CpuBackend::gelu_tanh_forward(float* y, const float* x, std::size_t n) { host::gelu_tanh_forward(y, x, n); }

void CpuBackend::gelu_tanh_backward(float* dx, const float* dy, const float* x, std::size_t n) {
  host::gelu_tanh_backward(dx, dy, x, n);
}

void CpuBackend::silu_forward(float* y, const float* x, std::size_t n) { host::silu_forward(y, x, n); }

void CpuBackend::silu_backward(float* dx, const float* dy, const float* x, std::size_t n) {
  host::silu_backward(dx, dy, x, n);
}

void CpuBackend::mul(float* out, const float* a, const float* b, std::size_t n) { host::mul(out, a, b, n); }

void CpuBackend::rope(float* x, int ld, int batch, int seq, int heads, int head_dim, float theta, bool inverse) {
  host::rope(x, ld, batch, seq, heads, head_dim, theta, inverse);
}

void CpuBackend::causal_softmax_forward(float* p, int count, int seq, float scale) {
  host::causal_softmax_forward(p, count, seq, scale);
}

void CpuBackend::softmax_backward(float* dp, const float* p, std::int64_t rows, int cols) {
  host::softmax_backward(dp, p, rows, cols);
}

void CpuBackend::permute_heads(float* dst, const float* src, int ld_tokens, int batch, int seq, int heads,
                               int head_dim, bool to_heads) {
  host::permute_heads(dst, src, ld_tokens, batch, seq, heads, head_dim, to_heads);
}

void CpuBackend::flash_attention_forward(const AttentionArgs& a, float* out, int ldo, float* lse) {
  host::flash_attention_forward(a, out, ldo, lse);
}

void CpuBackend::flash_attention_backward(const AttentionArgs& a, const float* out, int ldo, const float* dout,
                                          const float* lse, float* dq, float* dk, float* dv) {
  host::flash_attention_backward(a, out, ldo, dout, lse, dq, dk, dv);
}

void CpuBackend::log_softmax_forward(float* logprobs, const float* logits, std::int64_t rows, int cols) {
  host::log_softmax_forward(logprobs, logits, rows, cols);
}

void CpuBackend::nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                                  std::int64_t rows, int cols, float scale) {
  host::nll_loss_forward(loss_out, logprobs, targets, rows, cols, scale);
}

void CpuBackend::cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                        std::int64_t rows, int cols, float scale) {
  host::cross_entropy_backward(dlogits, logprobs, targets, rows, cols, scale);
}

void CpuBackend::vocab_embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                                         std::int64_t first, int count) {
  host::vocab_embedding_forward(out, ids, table, rows, dim, first, count);
}
void CpuBackend::vocab_embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                                          std::int64_t first, int count, float beta) {
  host::vocab_embedding_backward(dtable, ids, dy, rows, dim, first, count, beta);
}
void CpuBackend::row_max(float* max, const float* x, std::int64_t rows, int cols) { host::row_max(max, x, rows, cols); }
void CpuBackend::row_sum_exp(float* sum, const float* x, const float* max, std::int64_t rows, int cols) {
  host::row_sum_exp(sum, x, max, rows, cols);
}
void CpuBackend::log_softmax_given(float* logprobs, const float* x, const float* max, const float* sum,
                                   std::int64_t rows, int cols) {
  host::log_softmax_given(logprobs, x, max, sum, rows, cols);
}
void CpuBackend::vocab_nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                                        std::int64_t rows, int cols, std::int64_t first, float scale) {
  host::vocab_nll_loss_forward(loss_out, logprobs, targets, rows, cols, first, scale);
}
void CpuBackend::vocab_cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                              std::int64_t rows, int cols, std::int64_t first, float scale) {
  host::vocab_cross_entropy_backward(dlogits, logprobs, targets, rows, cols, first, scale);
}

void CpuBackend::upload(float* dst, const float* host, std::size_t n) {
  if (n != 0) std::memcpy(dst, host, n * sizeof(float));
}

void CpuBackend::download(float* host, const float* src, std::size_t n) {
  if (n != 0) std::memcpy(host, src, n * sizeof(float));
}

void CpuBackend::upload_bytes(void* dst, const void* host, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, host, bytes);
}

void CpuBackend::download_bytes(void* host, const void* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(host, src, bytes);
}

void CpuBackend::gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda,
                           const Bf16* b, int ldb, float beta, float* c, int ldc) {
  host::gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CpuBackend::gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda,
                           const Bf16* b, int ldb, float beta, Bf16* c, int ldc) {
  host::gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CpuBackend::cast_to_bf16(Bf16* dst, const float* src, std::size_t n) { host::cast_to_bf16(dst, src, n); }

void CpuBackend::cast_from_bf16(float* dst, const Bf16* src, std::size_t n, float beta) {
  host::cast_from_bf16(dst, src, n, beta);
}

void CpuBackend::bias_activation_bf16(Bf16* y, const Bf16* bias, int rows, int cols, Activation act) {
  host::bias_activation_bf16(y, bias, rows, cols, act);
}

void CpuBackend::relu_backward_bf16(Bf16* dz, const Bf16* a, std::size_t n) { host::relu_backward_bf16(dz, a, n); }

void CpuBackend::bias_grad_bf16(Bf16* db, const Bf16* dz, int rows, int cols) {
  host::bias_grad_bf16(db, dz, rows, cols);
}

std::string CpuBackend::bf16_gemm() const { return host::bf16_gemm_kind(); }

void CpuBackend::fill_bf16(Bf16* dst, float value, std::size_t n) { host::fill_bf16(dst, value, n); }
void CpuBackend::copy_bf16(Bf16* dst, const Bf16* src, std::size_t n) {
  if (n > 0 && dst != src) std::memmove(dst, src, n * sizeof(Bf16));
}
void CpuBackend::scale_bf16(Bf16* x, float s, std::size_t n) { host::scale_bf16(x, s, n); }
void CpuBackend::add_bf16(Bf16* dst, const Bf16* src, std::size_t n) { host::add_bf16(dst, src, n); }

void CpuBackend::sum_bf16(float* out, const Bf16* x, std::size_t n, float scale) { host::sum_bf16(out, x, n, scale); }

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
