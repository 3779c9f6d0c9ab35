// Pipelines of a transformer (docs/design.md §4, "Transformers"): GPT-2's and Llama's
// stages of whole blocks, the embeddings with the first virtual stage and the final block
// and loss with the last, a tied embedding held on the first and the last stage and its
// gradient all-reduced between them. Every stage of gpipe, 1f1b, interleaved-1f1b, zb-h1 and zbv at
// S = 1 to 4 (played alone with the fake communicator past one stage), both attention
// modes, even and uneven splits and micro-batches: saved tensors, resting and peak bytes
// per category, p2p and the tied all-reduce measured equal to the closed forms
// (harness/predict/pipeline_forms). At S = 1 every schedule trains like the full batch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "shardscope/check.hpp"
#include "support/dp_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::gpt2_of;
using testing::llama_of;
using testing::worst_violation;

const char* mode_name(AttentionMode m) { return m == AttentionMode::flash ? "flash" : "math"; }

// Plays stage s of `stages` (self at one stage, else fake) and holds every figure the
// stage record predicts equal to what it measures. Returns false when a figure differs.
void expect_stage_equals_forms(const RunConfig& cfg, int stages, int s) {
  const PipelineShape shape = pipeline_shape(cfg, stages);
  CpuBackend backend;
  auto comm = stages == 1 ? make_communicator(CommOptions{"self", 0, 0}, &backend)
                          : make_fake_communicator(stages, s, &backend);
  PipelineStage stage(cfg, backend, *comm);
  stage.setup();
  for (int i = 0; i < cfg.steps; ++i) {
    stage.prepare_batch(i);
    stage.step();
  }
  const StageForms p = predict_pipeline_stage(shape, s);
  const Tracker& tr = backend.tracker();
  ASSERT_GT(stage.saved().total(), 0);
  ASSERT_GT(tr.peak().total, tr.current_total());
  EXPECT_EQ(stage.saved().peak_live(), p.saved.peak_live_tensors);
  EXPECT_EQ(stage.saved().peak_live_bytes(), p.saved.peak_live_bytes);
  EXPECT_EQ(stage.saved().total(), p.saved.total_tensors);
  EXPECT_EQ(stage.saved().before_first_backward(), p.saved.before_first_backward);
  EXPECT_EQ(tr.current(), p.resting);
  EXPECT_EQ(tr.current()[Category::activation] + tr.current()[Category::temp] + tr.current()[Category::comm], 0);
  EXPECT_EQ(tr.peak().total, p.peak.total()) << "measured peak at " << stage.peak_where();
  for (int k = 0; k < kCategoryCount; ++k)
    EXPECT_EQ(tr.peak().by_category.bytes[k], p.peak.bytes[k]) << "at the peak " << kCategoryNames[k];
  EXPECT_EQ(comm->ledger()[CollKind::send].bytes, p.p2p_sent_bytes);
  EXPECT_EQ(comm->ledger()[CollKind::recv].bytes, p.p2p_sent_bytes);
  EXPECT_EQ(comm->ledger()[CollKind::all_reduce].bytes, p.tied_all_reduce_bytes);
  // The tied embedding: held on the first and the last stage when they differ, the copy
  // on the last; 4·V·h all-reduced on both.
  const TransformerShape& t = cfg.model.transformer;
  const bool tied = cfg.model.name == "gpt2" || t.tied_embeddings;
  // zbv's V puts both on stage 0: no copy, nothing to reduce.
  const bool split = tied && stages > 1 && cfg.schedule != ScheduleKind::zbv;
  const bool holder = split && (s == 0 || s == stages - 1);
  EXPECT_EQ(p.tied_all_reduce_bytes, holder ? 4LL * t.vocab * t.hidden : 0);
  EXPECT_EQ(stage.holds_tied_copy(), split && s == stages - 1);
}

struct Grid {
  std::string schedule;
  int chunks;
};

// The micro-batch counts a grid runs: `counts`, or zbv's 2S-1 and 2S (up to the batch).
std::vector<int> microbatch_counts(const Grid& g, int S, std::vector<int> counts, int batch) {
  if (g.schedule != "zbv") return counts;
  std::vector<int> out = {2 * S - 1};
  if (2 * S <= batch) out.push_back(2 * S);
  return out;
}

