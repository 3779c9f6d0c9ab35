// Activation checkpointing inside pipeline stages (--checkpoint with --schedule; docs/formulas.md,
// "Checkpointed pipeline stages"): a stage's blocks wrapped as in the data-parallel runs
// (torch's non-reentrant checkpoint per block: full, every:K counting the model's blocks
// from its first; attention, the core alone), under gpipe, 1f1b and interleaved-1f1b. Every stage of
// S = 1..4 (played alone with the fake communicator past one stage), M = 2..8: the saved
// tensors (a re-run's saves among them), resting and peak bytes per category and p2p
// measured equal to the closed forms (harness/predict/pipeline_forms); peaks fall inside a
// re-run, elsewhere in a backward and in a forward. At S = 1 a checkpointed pipeline
// trains like the full batch.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/predict/gpt2_forms.hpp"
#include "harness/predict/llama_forms.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "shardscope/check.hpp"
#include "support/dp_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::gpt2_of;
using testing::llama_of;
using testing::model_of;
using testing::worst_violation;

CheckpointPolicy policy(const std::string& text) {
  CheckpointPolicy p;
  if (text == "attention") {
    p.kind = CheckpointKind::attention;
  } else if (text != "none") {
    p.kind = CheckpointKind::every;
    p.every = text == "full" ? 1 : std::stoi(text.substr(6));
  }
  return p;
}

// Where the measured peaks fell, over every stage played.
struct PeakPlaces {
  std::map<std::string, int> count;
  void add(const PeakRecord& p) {
    std::string key(phase_name(p.phase));
    if (p.place.kind == PlaceKind::recompute) key = "recompute";
    ++count[key];
  }
};

// Plays stage s of `stages` (self at one stage, else fake) and holds every figure the stage
// forms predict equal to what it measures.
void expect_stage_equals_forms(const RunConfig& cfg, int stages, int s, PeakPlaces& places) {
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
  EXPECT_EQ(tr.peak().total, p.peak.total()) << "measured peak at " << stage.peak_where();
  for (int k = 0; k < kCategoryCount; ++k)
    EXPECT_EQ(tr.peak().by_category.bytes[k], p.peak.bytes[k]) << "at the peak " << kCategoryNames[k];
  EXPECT_EQ(comm->ledger()[CollKind::send].bytes, p.p2p_sent_bytes);
  EXPECT_EQ(comm->ledger()[CollKind::recv].bytes, p.p2p_sent_bytes);
  EXPECT_EQ(comm->ledger()[CollKind::all_reduce].bytes, p.tied_all_reduce_bytes);
  places.add(tr.peak());
}

struct Grid {
  std::string schedule;
  int chunks;
};
const std::vector<Grid> kSchedules = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}};

std::string label(const Grid& g, int S, int s, int M, const std::string& ck) {
  return g.schedule + " S=" + std::to_string(S) + " s=" + std::to_string(s) + " M=" + std::to_string(M) +
         " --checkpoint " + ck;
}

TEST(PipelineCheckpoint, MlpMeasuredEqualsPredictedOnEveryStage) {
  PeakPlaces places;
  int checked = 0;
  for (const std::string ck : {"full", "every:2", "every:3"})
    for (const Activation act : {Activation::relu, Activation::none})
      for (const Loss loss : {Loss::mse, Loss::sum})
        for (int S = 1; S <= 4; ++S)
          for (const Grid& g : kSchedules)
            for (int M : {2, 3, 4, 8}) {
              if (g.chunks > 1 && M % S != 0) continue;
              const int V = S * g.chunks;
              // 2 or 3 layers a virtual stage (uneven when V is odd), a batch of 9: rows 2 and 1
              ModelConfig model = model_of(2 * V + (V % 2), 6, 9, act, loss);
              model.checkpoint = policy(ck);
              const RunConfig cfg = testing::pipeline_config(g.schedule, M, g.chunks, model, 2, 7);
              for (int s = 0; s < S; ++s) {
                SCOPED_TRACE(label(g, S, s, M, ck) + (act == Activation::relu ? " relu" : " none") +
                             (loss == Loss::mse ? " mse" : " sum"));
                expect_stage_equals_forms(cfg, S, s, places);
                ++checked;
              }
            }
  EXPECT_GT(checked, 500);
  EXPECT_GT(places.count["recompute"], 0);
  EXPECT_GT(places.count["backward"], 0);
  for (const auto& [where, n] : places.count) std::printf("  peaks in %s: %d\n", where.c_str(), n);
}

