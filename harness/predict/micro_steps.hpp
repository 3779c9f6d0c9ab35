// --accumulate K under zero2 and zero3 (docs/formulas.md, "Accumulation"): how the
// micro-steps of one optimizer step differ, for the walks that predict a step's peak
// (data_parallel_forms.cpp, fsdp2_forms.cpp, transformer_step.cpp). Each walk runs its
// instants once per distinct micro-step, in time order, and keeps the first maximum.
//   without --no-sync  every micro-step gathers, computes fresh full gradients and
//                      reduce-scatters them; from the second on the reduce-scatter writes
//                      a staging shard (comm: 4·shard_u, fsdp2's 4·A_u) added onto the
//                      shard's gradient;
//   with --no-sync     no micro-step but the last reduce-scatters: a unit's full gradient,
//                      made in its first backward, is kept to the end of the step (units
//                      above the running one hold theirs in the first micro-step, every
//                      unit in the middle ones, units below in the last); FSDP1's zero2
//                      also keeps each unit gathered from its first gather to the last
//                      micro-step's backward.
#pragma once

#include <vector>

#include "shardscope/config.hpp"

namespace shardscope {

struct MicroStep {
  bool grads_held = false;     // every unit's full gradient held when the micro-step begins
  bool reduces = true;         // units reduce-scatter (and free) their full gradients after backward
  bool adds_to_shard = false;  // the reduce-scatter writes a staging shard, added onto the gradient
  bool params_held = false;    // every unit gathered when the micro-step begins (FSDP1 zero2, --no-sync)
  bool keeps_params = false;   // units stay gathered after their backward (FSDP1 zero2, --no-sync)
};

// The distinct micro-steps of cfg's optimizer step in time order: one for K = 1; the
// first and the rest without --no-sync; with it the first, the middle ones (K >= 3) and
// the last.
std::vector<MicroStep> micro_steps(const RunConfig& cfg);

// How many times a step gathers and reduce-scatters each unit's bytes: zero3's and
// fsdp2's units are gathered in every micro-step, FSDP1's zero2 under --no-sync once;
// reduce-scatters run in every micro-step, or once under --no-sync.
int gathers_per_step(const RunConfig& cfg);
int reductions_per_step(const RunConfig& cfg);

}  // namespace shardscope
