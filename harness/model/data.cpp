#include "harness/model/data.hpp"

#include <algorithm>
#include <cmath>

#include "harness/model/model.hpp"

namespace shardscope {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr std::uint64_t kParamStream = 0x5eed000000000000ULL;

}  // namespace

float hashed_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t h = hashed_bits(seed, stream, index);
  // 24 random bits -> [0, 1) exactly representable in fp32, then [-1, 1)
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return 2.0f * u - 1.0f;
}

std::uint64_t hashed_bits(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream)) + index);
}

std::uint64_t batch_stream(int step, int rank) {
  return (static_cast<std::uint64_t>(step) << 32) | static_cast<std::uint32_t>(rank);
}

std::vector<float> hashed_rows(std::uint64_t seed, int step, int rank, int row_begin, int rows, int row_elems) {
  const int w = row_elems;
  std::vector<float> out(static_cast<std::size_t>(rows) * w);
  const std::uint64_t stream = batch_stream(step, rank);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < w; ++c)
      out[static_cast<std::size_t>(r) * w + c] =
          hashed_uniform(seed, stream, static_cast<std::uint64_t>(row_begin + r) * w + c);
  return out;
}

std::vector<float> batch_rows(const RunConfig& cfg, int step, int rank, int row_begin, int rows) {
  return hashed_rows(cfg.seed, step, rank, row_begin, rows, cfg.model.width);
}

void init_uniform_slice(std::uint64_t seed, int tensor, float bound, std::int64_t begin, std::int64_t count,
                        float* out) {
  for (std::int64_t i = 0; i < count; ++i)
    out[i] = bound * hashed_uniform(seed, kParamStream + tensor, static_cast<std::uint64_t>(begin + i));
}

std::int64_t tensor_offset(const ModelConfig& m, int t) {
  return static_cast<std::int64_t>(t / 2) * m.layer_elems() + (t % 2) * m.weight_elems();
}

std::vector<float> init_flat_slice(const RunConfig& cfg, std::int64_t begin, std::int64_t count) {
  return make_model(cfg.model)->init_flat_slice(cfg.seed, begin, count);
}

}  // namespace shardscope