TEST(PipelineTransformer, Gpt2MeasuredEqualsPredictedOnEveryStage) {
  const std::vector<Grid> schedules = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zb-h1", 1}, {"zbv", 2}};
  int checked = 0;
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (int S = 1; S <= 4; ++S)
      for (const Grid& g : schedules)
        for (int M : microbatch_counts(g, S, {1, 2, 3, 4, 6}, 7))
          for (const bool uneven : {false, true}) {
            if (g.chunks > 1 && M % S != 0) continue;
            const int V = S * g.chunks, L = V + 2;
            // B = 7: micro-batches of 1 and 2 sequences (math's v is a view of qkv with one)
            const ModelConfig model = gpt2_of(L, 8, 2, 11, 4, 7, mode);
            RunConfig cfg = testing::pipeline_config(g.schedule, M, g.chunks, model, 2, 5);
            if (uneven) {  // the first virtual stage takes the extra blocks
              cfg.split.assign(static_cast<std::size_t>(V), 1);
              cfg.split[0] += 2;
            }
            for (int s = 0; s < S; ++s) {
              SCOPED_TRACE(g.schedule + " S=" + std::to_string(S) + " s=" + std::to_string(s) + " M=" +
                           std::to_string(M) + (uneven ? " uneven" : " even") + " " + mode_name(mode));
              expect_stage_equals_forms(cfg, S, s);
              ++checked;
            }
          }
  EXPECT_GT(checked, 150);
}

// One head (math saves qkv, which v views, on every micro-batch), an ffn other than
// 4·hidden, positions past the sequence, three chunks.
TEST(PipelineTransformer, Gpt2OddShapesMeasuredEqualsPredicted) {
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (int S : {2, 3}) {
      const ModelConfig model = gpt2_of(3 * S + 1, 6, 1, 9, 3, 2 * S + 1, mode, 10, 5);
      for (const Grid& g : {Grid{"1f1b", 1}, Grid{"gpipe", 1}, Grid{"interleaved-1f1b", 3}, Grid{"zb-h1", 1},
                            Grid{"zbv", 2}}) {
        const RunConfig cfg =
            testing::pipeline_config(g.schedule, g.schedule == "zbv" ? 2 * S - 1 : S, g.chunks, model, 1, 9);
        for (int s = 0; s < S; ++s) {
          SCOPED_TRACE(g.schedule + " S=" + std::to_string(S) + " s=" + std::to_string(s) + " " + mode_name(mode));
          expect_stage_equals_forms(cfg, S, s);
        }
      }
    }
}

TEST(PipelineTransformer, Gpt2OneStageTrainsLikeTheFullBatch) {
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const Grid& g : {Grid{"gpipe", 1}, Grid{"1f1b", 1}, Grid{"interleaved-1f1b", 2}})
      for (int M : {1, 3}) {
        RunConfig cfg = testing::pipeline_config(g.schedule, M, g.chunks, gpt2_of(3, 8, 2, 13, 4, 5, mode), 2, 11);
        SCOPED_TRACE(g.schedule + " M=" + std::to_string(M) + " " + mode_name(mode));
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"self", 0, 0}, &backend);
        PipelineStage stage(cfg, backend, *comm);
        stage.setup();
        for (int i = 0; i < cfg.steps; ++i) {
          stage.prepare_batch(i);
          EXPECT_GT(stage.step(), 0.0f);
        }
        EXPECT_FALSE(stage.holds_tied_copy());
        const HostState ref = testing::reference_training(cfg, 1);
        ASSERT_TRUE(any_nonzero(ref.grads));
        std::vector<float> params, grads, exp_avg, exp_avg_sq;
        for (int c = 0; c < g.chunks; ++c)
          for (auto [dst, src] : {std::pair{&params, stage.download_params(c)}, std::pair{&grads, stage.download_grads(c)},
                                  std::pair{&exp_avg, stage.download_exp_avg(c)},
                                  std::pair{&exp_avg_sq, stage.download_exp_avg_sq(c)}})
            dst->insert(dst->end(), src.begin(), src.end());
        ASSERT_EQ(grads.size(), ref.grads.size());
        std::size_t at = 0;
        EXPECT_EQ(worst_violation(grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
        EXPECT_EQ(worst_violation(exp_avg, ref.exp_avg, 1e-5, 1e-7, &at), 0.0) << "exp_avg at " << at;
        EXPECT_EQ(worst_violation(exp_avg_sq, ref.exp_avg_sq, 1e-5, 1e-9, &at), 0.0) << "exp_avg_sq at " << at;
        // The key bias's gradient is zero in exact arithmetic (softmax ignores a constant
        // added to a row of scores): its fp32 gradient is rounding noise, summed here in
        // micro-batches, which AdamW's g / (sqrt(v) + 1e-8) turns into up to lr / 10 a step.
        EXPECT_EQ(worst_violation(params, ref.params, 1e-5, 4e-4, &at), 0.0) << "params at " << at;
      }
}

