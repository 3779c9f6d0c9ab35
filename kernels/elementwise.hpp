// Element-wise math written once, used by the CPU backend and by the CUDA kernels
// (docs/design.md §5). Under a plain C++ compiler the CUDA attributes are defined away.
#pragma once

#include <cmath>

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
