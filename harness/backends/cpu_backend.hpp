// The CPU backend (docs/design.md §5): host memory through the tracking allocator, GEMM by
// OpenBLAS's cblas_sgemm on one thread per rank (plain loops without OpenBLAS), and
// the element-wise math of kernels/host_ops.hpp and kernels/host_transformer.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/backend.hpp"

namespace shardscope {

class CpuBackend : public Backend {
 public:
  // Allocations are aligned to (and rounded up to) this many bytes.
  static constexpr std::int64_t kAlignment = 64;

  // Sets OpenBLAS to one thread: every rank is its own process and owns one core.
  CpuBackend();

  std::string name() const override { return "cpu"; }

  void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override;
  void bias_activation(float* y, const float* bias, int rows, int cols, Activation act) override;
  void relu_backward(float* dz, const float* a, std::size_t n) override;
  void bias_grad(float* db, const float* dz, int rows, int cols, float beta) override;
  void loss(Loss kind, const float* y, const float* target, float* dy, float* loss_out, int rows,
            int cols, float scale) override;
  void adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors) override;
  void copy(float* dst, const float* src, std::size_t n) override;
  void fill(float* dst, float value, std::size_t n) override;
  void scale(float* x, float s, std::size_t n) override;
  void add(float* dst, const float* src, std::size_t n) override;

  void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda, const Bf16* b,
                 int ldb, float beta, float* c, int ldc) override;
  void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda, const Bf16* b,
                 int ldb, float beta, Bf16* c, int ldc) override;
  void cast_to_bf16(Bf16* dst, const float* src, std::size_t n) override;
  void cast_from_bf16(float* dst, const Bf16* src, std::size_t n, float beta) override;
  void bias_activation_bf16(Bf16* y, const Bf16* bias, int rows, int cols, Activation act) override;
  void relu_backward_bf16(Bf16* dz, const Bf16* a, std::size_t n) override;
  void bias_grad_bf16(Bf16* db, const Bf16* dz, int rows, int cols) override;
  void fill_bf16(Bf16* dst, float value, std::size_t n) override;
  void copy_bf16(Bf16* dst, const Bf16* src, std::size_t n) override;
  void scale_bf16(Bf16* x, float s, std::size_t n) override;
  void add_bf16(Bf16* dst, const Bf16* src, std::size_t n) override;
  void sum_bf16(float* out, const Bf16* x, std::size_t n, float scale) override;
  std::string bf16_gemm() const override;

  // Transformer math: kernels/host_transformer.hpp.
  void gemm_batched(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                    std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta, float* c,
                    int ldc, std::int64_t stride_c, int batch) override;
  void embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim) override;
  void embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim, int vocab,
                          float beta) override;
  void add_positions(float* out, const float* pos, int batch, int seq, int dim) override;
  void positions_backward(float* dpos, const float* dy, int batch, int seq, int dim, float beta) override;
  void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                          const float* bias, int rows, int dim, float eps) override;
  void layer_norm_backward(float* dx, float* dgamma, float* dbias, const float* dy, const float* x,
                           const float* mean, const float* rstd, const float* gamma, int rows, int dim,
                           float beta) override;
  void rms_norm_forward(float* y, float* rstd, const float* x, const float* gamma, int rows, int dim,
                        float eps) override;
  void rms_norm_backward(float* dx, float* dgamma, const float* dy, const float* x, const float* rstd,
                         const float* gamma, int rows, int dim, float beta) override;
  void gelu_tanh_forward(float* y, const float* x, std::size_t n) override;
  void gelu_tanh_backward(float* dx, const float* dy, const float* x, std::size_t n) override;
  void silu_forward(float* y, const float* x, std::size_t n) override;
  void silu_backward(float* dx, const float* dy, const float* x, std::size_t n) override;
  void mul(float* out, const float* a, const float* b, std::size_t n) override;
  void rope(float* x, int ld, int batch, int seq, int heads, int head_dim, float theta, bool inverse) override;
  void causal_softmax_forward(float* p, int count, int seq, float scale) override;
  void softmax_backward(float* dp, const float* p, std::int64_t rows, int cols) override;
  void permute_heads(float* dst, const float* src, int ld_tokens, int batch, int seq, int heads, int head_dim,
                     bool to_heads) override;
  void flash_attention_forward(const AttentionArgs& a, float* out, int ldo, float* lse) override;
  void flash_attention_backward(const AttentionArgs& a, const float* out, int ldo, const float* dout,
                                const float* lse, float* dq, float* dk, float* dv) override;
  void log_softmax_forward(float* logprobs, const float* logits, std::int64_t rows, int cols) override;
  void nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets, std::int64_t rows,
                        int cols, float scale) override;
  void cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                              std::int64_t rows, int cols, float scale) override;

  void vocab_embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                               std::int64_t first, int count) override;
  void vocab_embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                                std::int64_t first, int count, float beta) override;
  void row_max(float* max, const float* x, std::int64_t rows, int cols) override;
  void row_sum_exp(float* sum, const float* x, const float* max, std::int64_t rows, int cols) override;
  void log_softmax_given(float* logprobs, const float* x, const float* max, const float* sum, std::int64_t rows,
                         int cols) override;
  void vocab_nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets, std::int64_t rows,
                              int cols, std::int64_t first, float scale) override;
  void vocab_cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                    std::int64_t rows, int cols, std::int64_t first, float scale) override;

  void upload(float* dst, const float* host, std::size_t n) override;
  void download(float* host, const float* src, std::size_t n) override;
  void upload_bytes(void* dst, const void* host, std::size_t bytes) override;
  void download_bytes(void* host, const void* src, std::size_t bytes) override;
  void synchronize() override {}

  // Bytes rounded up to kAlignment: what aligned_alloc really reserves for the request.
  std::int64_t rounded_bytes(std::int64_t bytes) const override;

 protected:
  void* raw_alloc(std::size_t bytes) override;
  void raw_free(void* p, std::size_t bytes) noexcept override;
};

}  // namespace shardscope
