// Host transformer kernels (host_transformer.hpp) apart from flash attention
// (host_flash_attention.cpp): the CPU backend's math and the CUDA kernels' reference.
// Element-wise loops are branch-free and exponentials are math::fast_exp so that GCC
// vectorises them; a row's reductions are host_reduce.hpp's fp32 lanes added in double.
#include "kernels/host_transformer.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/elementwise.hpp"
#include "kernels/host_ops.hpp"
#include "kernels/host_reduce.hpp"
#include "shardscope/check.hpp"

namespace shardscope::host {

namespace {

std::size_t at(std::int64_t row, int cols) { return static_cast<std::size_t>(row) * static_cast<std::size_t>(cols); }

// x(n) = beta * x, with BLAS's rule that beta 0 overwrites whatever x held (NaN included).
void scale_by_beta(float* x, std::size_t n, float beta) {
  if (beta == 0.0f) {
    for (std::size_t i = 0; i < n; ++i) x[i] = 0.0f;
  } else if (beta != 1.0f) {
    for (std::size_t i = 0; i < n; ++i) x[i] *= beta;
  }
}

}  // namespace

// One GEMM per matrix: cblas_sgemm with OpenBLAS (host::gemm), else the loops.
void gemm_batched(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                  std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta, float* c,
                  int ldc, std::int64_t stride_c, int batch) {
  for (int i = 0; i < batch; ++i)
    gemm(ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
}

// ---- embeddings -----------------------------------------------------------------------

void embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim) {
  for (int i = 0; i < rows; ++i) {
    const float* src = table + at(ids[i], dim);
    float* dst = out + at(i, dim);
    for (int j = 0; j < dim; ++j) dst[j] = src[j];
  }
}

// Rows in id order: a repeated id's sum is deterministic (ids ascending in the batch).
void embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim, int vocab,
                        float beta) {
  scale_by_beta(dtable, at(vocab, dim), beta);
  for (int i = 0; i < rows; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab)
      throw RunError("embedding_backward: token id " + std::to_string(ids[i]) + " at row " + std::to_string(i) +
                     " is outside [0, " + std::to_string(vocab) + ")");
    float* dst = dtable + at(ids[i], dim);
    const float* src = dy + at(i, dim);
    for (int j = 0; j < dim; ++j) dst[j] += src[j];
  }
}

void add_positions(float* out, const float* pos, int batch, int seq, int dim) {
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seq; ++s) {
      float* o = out + at(static_cast<std::int64_t>(b) * seq + s, dim);
      const float* p = pos + at(s, dim);
      for (int j = 0; j < dim; ++j) o[j] += p[j];
    }
}

void positions_backward(float* dpos, const float* dy, int batch, int seq, int dim, float beta) {
  scale_by_beta(dpos, at(seq, dim), beta);
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seq; ++s) {
      float* d = dpos + at(s, dim);
      const float* g = dy + at(static_cast<std::int64_t>(b) * seq + s, dim);
      for (int j = 0; j < dim; ++j) d[j] += g[j];
    }
}

// ---- norms ----------------------------------------------------------------------------

// Two passes (the mean, then the biased variance about it); y in torch's CPU order,
// (x * rstd + (-rstd * mean)) * gamma + bias.
void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma, const float* bias,
                        int rows, int dim, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + at(r, dim);
    const float m = static_cast<float>(lane_sum(dim, [&](int j) { return xr[j]; }) / dim);
    const double sq = lane_sum(dim, [&](int j) { return (xr[j] - m) * (xr[j] - m); });
    const float rs = static_cast<float>(1.0 / std::sqrt(sq / dim + static_cast<double>(eps)));
    mean[r] = m;
    rstd[r] = rs;
    const float shift = -rs * m;
    float* yr = y + at(r, dim);
    for (int j = 0; j < dim; ++j) yr[j] = (xr[j] * rs + shift) * gamma[j] + bias[j];
  }
}

// With g = dy * gamma and xhat = (x - mean) * rstd:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
//   dgamma = beta * dgamma + sum over rows of dy * xhat, dbias = beta * dbias + sum of dy.
void layer_norm_backward(float* dx, float* dgamma, float* dbias, const float* dy, const float* x,
                         const float* mean, const float* rstd, const float* gamma, int rows, int dim, float beta) {
  scale_by_beta(dgamma, static_cast<std::size_t>(dim), beta);
  scale_by_beta(dbias, static_cast<std::size_t>(dim), beta);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + at(r, dim);
    const float* gr = dy + at(r, dim);
    const float m = mean[r], rs = rstd[r];
    const double sum_g = lane_sum(dim, [&](int j) { return gr[j] * gamma[j]; });
    const double sum_gx = lane_sum(dim, [&](int j) { return gr[j] * gamma[j] * ((xr[j] - m) * rs); });
    const float mean_g = static_cast<float>(sum_g / dim), mean_gx = static_cast<float>(sum_gx / dim);
    // Three loops of few pointers each vectorise; one loop over all five does not.
    for (int j = 0; j < dim; ++j) dgamma[j] += gr[j] * ((xr[j] - m) * rs);
    for (int j = 0; j < dim; ++j) dbias[j] += gr[j];
    float* dxr = dx + at(r, dim);
    for (int j = 0; j < dim; ++j) dxr[j] = rs * (gr[j] * gamma[j] - mean_g - (xr[j] - m) * rs * mean_gx);
  }
}