// Llama: grouped-query attention (2 kv heads of 4), an untied head and a tied one (the
// tied embedding then on the first and the last stage, as GPT-2's).
TEST(PipelineTransformer, LlamaMeasuredEqualsPredictedOnEveryStage) {
  const std::vector<Grid> schedules = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zb-h1", 1}, {"zbv", 2}};
  int checked = 0;
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const bool tied : {false, true})
      for (int S = 1; S <= 4; ++S)
        for (const Grid& g : schedules)
          for (int M : microbatch_counts(g, S, {1, 2, 4}, 7))
            for (const bool uneven : {false, true}) {
              if (g.chunks > 1 && M % S != 0) continue;
              const int V = S * g.chunks, L = V + 2;
              const ModelConfig model = llama_of(L, 8, 4, 2, 12, 11, 4, 7, mode, tied);
              RunConfig cfg = testing::pipeline_config(g.schedule, M, g.chunks, model, 2, 5);
              if (uneven) {
                cfg.split.assign(static_cast<std::size_t>(V), 1);
                cfg.split[static_cast<std::size_t>(V) - 1] += 2;  // the last virtual stage takes the extra blocks
              }
              for (int s = 0; s < S; ++s) {
                SCOPED_TRACE(g.schedule + " S=" + std::to_string(S) + " s=" + std::to_string(s) + " M=" +
                             std::to_string(M) + (uneven ? " uneven" : " even") + (tied ? " tied " : " untied ") +
                             mode_name(mode));
                expect_stage_equals_forms(cfg, S, s);
                ++checked;
              }
            }
  EXPECT_GT(checked, 200);
}

TEST(PipelineTransformer, LlamaOneStageTrainsLikeTheFullBatch) {
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const bool tied : {false, true})
      for (const Grid& g : {Grid{"1f1b", 1}, Grid{"interleaved-1f1b", 2}}) {
        RunConfig cfg =
            testing::pipeline_config(g.schedule, 3, g.chunks, llama_of(3, 8, 4, 2, 12, 13, 4, 5, mode, tied), 2, 11);
        SCOPED_TRACE(g.schedule + (tied ? " tied " : " untied ") + mode_name(mode));
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"self", 0, 0}, &backend);
        PipelineStage stage(cfg, backend, *comm);
        stage.setup();
        for (int i = 0; i < cfg.steps; ++i) {
          stage.prepare_batch(i);
          EXPECT_GT(stage.step(), 0.0f);
        }
        const HostState ref = testing::reference_training(cfg, 1);
        ASSERT_TRUE(any_nonzero(ref.grads));
        std::vector<float> params, grads;
        for (int c = 0; c < g.chunks; ++c)
          for (auto [dst, src] : {std::pair{&params, stage.download_params(c)}, std::pair{&grads, stage.download_grads(c)}})
            dst->insert(dst->end(), src.begin(), src.end());
        ASSERT_EQ(grads.size(), ref.grads.size());
        std::size_t at = 0;
        EXPECT_EQ(worst_violation(grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
        EXPECT_EQ(worst_violation(params, ref.params, 1e-5, 4e-4, &at), 0.0) << "params at " << at;
      }
}

// The zero-bubble split through the executor. On one stage zb-h1 runs F(m) B(m) W(m)
// for each m: its gradients are 1F1B's, written in the same order, to the bit, and every
// stage of S = 2, 3 (the fake communicator) ends its steps with every save released and
// nothing activation or temp at rest.
std::vector<float> one_stage_grads(const RunConfig& cfg, ScheduleKind kind) {
  CpuBackend backend;
  auto comm = make_communicator(CommOptions{"self", 0, 0}, &backend);
  const int L = cfg.model.transformer.layers;
  PipelineStage stage(cfg, backend, *comm, make_pipeline_layout(PipelineShape{cfg.model, kind, 1, 3, 1, {L}}));
  stage.setup();
  for (int i = 0; i < cfg.steps; ++i) {
    stage.prepare_batch(i);
    EXPECT_GT(stage.step(), 0.0f);
  }
  return stage.download_grads(0);
}

TEST(PipelineTransformer, ZeroBubbleSplitOnOneStageIsOneFOneBToTheBit) {
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const ModelConfig& model : {gpt2_of(3, 8, 2, 13, 4, 5, mode), llama_of(3, 8, 4, 2, 12, 13, 4, 5, mode, false),
                                     llama_of(3, 8, 4, 2, 12, 13, 4, 5, mode, true)}) {
      SCOPED_TRACE(model.name + " " + mode_name(mode) + (model.transformer.tied_embeddings ? " tied" : ""));
      const RunConfig cfg = testing::pipeline_config("1f1b", 3, 1, model, 2, 11);
      const std::vector<float> zb = one_stage_grads(cfg, ScheduleKind::zb_h1),
                               ref = one_stage_grads(cfg, ScheduleKind::one_f_one_b);
      ASSERT_TRUE(any_nonzero(ref));
      EXPECT_EQ(zb, ref);
    }
}

