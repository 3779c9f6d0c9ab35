// Element-wise math written once, used by the CPU backend and by the CUDA kernels
// (docs/design.md §5). Under a plain C++ compiler the CUDA attributes are defined away.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SS_HD __host__ __device__ __forceinline__
#else
#define SS_HD inline
#endif

namespace shardscope::math {

SS_HD float relu(float x) { return x > 0.0f ? x : 0.0f; }

// Gradient through ReLU from its saved output a.
SS_HD float relu_grad(float dz, float a) { return a > 0.0f ? dz : 0.0f; }

// d/dy of scale * mean((y - t)^2) over n elements.
SS_HD float mse_grad(float y, float t, float scale_over_n) { return 2.0f * (y - t) * scale_over_n; }

// expf and tanhf for the element-wise loops: on the device CUDA's own; on the host a
// branch-free Cephes polynomial GCC vectorises (glibc's expf and tanhf are scalar calls,
// 20x slower on a GELU). fast_exp is within 2 ulp of expf over [-87, 88], 0 below (so
// exp(-inf) = 0), inf above, NaN for NaN; fast_tanh has an absolute error under 2e-7 (relative error
// grows near 0, where GELU only adds it to 1).
SS_HD float fast_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  // Ternaries, not fmin/fmax or floor, which GCC does not vectorise without fast-math.
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  constexpr float kRound = 12582912.0f;                          // 1.5 * 2^23: adding it rounds to an integer
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;  // round(x / ln 2)
  float r = xc - n * 0.693359375f;                                // x - n ln 2 in two parts
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e_r = p * r * r + r + 1.0f;
  // 2^n from its exponent bits (n in [-126, 127])
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const float y = e_r * two_n;
  return x < -87.0f ? 0.0f : (x > 88.0f ? HUGE_VALF : (x == x ? y : x));  // NaN stays NaN
#endif
}

SS_HD float fast_tanh(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  const float e = fast_exp(-2.0f * std::fabs(x));  // in (0, 1]
  return std::copysign((1.0f - e) / (1.0f + e), x);
#endif
}

// GELU with the tanh approximation (nn.GELU(approximate="tanh")) and its derivative, in
// torch's order of operations: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

SS_HD float gelu_tanh(float x) {
  const float inner = kGeluBeta * (x + kGeluKappa * x * x * x);
  return 0.5f * x * (1.0f + fast_tanh(inner));
}

// dy * d/dx gelu_tanh(x): 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 kappa x^2).
SS_HD float gelu_tanh_grad(float dy, float x) {
  const float x_sq = x * x;
  const float t = fast_tanh(kGeluBeta * (x + kGeluKappa * x_sq * x));
  const float left_derivative = 0.5f * (1.0f + t);
  const float inner_derivative = kGeluBeta * (1.0f + 3.0f * kGeluKappa * x_sq);
  const float right_derivative = 0.5f * x * (1.0f - t * t) * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

// SiLU (x * sigmoid(x)) and dy times its derivative sigmoid(x) (1 + x (1 - sigmoid(x))),
// as torch's kernels write them.
SS_HD float silu(float x) { return x / (1.0f + fast_exp(-x)); }

SS_HD float silu_grad(float dy, float x) {
  const float sigmoid = 1.0f / (1.0f + fast_exp(-x));
  return dy * sigmoid * (1.0f + x * (1.0f - sigmoid));
}

// The per-step scalars of torch.optim.AdamW. torch computes them from Python floats
// (double) and hands them to its fp32 kernels, which round each to fp32 once; so do we
// (adamw_scalars, on the host).
struct AdamWScalars {
  float decay;            // 1 - lr * weight_decay
  float one_minus_beta1;  // lerp weight
  float beta2;
  float one_minus_beta2;
  float step_size;        // lr / (1 - beta1^t)
  float bc2_sqrt;         // sqrt(1 - beta2^t)
  float eps;
};

inline AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps,
                                  double weight_decay, int step) {
  const double t = static_cast<double>(step);
  return {static_cast<float>(1.0 - lr * weight_decay), static_cast<float>(1.0 - beta1),
          static_cast<float>(beta2), static_cast<float>(1.0 - beta2),
          static_cast<float>(lr / (1.0 - std::pow(beta1, t))),
          static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t))), static_cast<float>(eps)};
}

// One element of torch.optim.AdamW (decoupled weight decay, bias corrections, eps added
// after the square root), in torch's order of operations:
//   p.mul_(1 - lr * wd); m.lerp_(g, 1 - beta1); v.mul_(beta2).addcmul_(g, g, 1 - beta2)
//   denom = (v.sqrt() / bc2_sqrt).add_(eps); p.addcdiv_(m, denom, -step_size)
SS_HD void adamw_update(float& p, float g, float& m, float& v, const AdamWScalars& s) {
  p *= s.decay;
  m += s.one_minus_beta1 * (g - m);
  v = v * s.beta2 + s.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
  p += -s.step_size * (m / denom);
}

}  // namespace shardscope::math
