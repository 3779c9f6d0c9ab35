// plan --fit's search (harness/cli/plan_fit.cpp) and what it rests on: that every peak the
// prediction layer gives rises (never falls) with the batch and the sequence length.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/cli/cli.hpp"
#include "harness/cli/plan_fit.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "shardscope/check.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {
namespace {

RunConfig config(const std::vector<std::string>& flags) { return parse_run_args(flags, {}, "plan"); }

// Every rank's peak of a data-parallel configuration, or every stage's of a pipeline.
std::vector<std::int64_t> peaks(const RunConfig& cfg, int world) {
  std::vector<std::int64_t> out;
  if (cfg.pipeline()) {
    const PipelineShape shape = pipeline_shape(cfg, world);
    for (int s = 0; s < world; ++s) out.push_back(predict_pipeline_stage(shape, s).peak.total());
  } else {
    for (const Prediction& p : predict_data_parallel_ranks(cfg, world)) {
      EXPECT_TRUE(p.peak_known);
      out.push_back(p.peak_total);
    }
  }
  return out;
}

// The search against a peak written down: resting + per x value, fitted to memories at,
// around and between the steps, from 1 and from a pipeline's M; and in few predictions.
TEST(PlanFit, TheSearchFindsTheLargestValueThatFitsInLogarithmicallyManyPredictions) {
  const RunConfig cfg = config({"--layers", "2", "--width", "8"});
  constexpr std::int64_t kResting = 1'000'000, kPer = 4'096;
  for (const std::int64_t smallest : {1, 3, 7}) {
    for (const std::int64_t b : {1, 2, 3, 7, 8, 9, 100, 4'097, 65'536, 1'234'567, 9'999'999}) {
      if (b < smallest) continue;
      for (const std::int64_t over : {std::int64_t{0}, std::int64_t{1}, kPer - 1}) {
        const std::int64_t memory = kResting + kPer * b + over;
        int predictions = 0;
        const FitRecord fit = fit_configuration(cfg, FitDimension::batch, memory, smallest, [&](const RunConfig& c) {
          ++predictions;
          ConfigPeak p;
          p.resting = kResting;
          p.peak = kResting + kPer * c.model.batch;
          p.limiting = c.model.batch % 3;
          return p;
        });
        SCOPED_TRACE("smallest " + std::to_string(smallest) + ", b " + std::to_string(b) + ", memory " +
                     std::to_string(memory));
        ASSERT_TRUE(fit.value);
        EXPECT_EQ(*fit.value, b);
        EXPECT_EQ(fit.bound, "memory");
        EXPECT_EQ(fit.dimension, "batch");
        EXPECT_EQ(fit.smallest, smallest);
        EXPECT_EQ(*fit.peak_bytes, kResting + kPer * b);
        EXPECT_EQ(*fit.peak_bytes_next, kResting + kPer * (b + 1));
        EXPECT_EQ(*fit.limiting, (b + 1) % 3);  // the rank whose peak at b + 1 is over
        EXPECT_LE(predictions, 2 * static_cast<int>(std::ceil(std::log2(b + 1.0))) + 3);
      }
    }
  }
  // Nothing fits at the smallest value: the model states alone, or the peak there.
  const auto flat = [](std::int64_t resting, std::int64_t peak) {
    return [=](const RunConfig&) {
      ConfigPeak p;
      p.resting = resting;
      p.peak = peak;
      p.limiting = 2;
      return p;
    };
  };
  FitRecord fit = fit_configuration(cfg, FitDimension::batch, 999, 1, flat(1'000, 2'000));
  EXPECT_FALSE(fit.value);
  EXPECT_EQ(fit.bound, "model_states");
  EXPECT_EQ(*fit.resting_bytes, 1'000);
  fit = fit_configuration(cfg, FitDimension::batch, 1'999, 4, flat(1'000, 2'000));
  EXPECT_FALSE(fit.value);
  EXPECT_EQ(fit.bound, "peak");
  EXPECT_EQ(*fit.peak_bytes_next, 2'000);
  EXPECT_EQ(*fit.limiting, 2);
  EXPECT_NE(fit.reason.find("even at batch 4"), std::string::npos) << fit.reason;
  // Every value up to the largest --batch fits: the cap is the bound.
  fit = fit_configuration(cfg, FitDimension::batch, 2'000, 1, flat(1'000, 2'000));
  EXPECT_EQ(*fit.value, kMostBatch);
  EXPECT_EQ(fit.bound, "largest_accepted");
  EXPECT_FALSE(fit.peak_bytes_next);
  // A peak without a closed form answers that, unless the states at rest are already over.
  const auto unknown = [](const RunConfig&) {
    ConfigPeak p;
    p.known = false;
    p.resting = 1'000;
    return p;
  };
  EXPECT_EQ(fit_configuration(cfg, FitDimension::batch, 2'000, 1, unknown).bound, "peak_unknown");
  EXPECT_EQ(fit_configuration(cfg, FitDimension::batch, 999, 1, unknown).bound, "model_states");
  // The MLP has no sequence.
  EXPECT_THROW(fit_configuration(cfg, FitDimension::seq, 2'000, 1, flat(1, 2)), UsageError);
  EXPECT_THROW(parse_fit_dimension("rows"), UsageError);
}

// What the bisection rests on (docs/formulas.md, "Fitting a memory size"): every rank's
// (stage's) peak at batch b + 1 is at least its peak at b, for every strategy and
// schedule, units, worlds, activations, losses, GPT-2 (whose math attention saves
// differently at one sequence) and Llama in both attention modes, at every sequence length.
TEST(PlanFit, EveryPeakRisesWithTheBatchAndTheSequence) {
  std::vector<std::pair<std::vector<std::string>, int>> cases;
  for (const char* strategy : {"ddp", "zero1", "zero2", "zero3"})
    for (const char* units : {"1", "all"})
      for (int world : {1, 2, 3, 4})
        cases.push_back({{"--strategy", strategy, "--units", units, "--layers", "5", "--width", "12",
                          "--activation", "relu", "--loss", world % 2 ? "mse" : "sum"},
                         world});
  for (const char* schedule : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"})
    for (int world : {2, 3})
      cases.push_back({{"--schedule", schedule, "--microbatches", std::to_string(2 * world), "--chunks",
                        std::string(schedule) == "interleaved-1f1b" ? "2" : "1", "--layers", "12", "--width", "10",
                        "--activation", "relu", "--loss", "mse"},
                       world});
  for (const char* strategy : {"ddp", "zero1", "zero3"})
    for (const char* attention : {"flash", "math"})
      cases.push_back({{"--model", "gpt2", "--strategy", strategy, "--layers", "2", "--hidden", "32", "--heads", "4",
                        "--vocab", "97", "--positions", "96", "--seq", "24", "--attention", attention},
                       2});
  for (const char* strategy : {"ddp", "zero2", "zero3"})
    for (const char* attention : {"flash", "math"})
      cases.push_back({{"--model", "llama", "--strategy", strategy, "--layers", "2", "--hidden", "32", "--heads", "4",
                        "--kv-heads", "2", "--ffn", "48", "--vocab", "97", "--positions", "96", "--seq", "24",
                        "--attention", attention},
                       3});
  int checked = 0;
  for (const auto& [flags, world] : cases) {
    RunConfig cfg = config(flags);
    const bool transformer = cfg.model.is_transformer();
    const int smallest = cfg.pipeline() ? pipeline_microbatches(cfg, world) : 1;
    std::string joined;
    for (const std::string& f : flags) joined += f + " ";
    SCOPED_TRACE(joined + "W=" + std::to_string(world));
    std::vector<std::int64_t> last;
    for (int b = smallest; b <= smallest + 40; ++b) {
      cfg.model.batch = b;
      const std::vector<std::int64_t> now = peaks(cfg, world);
      for (std::size_t r = 0; r < last.size(); ++r) EXPECT_GE(now[r], last[r]) << "batch " << b << ", rank " << r;
      if (!last.empty()) checked += now.back() > last.back();
      last = now;
    }
    if (!transformer) continue;
    for (const int batch : {1, 3}) {
      cfg.model.batch = batch;
      last.clear();
      for (int s = 1; s <= cfg.model.transformer.positions; ++s) {
        cfg.model.transformer.seq = s;
        const std::vector<std::int64_t> now = peaks(cfg, world);
        for (std::size_t r = 0; r < last.size(); ++r) EXPECT_GE(now[r], last[r]) << "seq " << s << ", rank " << r;
        last = now;
      }
    }
  }
  EXPECT_GT(checked, 100);  // the peaks do move: the comparisons were not of constants
}

}  // namespace
}  // namespace shardscope
