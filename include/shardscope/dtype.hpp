// Element types of tracked buffers (--precision, docs/design.md §2): fp32, and bfloat16
// (torch.bfloat16: fp32's sign, 8 exponent bits and top 7 mantissa bits). A Buffer's bytes
// are its count times its element's size, so a bf16 tensor counts 2 B an element.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace shardscope {

enum class DType : std::uint8_t { f32, bf16 };

inline constexpr std::int64_t dtype_bytes(DType d) { return d == DType::bf16 ? 2 : 4; }
inline constexpr std::string_view dtype_name(DType d) { return d == DType::bf16 ? "bf16" : "fp32"; }

// One bfloat16 value: the top 16 bits of an fp32 (torch.bfloat16, __nv_bfloat16 and
// OpenBLAS's `bfloat16` hold the same bits).
struct Bf16 {
  std::uint16_t bits = 0;
};
static_assert(sizeof(Bf16) == 2, "a bf16 is two bytes");

// fp32 -> bf16 rounding to nearest, ties to even (torch's and CUDA's __float2bfloat16_rn);
// a NaN stays a (quiet) NaN.
inline Bf16 to_bf16(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return Bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<std::uint16_t>(u >> 16)};
}

// bf16 -> fp32, exact.
inline float from_bf16(Bf16 b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b.bits) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace shardscope