TEST(PipelineTransformer, ZeroBubbleSplitStagesReleaseEverySave) {
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (int S : {2, 3}) {
      const ModelConfig model = gpt2_of(S + 1, 8, 2, 13, 4, 5, mode);
      const RunConfig cfg = testing::pipeline_config("1f1b", 4, 1, model, 1, 11);
      for (int s = 0; s < S; ++s) {
        SCOPED_TRACE(std::string(mode_name(mode)) + " S=" + std::to_string(S) + " s=" + std::to_string(s));
        CpuBackend backend;
        auto comm = make_fake_communicator(S, s, &backend);
        std::vector<int> split(static_cast<std::size_t>(S), 1);
        split.back() += 1;
        PipelineStage stage(cfg, backend, *comm,
                            make_pipeline_layout(PipelineShape{cfg.model, ScheduleKind::zb_h1, S, 4, 1, split}));
        stage.setup();
        stage.prepare_batch(0);
        stage.step();
        EXPECT_EQ(stage.saved().live(), 0);
        EXPECT_EQ(backend.tracker().current()[Category::activation], 0);
        EXPECT_EQ(backend.tracker().current()[Category::temp], 0);
        if (s == S - 1) {  // the fake communicator sends zeros up the chain
          EXPECT_TRUE(any_nonzero(stage.download_grads(0)));
        }
      }
    }
}

// zb-h1's saved-tensor figures on every stage (peak live count and distinct bytes with
// half pairs waiting for their W, total, before the first backward) equal the forms:
// GPT-2 and Llama (grouped-query, tied and untied), flash and math, S = 1 to 4, M = 1, 2,
// 4, 5, even and uneven splits (the grids above hold every figure, peak bytes included).
TEST(PipelineTransformer, ZeroBubbleSplitSavesEqualTheFormsOnEveryStage) {
  int checked = 0;
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (int family = 0; family < 3; ++family)
      for (int S = 1; S <= 4; ++S)
        for (int M : {1, 2, 4, 5})
          for (const bool uneven : {false, true}) {
            const int L = S + 2;
            const ModelConfig model = family == 0 ? gpt2_of(L, 8, 2, 11, 4, 5, mode)
                                                  : llama_of(L, 8, 4, 2, 12, 11, 4, 5, mode, family == 2);
            const RunConfig cfg = testing::pipeline_config("1f1b", M, 1, model, 1, 5);
            std::vector<int> split = tensor_split_sizes(L, S);
            if (uneven) {
              split.assign(static_cast<std::size_t>(S), 1);
              split.back() += 2;
            }
            const PipelineShape shape{model, ScheduleKind::zb_h1, S, M, 1, split};
            for (int s = 0; s < S; ++s) {
              SCOPED_TRACE(model.name + " S=" + std::to_string(S) + " s=" + std::to_string(s) + " M=" +
                           std::to_string(M) + (uneven ? " uneven " : " even ") + mode_name(mode) +
                           (model.transformer.tied_embeddings ? " tied" : ""));
              CpuBackend backend;
              auto comm = S == 1 ? make_communicator(CommOptions{"self", 0, 0}, &backend)
                                 : make_fake_communicator(S, s, &backend);
              PipelineStage stage(cfg, backend, *comm, make_pipeline_layout(shape));
              stage.setup();
              stage.prepare_batch(0);
              stage.step();
              const StageForms p = predict_pipeline_stage(shape, s);
              ASSERT_GT(stage.saved().total(), 0);
              EXPECT_EQ(stage.saved().peak_live(), p.saved.peak_live_tensors);
              EXPECT_EQ(stage.saved().peak_live_bytes(), p.saved.peak_live_bytes);
              EXPECT_EQ(stage.saved().total(), p.saved.total_tensors);
              EXPECT_EQ(stage.saved().before_first_backward(), p.saved.before_first_backward);
              EXPECT_EQ(stage.saved().live(), 0);
              ++checked;
            }
          }
  EXPECT_EQ(checked, 2 * 3 * 2 * 4 * 10);
}

TEST(PipelineTransformer, SplitCountsTransformerBlocks) {
  const ModelConfig model = gpt2_of(5, 8, 2, 11, 4, 4, AttentionMode::flash);
  RunConfig cfg = testing::pipeline_config("1f1b", 2, 1, model, 1, 1);
  // The default: 5 transformer blocks as tensor_split, the embeddings (block 0) first and
  // the final block (6) last.
  EXPECT_EQ(make_pipeline_layout(cfg, 2).bounds, (std::vector<int>{0, 4, 7}));
  cfg.split = {1, 4};
  EXPECT_EQ(make_pipeline_layout(cfg, 2).bounds, (std::vector<int>{0, 2, 7}));
  cfg.split = {1, 5};
  EXPECT_THROW(pipeline_shape(cfg, 2), UsageError);  // sums to 6, not --layers 5
  cfg.split.clear();
  EXPECT_THROW(pipeline_shape(cfg, 6), UsageError);  // 6 stages of 5 blocks
}

}  // namespace
}  // namespace shardscope
