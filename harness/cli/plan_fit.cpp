#include "harness/cli/plan_fit.hpp"

#include <algorithm>
#include <optional>

#include "harness/cli/cli.hpp"
#include "harness/cli/transformer_flags.hpp"
#include "harness/report/cells.hpp"
#include "shardscope/check.hpp"
#include "shardscope/format.hpp"

namespace shardscope {
namespace {

using cells::group_digits;

// The largest value the command line accepts for a dimension, and what sets it.
struct Largest {
  std::int64_t value = 0;
  std::string bound;  // "positions" or "largest_accepted"
  std::string why;    // "the model's 1,024 positions (...)"
};

RunConfig with_value(RunConfig cfg, FitDimension dimension, std::int64_t value) {
  if (dimension == FitDimension::batch) cfg.model.batch = static_cast<int>(value);
  else cfg.model.transformer.seq = static_cast<int>(value);
  return cfg;
}

// What transformer_from_flags accepts beyond each flag's own cap: a step's bytes bound.
bool accepted(const RunConfig& cfg) {
  return !cfg.model.is_transformer() || step_within_bounds(cfg.model.transformer, cfg.model.batch);
}

Largest largest_accepted(const RunConfig& cfg, FitDimension dimension, std::int64_t smallest) {
  Largest most;
  if (dimension == FitDimension::batch) {
    most = {kMostBatch, "largest_accepted", "the largest --batch accepted, " + group_digits(kMostBatch)};
  } else if (cfg.model.transformer.positions <= TransformerCaps::seq) {
    const bool learned = cfg.model.name == "gpt2";
    most = {cfg.model.transformer.positions, "positions",
            "the model's " + group_digits(cfg.model.transformer.positions) + " positions (" +
                (learned ? "its learned position embeddings: no position past them has one"
                         : "max_position_embeddings: --seq is refused above them") +
                ")"};
  } else {
    most = {TransformerCaps::seq, "largest_accepted", "the largest --seq accepted, " + group_digits(TransformerCaps::seq)};
  }
  if (accepted(with_value(cfg, dimension, most.value))) return most;
  // The bound on a step's bytes rises with batch and seq, so what it accepts is a prefix:
  // bisect its end (smallest is at or below the value planned, which was accepted).
  std::int64_t lo = smallest, hi = most.value;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (accepted(with_value(cfg, dimension, mid)) ? lo : hi) = mid;
  }
  return {lo, "largest_accepted",
          "the largest --batch x --seq a run accepts for this model (4 B x batch x seq x (vocab + layers x "
          "(64 hidden + 8 ffn + heads x seq)) within 2^62 bytes)"};
}

}  // namespace

FitDimension parse_fit_dimension(const std::string& text) {
  if (text == "batch") return FitDimension::batch;
  if (text == "seq") return FitDimension::seq;
  throw UsageError("--fit: unknown '" + text + "'; allowed: batch, seq");
}

const char* fit_dimension_name(FitDimension dimension) {
  return dimension == FitDimension::batch ? "batch" : "seq";
}

FitRecord fit_configuration(const RunConfig& cfg, FitDimension dimension, std::int64_t memory,
                            std::int64_t smallest, const PeakOf& peak_of) {
  if (dimension == FitDimension::seq && !cfg.model.is_transformer())
    throw UsageError("--fit seq: the MLP has no sequence length; --fit batch fits its rows per rank");
  const std::string name = fit_dimension_name(dimension);
  const std::string who = cfg.pipeline() ? "stage " : "rank ";
  FitRecord fit;
  fit.dimension = name;
  fit.smallest = smallest;
  const Largest most = largest_accepted(cfg, dimension, smallest);
  const auto probe = [&](std::int64_t value) { return peak_of(with_value(cfg, dimension, value)); };

  const ConfigPeak first = probe(smallest);
  fit.resting_bytes = first.resting;
  const std::string at_smallest = name + " " + group_digits(smallest) +
                                  (cfg.pipeline() && dimension == FitDimension::batch ? " (one row per micro-batch)" : "");
  if (first.resting > memory) {
    fit.bound = "model_states";
    fit.reason = "the model states alone take " + format_bytes(first.resting) +
                 " at rest on the fullest rank, above --memory, whatever the " + name;
    return fit;
  }
  if (!first.known) {
    fit.bound = "peak_unknown";
    fit.reason = "peak unknown: this model's peak has no closed form in this build (its activation forms); "
                 "its model states at rest fit";
    return fit;
  }
  // The smallest value is judged alone and the search runs from the next: GPT-2's math
  // attention saves differently at one sequence (v a view of the qkv output, kept whole),
  // so its forms are argued monotone from smallest + 1 on (formulas.md), and the answer
  // is exact either way.
  const ConfigPeak second = smallest < most.value ? probe(smallest + 1) : first;
  SHARDSCOPE_REQUIRE(second.known, "plan --fit: a peak known at the smallest value is unknown at the next");
  const bool second_fits = smallest < most.value && second.peak <= memory;
  if (!second_fits && first.peak > memory) {
    fit.bound = "peak";
    fit.peak_bytes_next = first.peak;
    fit.limiting = first.limiting;
    fit.reason = "even at " + at_smallest + " the peak of " + who + std::to_string(first.limiting) + " is " +
                 format_bytes(first.peak) + ", above --memory (the model states at rest fit)";
    return fit;
  }
  // Doubling, then bisecting between the last value that fits and the first that does
  // not: the peak rises with the value, so every value below one that fits fits too.
  std::int64_t good = second_fits ? smallest + 1 : smallest;
  ConfigPeak good_peak = second_fits ? second : first;
  std::optional<std::int64_t> bad;
  ConfigPeak bad_peak;
  if (!second_fits && smallest < most.value) {
    bad = smallest + 1;
    bad_peak = second;
  }
  const auto step = [&](std::int64_t value) {
    const ConfigPeak p = probe(value);
    SHARDSCOPE_REQUIRE(p.known, "plan --fit: a peak known at the smallest value is unknown at a larger one");
    if (p.peak <= memory) {
      good = value;
      good_peak = p;
    } else {
      bad = value;
      bad_peak = p;
    }
  };
  while (!bad && good < most.value) step(std::min(most.value, std::max(2 * good, good + 1)));
  while (bad && *bad - good > 1) step(good + (*bad - good) / 2);
  fit.value = good;
  fit.peak_bytes = good_peak.peak;
  if (bad) {
    fit.bound = "memory";
    fit.peak_bytes_next = bad_peak.peak;
    fit.limiting = bad_peak.limiting;
    fit.reason = "at " + name + " " + group_digits(*bad) + " the peak of " + who + std::to_string(bad_peak.limiting) +
                 " is " + format_bytes(bad_peak.peak) + ", above --memory";
  } else {
    fit.bound = most.bound;
    fit.limiting = good_peak.limiting;
    fit.reason = "bounded by " + most.why + ", not by memory";
  }
  return fit;
}

}  // namespace shardscope
