// The MLP's step under --precision bf16 with ddp and zero1 (torch.autocast(bfloat16)
// semantics, harness/model/mlp.cpp): resting bytes and communication are fp32's
// (parameters, gradients and AdamW state stay fp32; gradients are all-reduced in fp32),
// the step's transients are bf16 and the weight casts param_cast; --checkpoint full|every:K
// too (a wrapped layer's casts cached to the loss, made again by its re-run). docs/formulas.md,
// "bf16 (autocast), the MLP".
#pragma once

#include <vector>

#include "shardscope/config.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

// Replaces each rank's peak (bytes by category, phase, place) and saved-after-forward
// figures, given with fp32's resting bytes, by autocast's closed forms.
void apply_mlp_autocast_step(const RunConfig& cfg, std::vector<Prediction>& ranks);

}  // namespace shardscope
