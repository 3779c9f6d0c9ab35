// bfloat16 on the host: the top 16 bits of an fp32, rounded to nearest even, as torch's
// c10::BFloat16 rounds (NaN stays a quiet NaN). Values are stored as std::uint16_t.
//
// OpenBLAS as Debian builds it (0.3.21) exports no sbgemm, so a bf16 GEMM on the CPU runs
// as torch's math defines it: its bf16 operands widened to fp32 (exactly: every bf16 is an
// fp32), multiplied and accumulated in fp32 by sgemm, the result rounded to bf16 once.
#pragma once

#include <cstdint>
#include <cstring>

namespace shardscope {

using bf16 = std::uint16_t;

inline bf16 to_bf16(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<bf16>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<bf16>(u >> 16);
}

inline float from_bf16(bf16 b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// y[i] = bf16(x[i]); x[i] = widened y[i]; x[i] = widened bf16(x[i]) (in place: the value
// a bf16 tensor would hold, kept in fp32).
void bf16_round(bf16* y, const float* x, std::int64_t n);
void bf16_widen(float* y, const bf16* x, std::int64_t n);
void bf16_round_in_place(float* x, std::int64_t n);

}  // namespace shardscope
