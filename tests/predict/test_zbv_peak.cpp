// zbv's step peak as a closed form (harness/predict/pipeline_forms, harness/predict/
// zbv_timing), held against what it predicts:
//   - the timing forms against the generator's lists and the lowering: every list
//     position's action and its inverse, every (kind, chunk) count before a position,
//     and the program step whose group carries every send (within the forms' reach);
//   - the peak against the walk of each stage's lowered program (tests/pipeline/
//     peak_walk, the executor's allocation order) on thousands of random MLP
//     configurations, beyond the sizes the executor tests run (test_pipeline_forms holds
//     the forms equal to the executor itself, transformers included).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "harness/predict/zbv_timing.hpp"
#include "pipeline/peak_walk.hpp"
#include "shardscope/schedule.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::model_of;

std::string label(int S, int M) { return "S=" + std::to_string(S) + " M=" + std::to_string(M); }

ZbvTiming::Kind kind_of(ActionKind k) {
  return k == ActionKind::F ? ZbvTiming::F : k == ActionKind::B ? ZbvTiming::B : ZbvTiming::W;
}

TEST(ZbvTiming, PositionsAreTheGeneratorsLists) {
  int checked = 0;
  for (int S = 1; S <= 8; ++S)
    for (int M = 2 * S - 1; M <= 2 * S + 12; ++M) {
      SCOPED_TRACE(label(S, M));
      const Schedule sched = make_schedule(ScheduleKind::zbv, S, M, 2);
      const ZbvTiming t(S, M);
      for (int s = 0; s < S; ++s) {
        const auto& list = sched.actions[static_cast<std::size_t>(s)];
        ASSERT_EQ(static_cast<std::int64_t>(list.size()), t.steps());
        std::int64_t count[3][2] = {{0, 0}, {0, 0}, {0, 0}};
        for (std::int64_t p = 0; p < t.steps(); ++p) {
          const Action& a = list[static_cast<std::size_t>(p)];
          const ZbvTiming::Op op = t.at(s, p);
          ASSERT_EQ(op.kind, kind_of(a.kind)) << "stage " << s << " position " << p;
          ASSERT_EQ(op.chunk, a.chunk) << "stage " << s << " position " << p;
          ASSERT_EQ(op.microbatch, a.microbatch) << "stage " << s << " position " << p;
          ASSERT_EQ(t.position(s, op.kind, op.chunk, op.microbatch), p) << "stage " << s;
          for (int k = 0; k < 3; ++k)
            for (int c = 0; c < 2; ++c)
              ASSERT_EQ(t.count_before(s, static_cast<ZbvTiming::Kind>(k), c, p), count[k][c])
                  << "stage " << s << " position " << p;
          ++count[static_cast<int>(op.kind)][op.chunk];
          ++checked;
        }
      }
    }
  EXPECT_GT(checked, 20'000);
}

// Each send sits in the group of the step that ZbvTiming::send_step names, at most 6S + 12
// steps after the action that made it (how far back the forms look for pending buffers).
TEST(ZbvTiming, SendsLeaveInTheLoweringsGroup) {
  int sends = 0;
  for (int S = 2; S <= 9; ++S)
    for (int M = 2 * S - 1; M <= 2 * S + 14; ++M) {
      SCOPED_TRACE(label(S, M));
      const Schedule sched = make_schedule(ScheduleKind::zbv, S, M, 2);
      const std::vector<StageProgram> programs = lower(sched);
      const ZbvTiming t(S, M);
      for (int s = 0; s < S; ++s) {
        const StageProgram& prog = programs[static_cast<std::size_t>(s)];
        ASSERT_EQ(static_cast<std::int64_t>(prog.size()), t.steps() + 1);
        std::int64_t owed = 0;
        for (std::size_t step = 0; step < prog.size(); ++step)
          for (const P2p& op : prog[step].comm) {
            if (!op.is_send) continue;
            ASSERT_EQ(stage_of_vstage(sched, op.vstage), s);
            const int c = chunk_of_vstage(sched, op.vstage);
            const ZbvTiming::Kind kind = op.payload == Payload::activation ? ZbvTiming::F : ZbvTiming::B;
            const std::int64_t p = t.position(s, kind, c, op.microbatch);
            const ZbvTiming::Consumer to = t.consumer(s, kind, c, op.microbatch);
            ASSERT_EQ(to.stage, op.peer);
            EXPECT_EQ(t.send_step(s, t.round(to.stage, to.position)), static_cast<std::int64_t>(step))
                << "stage " << s << ": " << payload_name(op.payload) << " of m=" << op.microbatch << ", vstage "
                << op.vstage << " (position " << p << ")";
            EXPECT_LE(static_cast<std::int64_t>(step) - p, 6 * S + 12);
            ++owed;
            ++sends;
          }
        // Stage s sends F0 down and B0 up unless at an end, F1 up and B1 down likewise;
        // the V's bottom passes to itself.
        const std::int64_t expected = (s + 1 < S ? 2 * M : 0) + (s > 0 ? 2 * M : 0);
        EXPECT_EQ(owed, expected) << "stage " << s;
      }
    }
  EXPECT_GT(sends, 10'000);
}

// The peak's closed form against the walk of the lowered program on every stage of many
// random configurations: S up to 8, M up to 2S + 59 (long steady states, where the forms
// skip whole periods), uneven micro-batches and splits, relu or not, mse or sum.
TEST(PipelineForms, ZbvPeakEqualsTheProgramsWalk) {
  std::mt19937 rng(20261203);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int stages_checked = 0, uneven_rows = 0, uneven_split = 0, long_steady = 0;
  for (int n = 0; n < 1500; ++n) {
    const int S = pick(1, 8), M = 2 * S - 1 + (pick(0, 3) == 0 ? pick(0, 60) : pick(0, 6)), V = 2 * S;
    const int B = M + pick(0, 2 * M + 3), L = V + pick(0, 8);
    const ModelConfig model = model_of(L, pick(1, 5), B, pick(0, 1) ? Activation::relu : Activation::none,
                                       pick(0, 1) ? Loss::mse : Loss::sum);
    RunConfig cfg = testing::pipeline_config("zbv", M, 2, model, 1, 3);
    if (pick(0, 1)) {
      cfg.split.assign(static_cast<std::size_t>(V), 1);
      for (int extra = L - V; extra > 0; --extra) ++cfg.split[static_cast<std::size_t>(pick(0, V - 1))];
    }
    std::string what = label(S, M) + " B=" + std::to_string(B) + " L=" + std::to_string(L) +
                       " width=" + std::to_string(model.width) +
                       (model.activation == Activation::relu ? " relu" : " none") +
                       (model.loss == Loss::mse ? " mse" : " sum");
    for (int k : cfg.split) what += " " + std::to_string(k);
    SCOPED_TRACE(what);
    const PipelineShape shape = pipeline_shape(cfg, S);
    const PipelineLayout layout = make_pipeline_layout(shape);
    const std::vector<StageProgram> programs = lower(layout.schedule);
    uneven_rows += B % M != 0;
    uneven_split += !cfg.split.empty();
    long_steady += 6 * M > 43 * S + 53;  // the forms skip steady-state periods (pipeline_forms.cpp, ZbvWalk)
    for (int s = 0; s < S; ++s) {
      SCOPED_TRACE("stage " + std::to_string(s));
      const StageForms f = predict_pipeline_stage(shape, s);
      const CategoryBytes walked = walk_peak(model, layout, s, programs[static_cast<std::size_t>(s)], f.resting);
      ASSERT_GT(walked.total(), f.resting.total());
      EXPECT_EQ(f.peak.total(), walked.total());
      for (int k = 0; k < kCategoryCount; ++k)
        EXPECT_EQ(f.peak.bytes[k], walked.bytes[k]) << "at the peak " << kCategoryNames[k];
      ++stages_checked;
    }
  }
  EXPECT_GT(stages_checked, 5000);
  EXPECT_GT(uneven_rows, 500);
  EXPECT_GT(uneven_split, 500);
  EXPECT_GT(long_steady, 80);
}

}  // namespace
}  // namespace shardscope
