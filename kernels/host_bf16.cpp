// Host bf16 kernels (host_bf16.hpp): sums in fp32, results rounded to nearest even.
#include "kernels/host_bf16.hpp"

#include <vector>

#include "kernels/host_ops.hpp"

#if defined(SHARDSCOPE_WITH_BLAS) && defined(SHARDSCOPE_WITH_SBGEMM)
#include <cblas.h>
#endif

namespace shardscope::host {

namespace {

// op(X)'s storage: rows x cols with leading dimension ld, as the caller laid it out.
std::vector<float> widened(const Bf16* x, int rows, int cols, int ld) {
  std::vector<float> out(static_cast<std::size_t>(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      out[static_cast<std::size_t>(i) * cols + j] = from_bf16(x[static_cast<std::size_t>(i) * ld + j]);
  return out;
}

}  // namespace

const char* bf16_gemm_kind() {
#if defined(SHARDSCOPE_WITH_BLAS) && defined(SHARDSCOPE_WITH_SBGEMM)
  return "OpenBLAS cblas_sbgemm (bf16 inputs, fp32 sums)";
#elif defined(SHARDSCOPE_WITH_BLAS)
  return "bf16 inputs widened to fp32, cblas_sgemm (this OpenBLAS has no sbgemm; same arithmetic)";
#else
  return "bf16 inputs widened to fp32, loop GEMM (no BLAS)";
#endif
}

void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda, const Bf16* b,
               int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
#if defined(SHARDSCOPE_WITH_BLAS) && defined(SHARDSCOPE_WITH_SBGEMM)
  cblas_sbgemm(CblasRowMajor, ta == Trans::yes ? CblasTrans : CblasNoTrans, tb == Trans::yes ? CblasTrans : CblasNoTrans,
               m, n, k, alpha, reinterpret_cast<const bfloat16*>(a), lda, reinterpret_cast<const bfloat16*>(b), ldb,
               beta, c, ldc);
#else
  // A's storage is (m, k) or, transposed, (k, m); B's (k, n) or (n, k).
  const int a_rows = ta == Trans::no ? m : k, a_cols = ta == Trans::no ? k : m;
  const int b_rows = tb == Trans::no ? k : n, b_cols = tb == Trans::no ? n : k;
  const std::vector<float> a32 = widened(a, a_rows, a_cols, lda);
  const std::vector<float> b32 = widened(b, b_rows, b_cols, ldb);
  gemm(ta, tb, m, n, k, alpha, a32.data(), a_cols, b32.data(), b_cols, beta, c, ldc);
#endif
}

void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda, const Bf16* b,
               int ldb, float beta, Bf16* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  // The fp32 result (holding beta * C first), then rounded.
  std::vector<float> c32(static_cast<std::size_t>(m) * n, 0.0f);
  if (beta != 0.0f)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) c32[static_cast<std::size_t>(i) * n + j] = from_bf16(c[static_cast<std::size_t>(i) * ldc + j]);
  gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c32.data(), n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) c[static_cast<std::size_t>(i) * ldc + j] = to_bf16(c32[static_cast<std::size_t>(i) * n + j]);
}

void cast_to_bf16(Bf16* dst, const float* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

void cast_from_bf16(float* dst, const Bf16* src, std::size_t n, float beta) {
  if (beta == 0.0f) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = from_bf16(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = beta * dst[i] + from_bf16(src[i]);
  }
}

void bias_activation_bf16(Bf16* y, const Bf16* bias, int rows, int cols, Activation act) {
  for (int i = 0; i < rows; ++i) {
    Bf16* yi = y + static_cast<std::size_t>(i) * cols;
    for (int j = 0; j < cols; ++j) {
      float v = from_bf16(yi[j]) + from_bf16(bias[j]);
      if (act == Activation::relu && !(v > 0.0f)) v = 0.0f;
      yi[j] = to_bf16(v);
    }
  }
}

void relu_backward_bf16(Bf16* dz, const Bf16* a, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!(from_bf16(a[i]) > 0.0f)) dz[i] = Bf16{};
}

void bias_grad_bf16(Bf16* db, const Bf16* dz, int rows, int cols) {
  std::vector<float> sums(static_cast<std::size_t>(cols), 0.0f);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) sums[j] += from_bf16(dz[static_cast<std::size_t>(i) * cols + j]);
  for (int j = 0; j < cols; ++j) db[j] = to_bf16(sums[j]);
}

void fill_bf16(Bf16* dst, float value, std::size_t n) {
  const Bf16 v = to_bf16(value);
  for (std::size_t i = 0; i < n; ++i) dst[i] = v;
}

void scale_bf16(Bf16* x, float s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] = to_bf16(from_bf16(x[i]) * s);
}

void add_bf16(Bf16* dst, const Bf16* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_bf16(from_bf16(dst[i]) + from_bf16(src[i]));
}

void sum_bf16(float* out, const Bf16* x, std::size_t n, float scale) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += from_bf16(x[i]);
  out[0] = scale * s;
}

}  // namespace shardscope::host
