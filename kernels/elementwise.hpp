// Element-wise math written once, used by the CPU backend and by the CUDA kernels
// (DESIGN §5). Under a plain C++ compiler the CUDA attributes are defined away.
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

// One element of torch.optim.AdamW (decoupled weight decay, bias corrections, eps
// added after the square root), in torch's order of operations:
//   p *= 1 - lr * wd
//   m = m + (g - m) * (1 - beta1)        (torch: exp_avg.lerp_(grad, 1 - beta1))
//   v = v * beta2 + (1 - beta2) * g * g
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p -= lr / (1 - beta1^t) * m / denom
// bc1 = 1 - beta1^t and bc2_sqrt = sqrt(1 - beta2^t) are computed once per step on the host.
SS_HD void adamw_update(float& p, float g, float& m, float& v, float lr, float beta1,
                        float beta2, float eps, float weight_decay, float bc1, float bc2_sqrt) {
  p *= 1.0f - lr * weight_decay;
  m += (g - m) * (1.0f - beta1);
  v = v * beta2 + (1.0f - beta2) * g * g;
  const float denom = sqrtf(v) / bc2_sqrt + eps;
  p -= (lr / bc1) * (m / denom);
}

}  // namespace shardscope::math