// Hugging Face's LlamaRMSNorm: y = gamma * (x * rsqrt(mean(x^2) + eps)).
void rms_norm_forward(float* y, float* rstd, const float* x, const float* gamma, int rows, int dim, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + at(r, dim);
    const double sq = lane_sum(dim, [&](int j) { return xr[j] * xr[j]; });
    const float rs = static_cast<float>(1.0 / std::sqrt(sq / dim + static_cast<double>(eps)));
    rstd[r] = rs;
    float* yr = y + at(r, dim);
    for (int j = 0; j < dim; ++j) yr[j] = gamma[j] * (xr[j] * rs);
  }
}

// With g = dy * gamma and xhat = x * rstd: dx = rstd * (g - xhat * mean(g * xhat)),
// dgamma = beta * dgamma + sum over rows of dy * xhat.
void rms_norm_backward(float* dx, float* dgamma, const float* dy, const float* x, const float* rstd,
                       const float* gamma, int rows, int dim, float beta) {
  scale_by_beta(dgamma, static_cast<std::size_t>(dim), beta);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + at(r, dim);
    const float* gr = dy + at(r, dim);
    const float rs = rstd[r];
    const double sum_gx = lane_sum(dim, [&](int j) { return gr[j] * gamma[j] * (xr[j] * rs); });
    const float mean_gx = static_cast<float>(sum_gx / dim);
    for (int j = 0; j < dim; ++j) dgamma[j] += gr[j] * (xr[j] * rs);
    float* dxr = dx + at(r, dim);
    for (int j = 0; j < dim; ++j) dxr[j] = rs * (gr[j] * gamma[j] - (xr[j] * rs) * mean_gx);
  }
}

// ---- element-wise ---------------------------------------------------------------------

void gelu_tanh_forward(float* y, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = math::gelu_tanh(x[i]);
}

void gelu_tanh_backward(float* dx, const float* dy, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = math::gelu_tanh_grad(dy[i], x[i]);
}

void silu_forward(float* y, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = math::silu(x[i]);
}

void silu_backward(float* dx, const float* dy, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = math::silu_grad(dy[i], x[i]);
}

void mul(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

// Frequencies as Hugging Face's LlamaRotaryEmbedding computes them in fp32:
// inv_freq(i) = 1 / theta^(2i / head_dim), angle = pos * inv_freq(i); cos and sin once per
// position, then every row of that position and every head.
void rope(float* x, int ld, int batch, int seq, int heads, int head_dim, float theta, bool inverse) {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<std::size_t>(half)), cos_(inv_freq.size()), sin_(inv_freq.size());
  for (int i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  for (int s = 0; s < seq; ++s) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(s) * inv_freq[i];
      cos_[i] = std::cos(angle);
      sin_[i] = inverse ? -std::sin(angle) : std::sin(angle);
    }
    for (int b = 0; b < batch; ++b) {
      float* row = x + at(static_cast<std::int64_t>(b) * seq + s, ld);
      for (int h = 0; h < heads; ++h) {
        float* lo = row + static_cast<std::size_t>(h) * head_dim;
        float* hi = lo + half;
        for (int i = 0; i < half; ++i) {
          const float x1 = lo[i], x2 = hi[i];
          lo[i] = x1 * cos_[i] - x2 * sin_[i];
          hi[i] = x2 * cos_[i] + x1 * sin_[i];
        }
      }
    }
  }
}

// ---- softmax --------------------------------------------------------------------------

void causal_softmax_forward(float* p, int count, int seq, float scale) {
  const std::int64_t rows = static_cast<std::int64_t>(count) * seq;
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = p + at(r, seq);
    const int last = static_cast<int>(r % seq);  // the row's query position: columns 0..last
    const int n = last + 1;
    for (int j = 0; j < n; ++j) row[j] *= scale;
    const float mx = lane_max(row, n, -std::numeric_limits<float>::infinity());
    for (int j = 0; j < n; ++j) row[j] = math::fast_exp(row[j] - mx);
    const double sum = lane_sum(n, [&](int j) { return row[j]; });
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j <= last; ++j) row[j] *= inv;
    for (int j = last + 1; j < seq; ++j) row[j] = 0.0f;
  }
}

void softmax_backward(float* dp, const float* p, std::int64_t rows, int cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* d = dp + at(r, cols);
    const float* pr = p + at(r, cols);
    const float D = static_cast<float>(lane_sum(cols, [&](int j) { return d[j] * pr[j]; }));
    for (int j = 0; j < cols; ++j) d[j] = pr[j] * (d[j] - D);
  }
}

