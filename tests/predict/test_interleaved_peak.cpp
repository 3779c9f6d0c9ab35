// Interleaved 1F1B's step peak as a closed form (harness/predict/pipeline_forms,
// harness/predict/interleaved_timing), held against what it predicts:
//   - the timing forms against the schedule's lists and the lowering: every list
//     position's action, and the program step whose group carries every send;
//   - the peak against the walk of each stage's lowered program (tests/pipeline/
//     peak_walk, the executor's allocation order) on thousands of random configurations,
//     beyond the sizes the executor tests run (test_pipeline_forms holds the forms equal
//     to the executor itself).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/predict/interleaved_timing.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "pipeline/peak_walk.hpp"
#include "shardscope/schedule.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::model_of;

std::string label(int S, int M, int v) {
  return "S=" + std::to_string(S) + " M=" + std::to_string(M) + " v=" + std::to_string(v);
}

// Every position of every stage's list is the action the forms name, and the counts of
// forwards and backwards before it are the forms'.
TEST(InterleavedTiming, PositionsAreTheGeneratorsLists) {
  int checked = 0;
  for (int S = 1; S <= 8; ++S)
    for (int v = 2; v <= 4; ++v)
      for (int M = S; M <= 5 * S; M += S) {
        SCOPED_TRACE(label(S, M, v));
        const Schedule sched = make_schedule(ScheduleKind::interleaved_1f1b, S, M, v);
        const InterleavedTiming t(S, M, v);
        for (int s = 0; s < S; ++s) {
          const auto& list = sched.actions[static_cast<std::size_t>(s)];
          ASSERT_EQ(static_cast<std::int64_t>(list.size()), t.steps());
          std::int64_t fwds = 0, bwds = 0;
          for (std::int64_t p = 0; p < t.steps(); ++p) {
            const Action& a = list[static_cast<std::size_t>(p)];
            ASSERT_EQ(t.forwards_before(s, p), fwds) << "stage " << s << " position " << p;
            ASSERT_EQ(t.backwards_before(s, p), bwds) << "stage " << s << " position " << p;
            const bool fwd = t.is_forward(s, p);
            ASSERT_EQ(fwd, a.kind == ActionKind::F) << "stage " << s << " position " << p;
            const std::int64_t k = t.index_at(s, p);
            ASSERT_EQ(t.microbatch(k), a.microbatch);
            ASSERT_EQ(fwd ? t.forward_chunk(k) : t.backward_chunk(k), a.chunk);
            ASSERT_EQ(fwd ? t.forward_position(s, t.forward_index(a.microbatch, a.chunk))
                          : t.backward_position(s, t.backward_index(a.microbatch, a.chunk)),
                      p);
            (fwd ? fwds : bwds) += 1;
            ++checked;
          }
        }
      }
  EXPECT_GT(checked, 50'000);
}

// Each send sits in the group of the step that InterleavedTiming::send_step names: the
// lowering's rounds are the forms' rounds where they decide anything.
TEST(InterleavedTiming, SendsLeaveInTheLoweringsGroup) {
  int sends = 0;
  for (int S = 2; S <= 9; ++S)
    for (int v = 2; v <= 5; ++v)
      for (int M = S; M <= 6 * S; M += S) {
        SCOPED_TRACE(label(S, M, v));
        const Schedule sched = make_schedule(ScheduleKind::interleaved_1f1b, S, M, v);
        const std::vector<StageProgram> programs = lower(sched);
        const InterleavedTiming t(S, M, v);
        for (int s = 0; s < S; ++s) {
          const StageProgram& prog = programs[static_cast<std::size_t>(s)];
          ASSERT_EQ(static_cast<std::int64_t>(prog.size()), t.steps() + 1);
          std::int64_t owed = 0;
          for (std::size_t step = 0; step < prog.size(); ++step)
            for (const P2p& op : prog[step].comm) {
              if (!op.is_send) continue;
              ASSERT_EQ(stage_of_vstage(sched, op.vstage), s);
              const int c = chunk_of_vstage(sched, op.vstage);
              const std::int64_t p = op.payload == Payload::activation
                                         ? t.forward_position(s, t.forward_index(op.microbatch, c))
                                         : t.backward_position(s, t.backward_index(op.microbatch, c));
              const InterleavedTiming::Consumer to = t.consumer(s, p);
              ASSERT_EQ(to.stage, op.peer);
              EXPECT_EQ(t.send_step(s, p, t.round(to.stage, to.position)), static_cast<std::int64_t>(step))
                  << "stage " << s << ": " << payload_name(op.payload) << " of m=" << op.microbatch << ", vstage "
                  << op.vstage << " (position " << p << ")";
              ++owed;
              ++sends;
            }
          // Every virtual stage but the ends sends each micro-batch once per direction.
          std::int64_t expected = 0;
          for (int c = 0; c < v; ++c) {
            const int k = c * S + s;
            expected += (k + 1 < S * v ? M : 0) + (k > 0 ? M : 0);
          }
          EXPECT_EQ(owed, expected) << "stage " << s;
        }
      }
  EXPECT_GT(sends, 100'000);
}

// The peak's closed form against the walk of the lowered program, every stage of many
// random configurations: S up to 8, v up to 4, M up to 6S (long steady states, where
// the forms skip whole periods), uneven micro-batches and splits, relu or not, mse or
// sum.
TEST(PipelineForms, InterleavedPeakEqualsTheProgramsWalk) {
  std::mt19937 rng(20261202);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int stages_checked = 0, uneven_rows = 0, uneven_split = 0, long_steady = 0;
  for (int n = 0; n < 2000; ++n) {
    const int S = pick(1, 8), v = pick(2, 4), M = S * pick(1, 6), V = S * v;
    const int B = M + pick(0, 2 * M + 3), L = V + pick(0, 8);
    const ModelConfig model = model_of(L, pick(1, 5), B, pick(0, 1) ? Activation::relu : Activation::none,
                                       pick(0, 1) ? Loss::mse : Loss::sum);
    RunConfig cfg = testing::pipeline_config("interleaved-1f1b", M, v, model, 1, 3);
    if (pick(0, 1)) {
      cfg.split.assign(static_cast<std::size_t>(V), 1);
      for (int extra = L - V; extra > 0; --extra) ++cfg.split[static_cast<std::size_t>(pick(0, V - 1))];
    }
    std::string what = label(S, M, v) + " B=" + std::to_string(B) + " L=" + std::to_string(L) +
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
    long_steady += M >= 5 * S && v == 4;
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
  EXPECT_GT(stages_checked, 8000);
  EXPECT_GT(uneven_rows, 500);
  EXPECT_GT(uneven_split, 500);
  EXPECT_GT(long_steady, 50);
}

}  // namespace
}  // namespace shardscope
