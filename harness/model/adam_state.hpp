// AdamW state of one parameter tensor (or flat shard), in torch's layout: what every
// strategy and every pipeline stage keeps per tensor it updates.
#pragma once

#include <cstddef>

#include "shardscope/backend.hpp"

namespace shardscope {

struct AdamState {
  Buffer exp_avg;     // same shape as the parameter, optim
  Buffer exp_avg_sq;  // same shape as the parameter, optim
  Buffer step;        // one fp32 scalar (4 bytes), optim
};

// Allocates the three buffers (category optim) and zeroes them.
AdamState make_adam_state(Backend& backend, std::size_t count);

}  // namespace shardscope