TEST(PipelineCheckpoint, Gpt2MeasuredEqualsPredictedOnEveryStage) {
  PeakPlaces places;
  int checked = 0;
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const std::string ck : {"full", "every:2", "attention"})
      for (const int ffn : {32, 4})  // 4·hidden; narrower than hidden (a re-run's output then tops d gelu)
      for (int S = 1; S <= 4; ++S)
        for (const Grid& g : kSchedules)
          for (int M : {2, 3, 4, 8}) {
            if (g.chunks > 1 && M % S != 0) continue;
            const int V = S * g.chunks;
            // B = 9 (micro-batches of 1 and 2 sequences: math's v a view of qkv with one);
            // the first virtual stage takes one block more
            ModelConfig model = gpt2_of(V + 1, 8, 2, 11, 4, 9, mode, ffn);
            model.checkpoint = policy(ck);
            RunConfig cfg = testing::pipeline_config(g.schedule, M, g.chunks, model, 2, 5);
            cfg.split.assign(static_cast<std::size_t>(V), 1);
            cfg.split[0] += 1;
            for (int s = 0; s < S; ++s) {
              SCOPED_TRACE(label(g, S, s, M, ck) + (mode == AttentionMode::flash ? " flash" : " math"));
              expect_stage_equals_forms(cfg, S, s, places);
              ++checked;
            }
          }
  EXPECT_GT(checked, 300);
  EXPECT_GT(places.count["recompute"], 0);
  EXPECT_GT(places.count["backward"], 0);
  for (const auto& [where, n] : places.count) std::printf("  peaks in %s: %d\n", where.c_str(), n);
}

TEST(PipelineCheckpoint, LlamaMeasuredEqualsPredictedOnEveryStage) {
  PeakPlaces places;
  int checked = 0;
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const bool tied : {false, true})
      for (const std::string ck : {"full", "every:2", "attention"})
        for (const int ffn : {12, 4})
        for (int S = 1; S <= 4; ++S)
          for (const Grid& g : kSchedules)
            for (int M : {2, 4, 8}) {
              if (g.chunks > 1 && M % S != 0) continue;
              const int V = S * g.chunks;
              ModelConfig model = llama_of(V + 2, 8, 4, 2, ffn, 11, 4, 9, mode, tied);
              model.checkpoint = policy(ck);
              RunConfig cfg = testing::pipeline_config(g.schedule, M, g.chunks, model, 2, 5);
              cfg.split.assign(static_cast<std::size_t>(V), 1);
              cfg.split[static_cast<std::size_t>(V) - 1] += 2;  // the last virtual stage takes two more
              for (int s = 0; s < S; ++s) {
                SCOPED_TRACE(label(g, S, s, M, ck) + (tied ? " tied " : " untied ") +
                             (mode == AttentionMode::flash ? "flash" : "math"));
                expect_stage_equals_forms(cfg, S, s, places);
                ++checked;
              }
            }
  EXPECT_GT(checked, 400);
  EXPECT_GT(places.count["recompute"], 0);
  EXPECT_GT(places.count["backward"], 0);
  for (const auto& [where, n] : places.count) std::printf("  peaks in %s: %d\n", where.c_str(), n);
}

