// `plan --fit batch|seq`: the largest per-rank batch (or sequence length) at which every
// rank's predicted peak fits --memory (docs/formulas.md, "Fitting a memory size").
//
// The search knows nothing of strategies, schedules, engines or precisions: it sets one
// size in a configuration and asks the plan for that configuration's peak (a PeakOf, which
// calls the prediction layer), nothing else, so a new engine or precision fits with no
// change here. The peak rises with the batch and the sequence length in every form the
// prediction layer has (formulas.md argues it per form), so the search doubles, then
// bisects: about 2 log2(largest) predictions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "harness/records/result.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

enum class FitDimension { batch, seq };

// "batch" or "seq"; throws UsageError naming --fit otherwise.
FitDimension parse_fit_dimension(const std::string& text);

const char* fit_dimension_name(FitDimension dimension);

// A configuration's predicted peak over its ranks (a pipeline's stages).
struct ConfigPeak {
  bool known = true;         // false: the model's peak has no closed form in this build
  std::int64_t peak = 0;     // the highest rank's peak (when known)
  int limiting = 0;          // that rank, the lowest of equals
  std::int64_t resting = 0;  // the highest rank's bytes at rest (model states)
};

using PeakOf = std::function<ConfigPeak(const RunConfig&)>;

// The largest value of `dimension` at which peak_of(cfg with that value) fits `memory`,
// searched from `smallest` (1, or a pipeline's M for its batch) up to the largest value
// the command line accepts for cfg (--batch's cap; a transformer's positions, --seq's cap
// and the bound on a step's bytes). Throws UsageError naming --fit for seq of the MLP.
FitRecord fit_configuration(const RunConfig& cfg, FitDimension dimension, std::int64_t memory,
                            std::int64_t smallest, const PeakOf& peak_of);

}  // namespace shardscope
