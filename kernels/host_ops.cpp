// Host kernels: the CPU backend's math and the reference for the CUDA kernels.
// Hot loops are branch-free apart from the element-wise math so that GCC vectorises them.
#include "kernels/host_ops.hpp"

#include <cmath>

#include "kernels/elementwise.hpp"

#ifdef SHARDSCOPE_WITH_BLAS
#include <cblas.h>
#endif

namespace shardscope::host {

namespace {

// C row (n) = beta * C row, with BLAS's rule that beta == 0 ignores what C held (it may
// be uninitialised memory, NaN bit patterns included).
void scale_row(float* c, int n, float beta) {
  if (beta == 0.0f) {
    for (int j = 0; j < n; ++j) c[j] = 0.0f;
  } else if (beta != 1.0f) {
    for (int j = 0; j < n; ++j) c[j] *= beta;
  }
}

}  // namespace

// Two loop orders, both with a unit-stride inner loop:
// - op(B) = B (k,n): i-k-j, c(i,:) += alpha * op(A)(i,p) * B(p,:).
// - op(B) = B^T with B (n,k): i-j-k, c(i,j) += alpha * dot(op(A)(i,:), B(j,:)); when A is
//   also transposed its column i is gathered into a (k) scratch row first.
void gemm_loops(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (tb == Trans::no) {
    for (int i = 0; i < m; ++i) {
      float* ci = c + static_cast<std::size_t>(i) * ldc;
      scale_row(ci, n, beta);
      for (int p = 0; p < k; ++p) {
        const float aip = alpha * (ta == Trans::no ? a[static_cast<std::size_t>(i) * lda + p]
                                                   : a[static_cast<std::size_t>(p) * lda + i]);
        const float* bp = b + static_cast<std::size_t>(p) * ldb;
        for (int j = 0; j < n; ++j) ci[j] += aip * bp[j];
      }
    }
    return;
  }
  std::vector<float> gathered(ta == Trans::yes ? static_cast<std::size_t>(k) : 0);
  for (int i = 0; i < m; ++i) {
    const float* ai = a + static_cast<std::size_t>(i) * lda;
    if (ta == Trans::yes) {
      for (int p = 0; p < k; ++p) gathered[p] = a[static_cast<std::size_t>(p) * lda + i];
      ai = gathered.data();
    }
    float* ci = c + static_cast<std::size_t>(i) * ldc;
    for (int j = 0; j < n; ++j) {
      const float* bj = b + static_cast<std::size_t>(j) * ldb;
      // Four partial sums: independent chains the compiler can keep in registers.
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
      int p = 0;
      for (; p + 4 <= k; p += 4) {
        s0 += ai[p] * bj[p];
        s1 += ai[p + 1] * bj[p + 1];
        s2 += ai[p + 2] * bj[p + 2];
        s3 += ai[p + 3] * bj[p + 3];
      }
      for (; p < k; ++p) s0 += ai[p] * bj[p];
      const float dot = alpha * ((s0 + s1) + (s2 + s3));
      ci[j] = beta == 0.0f ? dot : dot + beta * ci[j];
    }
  }
}

void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
#ifdef SHARDSCOPE_WITH_BLAS
  if (m <= 0 || n <= 0) return;
  cblas_sgemm(CblasRowMajor, ta == Trans::yes ? CblasTrans : CblasNoTrans,
              tb == Trans::yes ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta,
              c, ldc);
#else
  gemm_loops(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

void bias_activation(float* y, const float* bias, int rows, int cols, Activation act) {
  for (int r = 0; r < rows; ++r) {
    float* yr = y + static_cast<std::size_t>(r) * cols;
    if (act == Activation::relu) {
      for (int j = 0; j < cols; ++j) yr[j] = math::relu(yr[j] + bias[j]);
    } else {
      for (int j = 0; j < cols; ++j) yr[j] += bias[j];
    }
  }
}

void relu_backward(float* dz, const float* a, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dz[i] = math::relu_grad(dz[i], a[i]);
}

// Rows outer, columns inner: unit stride, accumulated in db itself (fp32, like the kernel).
void bias_grad(float* db, const float* dz, int rows, int cols, float beta) {
  scale_row(db, cols, beta);
  for (int r = 0; r < rows; ++r) {
    const float* dzr = dz + static_cast<std::size_t>(r) * cols;
    for (int j = 0; j < cols; ++j) db[j] += dzr[j];
  }
}

// The loss value is accumulated in double: it is printed and compared across strategies,
// and a sum over a large batch loses digits in fp32. Either output may be null (backend.hpp):
// the value alone in forward (dy null), the gradient alone in backward (loss_out null; for
// `sum` y may then be null too, since dy = scale does not depend on it).
void loss(Loss kind, const float* y, const float* target, float* dy, float* loss_out, int rows,
          int cols, float scale) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (kind == Loss::sum) {
    if (loss_out != nullptr) {
      double acc = 0.0;
      for (std::size_t i = 0; i < n; ++i) acc += y[i];
      loss_out[0] = static_cast<float>(static_cast<double>(scale) * acc);
    }
    if (dy != nullptr) {
      for (std::size_t i = 0; i < n; ++i) dy[i] = scale;
    }
    return;
  }
  if (loss_out != nullptr) {
    double acc = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(y[i]) - static_cast<double>(target[i]);
      acc += d * d;
    }
    loss_out[0] = n == 0 ? 0.0f
                         : static_cast<float>(static_cast<double>(scale) * acc / static_cast<double>(n));
  }
  if (dy != nullptr && n != 0) {
    const float scale_over_n = static_cast<float>(static_cast<double>(scale) / static_cast<double>(n));
    for (std::size_t i = 0; i < n; ++i) dy[i] = math::mse_grad(y[i], target[i], scale_over_n);
  }
}

// torch computes the bias corrections in Python floats (double), then hands them to the
// fp32 kernels; so do we, once per tensor (each carries its own step).
void adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors) {
  for (const AdamWTensor& t : tensors) {
    const math::AdamWScalars sc =
        math::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, t.step);
    // restrict + locals: the four arrays never alias, which lets the loop vectorise.
    float* __restrict p = t.param;
    const float* __restrict g = t.grad;
    float* __restrict m = t.exp_avg;
    float* __restrict v = t.exp_avg_sq;
    for (std::size_t i = 0; i < t.n; ++i) {
      float pi = p[i], mi = m[i], vi = v[i];
      math::adamw_update(pi, g[i], mi, vi, sc);
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
    }
  }
}

}  // namespace shardscope::host