// Under --precision bf16 (autocast, a region per micro-batch's forward): a wrapped block's
// weight casts live in autocast's cache only until the stage's forward ends, its re-run
// makes and saves them again until its backward.
TEST(PipelineCheckpoint, Bf16TransformersMeasuredEqualsPredictedOnEveryStage) {
  PeakPlaces places;
  int checked = 0;
  for (const std::string family : {"gpt2", "llama"})
    for (const std::string region : {"microbatch", "step"})
    for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
      for (const std::string ck : {"full", "every:2"})
        for (const int seq : {4, 32})  // 32: the activations outweigh the weights' widened copies
        for (int S = 1; S <= 4; ++S)
          for (const Grid& g : kSchedules)
            for (int M : {2, 4, 8}) {
              if (g.chunks > 1 && M % S != 0) continue;
              if (seq > 4 && M == 8) continue;
              const int V = S * g.chunks;
              ModelConfig model = family == "gpt2" ? gpt2_of(V + 1, 8, 2, 11, seq, 9, mode, 4)
                                                   : llama_of(V + 1, 8, 4, 2, 4, 11, seq, 9, mode, true);
              model.checkpoint = policy(ck);
              model.autocast = true;
              model.autocast_step = region == "step";
              RunConfig cfg = testing::pipeline_config(g.schedule, M, g.chunks, model, 2, 5);
              cfg.precision = PrecisionKind::bf16;
              cfg.split.assign(static_cast<std::size_t>(V), 1);
              cfg.split[0] += 1;
              for (int s = 0; s < S; ++s) {
                SCOPED_TRACE(label(g, S, s, M, ck) + " bf16 --autocast-region " + region + " " + family +
                             (mode == AttentionMode::flash ? " flash" : " math"));
                expect_stage_equals_forms(cfg, S, s, places);
                ++checked;
              }
            }
  EXPECT_GT(checked, 600);
  EXPECT_GT(places.count["recompute"], 0);
  EXPECT_GT(places.count["backward"], 0);
  for (const auto& [where, n] : places.count) std::printf("  peaks in %s: %d\n", where.c_str(), n);
}

// --autocast-region step with --checkpoint: a wrapped block's re-run finds its weights'
// casts in autocast's cache, still open around the backward (torch 2.15:
// bench/torch_pipeline_checkpoint.py --casts, 2L casts made for L wrapped layers over the
// whole step), so a stage's casts at its peak are the unwrapped stage's: each weight's once.
TEST(PipelineCheckpoint, StepRegionReRunsMakeNoCasts) {
  int checked = 0;
  for (const std::string family : {"gpt2", "llama"})
    for (const Grid& g : kSchedules)
      for (int s = 0; s < 2; ++s) {
        ModelConfig model = family == "gpt2" ? gpt2_of(5, 8, 2, 11, 4, 6, AttentionMode::flash)
                                             : llama_of(5, 8, 4, 2, 12, 11, 4, 6, AttentionMode::math, true);
        model.autocast = model.autocast_step = true;
        RunConfig plain = testing::pipeline_config(g.schedule, 4, g.chunks, model, 1, 5);
        plain.precision = PrecisionKind::bf16;
        RunConfig wrapped = plain;
        wrapped.model.checkpoint = policy("full");
        std::int64_t casts[2] = {0, 0};
        for (const RunConfig* cfg : {&plain, &wrapped}) {
          CpuBackend backend;
          auto comm = make_fake_communicator(2, s, &backend);
          PipelineStage stage(*cfg, backend, *comm);
          stage.setup();
          stage.prepare_batch(0);
          stage.step();
          casts[cfg == &wrapped] = backend.tracker().peak().by_category[Category::param_cast];
        }
        SCOPED_TRACE(family + " " + g.schedule + " stage " + std::to_string(s));
        EXPECT_GT(casts[0], 0);
        EXPECT_EQ(casts[1], casts[0]);
        ++checked;
      }
  EXPECT_EQ(checked, 12);
}

