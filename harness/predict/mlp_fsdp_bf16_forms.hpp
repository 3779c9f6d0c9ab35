// The MLP's step under --precision bf16 with zero2/zero3 (FSDP1's MixedPrecision(
// param_dtype=bf16, reduce_dtype=fp32), harness/strategies/fsdp.hpp and the MLP's
// param_bf16 Linears in harness/model/mlp.cpp): resting bytes and the reduce-scatter are
// fp32's, each unit is gathered in bf16 (2 B an element through a bf16 cast of the shard),
// its gradient made in bf16 and cast to fp32 for the reduce-scatter. docs/formulas.md,
// "bf16 under FSDP (MixedPrecision), the MLP".
#pragma once

#include <cstdint>
#include <vector>

#include "harness/strategies/partition.hpp"
#include "shardscope/config.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

// Replaces each rank's peak (bytes by category, phase, place), saved-after-forward figures
// and all-gather bytes, given with fp32's resting bytes and reduce-scatter, by the bf16
// step's closed forms over the units the strategy cuts (`units`).
void apply_mlp_fsdp_bf16_step(const RunConfig& cfg, const std::vector<Unit>& units, std::vector<Prediction>& ranks);

// The same under --engine fsdp2 (fully_shard's MixedPrecisionPolicy(param_dtype=bf16,
// reduce_dtype=fp32)): A[u] is a rank's padded shard elements of unit u, E[u] its elements.
void apply_mlp_fsdp2_bf16_step(const RunConfig& cfg, const std::vector<Unit>& units, const std::vector<std::int64_t>& A,
                               const std::vector<std::int64_t>& E, std::vector<Prediction>& ranks);

}  // namespace shardscope
