#include "kernels/host_bf16.hpp"

namespace shardscope {

void bf16_round(bf16* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i]);
}

void bf16_widen(float* y, const bf16* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = from_bf16(x[i]);
}

void bf16_round_in_place(float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = from_bf16(to_bf16(x[i]));
}

}  // namespace shardscope