// A checkpointed bf16 pipeline computes what the unwrapped one does, to the bit: the
// gradients after two steps on one stage, each schedule.
TEST(PipelineCheckpoint, Bf16GradientsAreTheUnwrappedPipelinesBitForBit) {
  auto grads_of = [](const RunConfig& cfg) {
    CpuBackend backend;
    auto comm = make_communicator(CommOptions{"self", 0, 0}, &backend);
    PipelineStage stage(cfg, backend, *comm);
    stage.setup();
    for (int i = 0; i < cfg.steps; ++i) {
      stage.prepare_batch(i);
      stage.step();
    }
    std::vector<float> out;
    for (int c = 0; c < cfg.chunks; ++c) {
      const std::vector<float> g = stage.download_grads(c);
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  for (const std::string family : {"gpt2", "llama"})
    for (const Grid& g : kSchedules)
      for (const std::string ck : {"full", "every:2"}) {
        ModelConfig model = family == "gpt2" ? gpt2_of(5, 8, 2, 11, 4, 6, AttentionMode::math)
                                             : llama_of(5, 8, 4, 2, 12, 11, 4, 6, AttentionMode::flash, false);
        model.autocast = true;
        RunConfig plain = testing::pipeline_config(g.schedule, 2, g.chunks, model, 2, 9);
        plain.precision = PrecisionKind::bf16;
        RunConfig wrapped = plain;
        wrapped.model.checkpoint = policy(ck);
        SCOPED_TRACE(family + " " + g.schedule + " --checkpoint " + ck);
        const std::vector<float> a = grads_of(plain), b = grads_of(wrapped);
        ASSERT_TRUE(any_nonzero(a));
        EXPECT_EQ(a, b);
      }
}

// --checkpoint attention under math with a long sequence: the probabilities the core makes
// again in B (A = 4·B·H·T²) outweigh what its block released before them, so the saves'
// peak lies in a backward (the re-made probabilities beside the pair's saves).
TEST(PipelineCheckpoint, AttentionRecomputeRaisesTheSavesInBackward) {
  PeakPlaces places;
  for (const std::string family : {"gpt2", "llama"})
    for (int S = 1; S <= 3; ++S)
      for (const Grid& g : kSchedules)
        for (int M : {2, 3, 6}) {
          if (g.chunks > 1 && M % S != 0) continue;
          const int V = S * g.chunks;
          ModelConfig model = family == "gpt2" ? gpt2_of(V, 8, 2, 11, 32, 6, AttentionMode::math, 4)
                                               : llama_of(V, 8, 2, 2, 4, 11, 32, 6, AttentionMode::math, false);
          model.checkpoint = policy("attention");
          const RunConfig cfg = testing::pipeline_config(g.schedule, M, g.chunks, model, 1, 5);
          for (int s = 0; s < S; ++s) {
            SCOPED_TRACE(label(g, S, s, M, "attention") + " " + family + " math, T = 32");
            expect_stage_equals_forms(cfg, S, s, places);
          }
        }
  // The forms say the saves rise in such a backward (a piece between the first and the last).
  CheckpointPolicy attention = policy("attention");
  const PiecePlace middle{1, false, false, true, true, attention, 1};
  for (const std::string family : {"gpt2", "llama"})
    for (int rows : {1, 2}) {
      const ModelConfig m = family == "gpt2" ? gpt2_of(3, 8, 2, 11, 32, 6, AttentionMode::math, 4)
                                             : llama_of(3, 8, 2, 2, 4, 11, 32, 6, AttentionMode::math, false);
      const PieceForms f = family == "gpt2" ? gpt2_piece(m.transformer, rows, middle)
                                            : llama_piece(m.transformer, rows, middle);
      EXPECT_GT(f.recompute_live_bytes, 0) << family << " rows " << rows;
      EXPECT_EQ(f.recompute_saves, 1) << family;  // the probabilities, once a block
    }
}

// One stage, every schedule: the checkpointed pipeline's gradients and AdamW state are
// the full batch's (a re-run computes what the forward did, to the bit).
TEST(PipelineCheckpoint, OneStageTrainsLikeTheFullBatch) {
  for (const std::string ck : {"full", "every:2", "attention"})
    for (const std::string family : {"mlp", "gpt2", "llama"})
      for (const Grid& g : kSchedules) {
        if (family == "mlp" && ck == "attention") continue;
        ModelConfig model = family == "mlp"    ? model_of(4, 8, 6, Activation::relu, Loss::mse)
                            : family == "gpt2" ? gpt2_of(3, 8, 2, 13, 4, 5, AttentionMode::math)
                                               : llama_of(3, 8, 4, 2, 12, 13, 4, 5, AttentionMode::flash, false);
        model.checkpoint = policy(ck);
        RunConfig cfg = testing::pipeline_config(g.schedule, 3, g.chunks, model, 2, 11);
        if (family == "mlp") cfg.split = g.chunks == 2 ? std::vector<int>{2, 2} : std::vector<int>{4};
        SCOPED_TRACE(family + " " + g.schedule + " --checkpoint " + ck);
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"self", 0, 0}, &backend);
        PipelineStage stage(cfg, backend, *comm);
        stage.setup();
        for (int i = 0; i < cfg.steps; ++i) {
          stage.prepare_batch(i);
          EXPECT_GT(stage.step(), 0.0f);
        }
        RunConfig plain = cfg;  // the unwrapped model on the full batch
        plain.model.checkpoint = CheckpointPolicy{};
        const HostState ref = testing::reference_training(plain, 1);
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

}  // namespace
}  // namespace shardscope
