// Seeded test data shared by the kernel, optimizer, communicator and CUDA tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace shardscope::testing {

// n uniform floats in [lo, hi) drawn from `gen`.
inline std::vector<float> random_floats(std::size_t n, std::mt19937& gen, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// n uniform floats in [lo, hi) from a fixed seed.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  return random_floats(n, gen, lo, hi);
}

inline bool all_zero(const std::vector<float>& v) {
  for (float x : v)
    if (x != 0.0f) return false;
  return true;
}

// Seeded non-zero values k/8, k in [-64, -1] u [1, 64], for rank `rank`'s element i:
// sums of a few of them are exact in fp32, so collectives compare bit for bit.
inline float exact_value(std::uint64_t seed, int rank, std::size_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull +
                    static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ull +
                    i * 0x94D049BB133111EBull + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  int k = static_cast<int>(z % 128) - 64;
  if (k >= 0) k += 1;
  return static_cast<float>(k) / 8.0f;
}

}  // namespace shardscope::testing
