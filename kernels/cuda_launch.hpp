// How the element-wise CUDA kernels launch (included by the .cu files alone): 256 threads a
// block, grid-stride loops over at most 4096 blocks (several waves of an H200's 132 SMs),
// and at least one block, so that an empty range still launches a valid grid.
#pragma once

#include <algorithm>
#include <cstddef>

namespace shardscope::cuda_ops {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

inline unsigned int blocks_for(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::max<std::size_t>(1, std::min(b, kMaxBlocks)));
}

}  // namespace shardscope::cuda_ops

// for (i = this thread's first index; i < n; i += the grid's thread count)
#define SS_GRID_STRIDE(i, n)                                                              \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
