#include "harness/model/adam_state.hpp"

namespace shardscope {

AdamState make_adam_state(Backend& backend, std::size_t count) {
  AdamState s;
  s.exp_avg = backend.alloc(Category::optim, count);
  s.exp_avg_sq = backend.alloc(Category::optim, count);
  s.step = backend.alloc(Category::optim, 1);
  backend.fill(s.exp_avg.data(), 0.0f, count);
  backend.fill(s.exp_avg_sq.data(), 0.0f, count);
  backend.fill(s.step.data(), 0.0f, 1);
  return s;
}

}  // namespace shardscope