// Token-major (batch, seq, heads, head_dim) with row stride ld_tokens <-> head-major
// (batch, heads, seq, head_dim), contiguous.
void permute_heads(float* dst, const float* src, int ld_tokens, int batch, int seq, int heads, int head_dim,
                   bool to_heads) {
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < seq; ++s) {
        const std::size_t token = at(static_cast<std::int64_t>(b) * seq + s, ld_tokens) +
                                  static_cast<std::size_t>(h) * head_dim;
        const std::size_t head = at((static_cast<std::int64_t>(b) * heads + h) * seq + s, head_dim);
        float* d = dst + (to_heads ? head : token);
        const float* sp = src + (to_heads ? token : head);
        for (int e = 0; e < head_dim; ++e) d[e] = sp[e];
      }
}

// ---- cross-entropy --------------------------------------------------------------------

// torch's order: out = (x - max) - log(sum(exp(x - max))).
void log_softmax_forward(float* logprobs, const float* logits, std::int64_t rows, int cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = logits + at(r, cols);
    float* out = logprobs + at(r, cols);
    const float mx = lane_max(x, cols, -std::numeric_limits<float>::infinity());
    const double sum = lane_sum(cols, [&](int j) { return math::fast_exp(x[j] - mx); });
    const float log_sum = static_cast<float>(std::log(sum));
    for (int j = 0; j < cols; ++j) out[j] = (x[j] - mx) - log_sum;
  }
}

// The whole vocabulary is the slice that starts at 0; a target outside it is a bug upstream
// (the CUDA kernel traps on it), refused here before the backward could skip it.
void nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets, std::int64_t rows,
                      int cols, float scale) {
  for (std::int64_t r = 0; r < rows; ++r)
    SHARDSCOPE_REQUIRE(targets[r] >= 0 && targets[r] < cols, "nll_loss_forward: a target outside the vocabulary");
  vocab_nll_loss_forward(loss_out, logprobs, targets, rows, cols, 0, scale);
}

// log_softmax's backward of nll's gradient (-scale / rows at the target) in torch's order:
// dx = g - exp(logprobs) * sum(g) = f * exp(logprobs), less f at the target.
void cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                            std::int64_t rows, int cols, float scale) {
  vocab_cross_entropy_backward(dlogits, logprobs, targets, rows, cols, 0, scale);
}

// ---- vocabulary-parallel pieces ------------------------------------------------------------

void vocab_embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                             std::int64_t first, int count) {
  for (int i = 0; i < rows; ++i) {
    const std::int64_t v = ids[i] - first;
    float* dst = out + at(i, dim);
    if (v < 0 || v >= count) {
      for (int j = 0; j < dim; ++j) dst[j] = 0.0f;
      continue;
    }
    const float* src = table + at(v, dim);
    for (int j = 0; j < dim; ++j) dst[j] = src[j];
  }
}

void vocab_embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                              std::int64_t first, int count, float beta) {
  scale_by_beta(dtable, at(count, dim), beta);
  for (int i = 0; i < rows; ++i) {
    const std::int64_t v = ids[i] - first;
    if (v < 0 || v >= count) continue;
    float* dst = dtable + at(v, dim);
    const float* src = dy + at(i, dim);
    for (int j = 0; j < dim; ++j) dst[j] += src[j];
  }
}

void row_max(float* max, const float* x, std::int64_t rows, int cols) {
  for (std::int64_t r = 0; r < rows; ++r) max[r] = lane_max(x + at(r, cols), cols, -std::numeric_limits<float>::infinity());
}

void row_sum_exp(float* sum, const float* x, const float* max, std::int64_t rows, int cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + at(r, cols);
    const float mx = max[r];
    sum[r] = static_cast<float>(lane_sum(cols, [&](int j) { return math::fast_exp(xr[j] - mx); }));
  }
}

void log_softmax_given(float* logprobs, const float* x, const float* max, const float* sum, std::int64_t rows,
                       int cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + at(r, cols);
    float* out = logprobs + at(r, cols);
    const float mx = max[r];
    const float log_sum = std::log(sum[r]);
    for (int j = 0; j < cols; ++j) out[j] = (xr[j] - mx) - log_sum;
  }
}

void vocab_nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets, std::int64_t rows,
                            int cols, std::int64_t first, float scale) {
  double acc = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t v = targets[r] - first;
    if (v >= 0 && v < cols) acc -= logprobs[at(r, cols) + static_cast<std::size_t>(v)];
  }
  loss_out[0] = rows == 0 ? 0.0f : static_cast<float>(static_cast<double>(scale) * acc / static_cast<double>(rows));
}

void vocab_cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                  std::int64_t rows, int cols, std::int64_t first, float scale) {
  if (rows == 0) return;
  const float f = static_cast<float>(static_cast<double>(scale) / static_cast<double>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* lp = logprobs + at(r, cols);
    float* d = dlogits + at(r, cols);
    for (int j = 0; j < cols; ++j) d[j] = f * math::fast_exp(lp[j]);
    const std::int64_t v = targets[r] - first;
    if (v >= 0 && v < cols) d[v] -= f;
  }
}

}  // namespace shardscope::host
