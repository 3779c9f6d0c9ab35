// The arguments of the math every backend runs (docs/design.md §5): the kernels (kernels/) and
// the Backend interface both take them, and a model's configuration names its activation
// and loss with them. Nothing here allocates or knows a backend.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardscope {

enum class Activation : std::uint8_t { none, relu };
enum class Loss : std::uint8_t { sum, mse };
enum class Trans : std::uint8_t { no, yes };

// torch.optim.AdamW's defaults, kept in double as torch keeps them (Python floats).
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// One parameter tensor (or shard) for the multi-tensor AdamW: all pointers hold n floats.
struct AdamWTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  std::size_t n;
  int step;  // the step number after increment (1 on the first update)
};

}  // namespace shardscope
