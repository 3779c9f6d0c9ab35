// Pipelines of a transformer under --precision bf16 with the torch engine (autocast):
// each micro-batch's forward of a stage is its own autocast region, so each micro-batch in
// flight holds its own weights' bf16 casts (param_cast) from its F to its B, and the fp32
// residual stream crosses the stages (p2p bytes fp32's). Every stage of gpipe, 1f1b and
// interleaved-1f1b at S = 1 to 4 (played alone with the fake communicator past one stage),
// GPT-2 and Llama, both attention modes, even and uneven splits and micro-batches: saved
// tensors, resting and peak bytes per category (param_cast among them), p2p and the tied
// all-reduce measured equal to the closed forms (harness/predict/autocast_piece); under
// --mesh dp=D,pp=S every emulated rank of W = 4 and 8 likewise. At S = 1 a pipeline
// trains like one rank's autocast step on the full batch. What is not built is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/pipeline/run_pipeline.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "harness/run/records.hpp"
#include "shardscope/check.hpp"
#include "shardscope/mesh.hpp"
#include "support/dp_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

const char* mode_name(AttentionMode m) { return m == AttentionMode::flash ? "flash" : "math"; }

ModelConfig bf16(ModelConfig m) {
  m.autocast = true;
  return m;
}

RunConfig bf16_config(const std::string& schedule, int M, int chunks, const ModelConfig& model) {
  RunConfig cfg = testing::pipeline_config(schedule, M, chunks, bf16(model), 2, 5);
  cfg.precision = PrecisionKind::bf16;
  return cfg;
}

// Plays stage s of `stages` and holds every figure the forms give equal to what it measures.
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
  // Every micro-batch's casts are made and held: the peak has some.
  ASSERT_GT(tr.peak().by_category[Category::param_cast], 0);
  EXPECT_EQ(stage.saved().peak_live(), p.saved.peak_live_tensors);
  EXPECT_EQ(stage.saved().peak_live_bytes(), p.saved.peak_live_bytes);
  EXPECT_EQ(stage.saved().total(), p.saved.total_tensors);
  EXPECT_EQ(stage.saved().before_first_backward(), p.saved.before_first_backward);
  EXPECT_EQ(tr.current(), p.resting);
  EXPECT_EQ(tr.current()[Category::param_cast], 0);
  EXPECT_EQ(tr.peak().total, p.peak.total()) << "measured peak at " << stage.peak_where();
  for (int k = 0; k < kCategoryCount; ++k)
    EXPECT_EQ(tr.peak().by_category.bytes[k], p.peak.bytes[k]) << "at the peak " << kCategoryNames[k];
  EXPECT_EQ(comm->ledger()[CollKind::send].bytes, p.p2p_sent_bytes);
  EXPECT_EQ(comm->ledger()[CollKind::recv].bytes, p.p2p_sent_bytes);
  EXPECT_EQ(comm->ledger()[CollKind::all_reduce].bytes, p.tied_all_reduce_bytes);
}

struct Grid {
  std::string schedule;
  int chunks;
};
const std::vector<Grid> kBuilt = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}};

TEST(PipelineAutocast, Gpt2MeasuredEqualsPredictedOnEveryStage) {
  int checked = 0;
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (int S = 1; S <= 4; ++S)
      for (const Grid& g : kBuilt)
        for (int M : {1, 2, 3, 4, 6})
          for (const bool uneven : {false, true}) {
            if (g.chunks > 1 && M % S != 0) continue;
            const int V = S * g.chunks, L = V + 2;
            RunConfig cfg = bf16_config(g.schedule, M, g.chunks, testing::gpt2_of(L, 8, 2, 11, 4, 7, mode));
            if (uneven) {
              cfg.split.assign(static_cast<std::size_t>(V), 1);
              cfg.split[0] += 2;
            }
            for (int s = 0; s < S; ++s) {
              SCOPED_TRACE(g.schedule + " S=" + std::to_string(S) + " s=" + std::to_string(s) + " M=" +
                           std::to_string(M) + (uneven ? " uneven " : " even ") + mode_name(mode));
              expect_stage_equals_forms(cfg, S, s);
              ++checked;
            }
          }
  EXPECT_GT(checked, 100);
}

TEST(PipelineAutocast, LlamaMeasuredEqualsPredictedOnEveryStage) {
  int checked = 0;
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const bool tied : {false, true})
      for (int S = 1; S <= 4; ++S)
        for (const Grid& g : kBuilt)
          for (int M : {1, 2, 4})
            for (const bool uneven : {false, true}) {
              if (g.chunks > 1 && M % S != 0) continue;
              const int V = S * g.chunks, L = V + 2;
              RunConfig cfg =
                  bf16_config(g.schedule, M, g.chunks, testing::llama_of(L, 8, 4, 2, 12, 11, 4, 7, mode, tied));
              if (uneven) {
                cfg.split.assign(static_cast<std::size_t>(V), 1);
                cfg.split[static_cast<std::size_t>(V) - 1] += 2;
              }
              for (int s = 0; s < S; ++s) {
                SCOPED_TRACE(g.schedule + " S=" + std::to_string(S) + " s=" + std::to_string(s) + " M=" +
                             std::to_string(M) + (uneven ? " uneven" : " even") + (tied ? " tied " : " untied ") +
                             mode_name(mode));
                expect_stage_equals_forms(cfg, S, s);
                ++checked;
              }
            }
  EXPECT_GT(checked, 100);
}

// The MLP under autocast: its Linears give bf16, so the stages exchange bf16 activations and
// gradients (2 B an element: half fp32's p2p bytes); relu and none, mse and sum, odd widths
// and rows (a bf16 tensor of an odd element count).
TEST(PipelineAutocast, MlpMeasuredEqualsPredictedOnEveryStage) {
  int checked = 0;
  for (const Activation act : {Activation::relu, Activation::none})
    for (const Loss loss : {Loss::mse, Loss::sum})
      for (int S = 1; S <= 4; ++S)
        for (const Grid& g : kBuilt)
          for (int M : {1, 2, 3, 4, 6})
            for (const bool uneven : {false, true}) {
              if (g.chunks > 1 && M % S != 0) continue;
              const int V = S * g.chunks, L = V + 2;
              RunConfig cfg = bf16_config(g.schedule, M, g.chunks, testing::model_of(L, 9, 7, act, loss));
              if (uneven) {
                cfg.split.assign(static_cast<std::size_t>(V), 1);
                cfg.split[0] += 2;
              }
              for (int s = 0; s < S; ++s) {
                SCOPED_TRACE(g.schedule + " S=" + std::to_string(S) + " s=" + std::to_string(s) + " M=" +
                             std::to_string(M) + (uneven ? " uneven " : " even ") +
                             (act == Activation::relu ? "relu " : "none ") + (loss == Loss::mse ? "mse" : "sum"));
                expect_stage_equals_forms(cfg, S, s);
                ++checked;
              }
            }
  EXPECT_GT(checked, 200);
  // bf16 on the wire: half of fp32's p2p bytes.
  RunConfig cfg = bf16_config("1f1b", 4, 1, testing::model_of(4, 9, 7, Activation::relu, Loss::mse));
  RunConfig fp32 = testing::pipeline_config("1f1b", 4, 1, testing::model_of(4, 9, 7, Activation::relu, Loss::mse), 2, 5);
  const StageForms b = predict_pipeline_stage(pipeline_shape(cfg, 2), 0);
  const StageForms f = predict_pipeline_stage(pipeline_shape(fp32, 2), 0);
  EXPECT_EQ(b.p2p_sent_bytes, 9LL * 7 * 2);  // stage 0 sends 7 rows of 9 bf16 activations
  EXPECT_EQ(2 * b.p2p_sent_bytes, f.p2p_sent_bytes);
}

// A stage holds each micro-batch's casts from its F to its B: GPipe's first stage, all M
// micro-batches in flight, holds M times the casts 1F1B's last stage (one in flight) holds
// of the same blocks at its peak, less the head's.
TEST(PipelineAutocast, EachMicrobatchInFlightHoldsItsOwnCasts) {
  const ModelConfig model = testing::gpt2_of(4, 8, 2, 11, 4, 4, AttentionMode::flash);
  const std::int64_t h = 8, f = 32, c = 2 * (4 * h * h + 2 * h * f);  // a block's casts, bytes
  for (const int M : {2, 4}) {
    RunConfig cfg = bf16_config("gpipe", M, 1, model);
    const StageForms s0 = predict_pipeline_stage(pipeline_shape(cfg, 2), 0);
    // Stage 0 holds blocks 0 and 1: M micro-batches' casts at the top block's last forward
    // GEMM or later, at least (M - 1)·2c + c.
    EXPECT_GE(s0.peak.bytes[static_cast<int>(Category::param_cast)], (M - 1) * 2 * c + c);
    EXPECT_LE(s0.peak.bytes[static_cast<int>(Category::param_cast)], M * 2 * c);
    expect_stage_equals_forms(cfg, 2, 0);
  }
}

TEST(PipelineAutocast, OneStageTrainsLikeTheFullBatch) {
  for (const bool llama : {false, true})
    for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
      for (const Grid& g : {Grid{"1f1b", 1}, Grid{"interleaved-1f1b", 2}}) {
        const ModelConfig model = llama ? testing::llama_of(3, 8, 4, 2, 12, 13, 4, 5, mode, true)
                                        : testing::gpt2_of(3, 8, 2, 13, 4, 5, mode);
        RunConfig cfg = bf16_config(g.schedule, 3, g.chunks, model);
        SCOPED_TRACE(model.name + " " + g.schedule + " " + mode_name(mode));
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
          for (auto [dst, src] :
               {std::pair{&params, stage.download_params(c)}, std::pair{&grads, stage.download_grads(c)}})
            dst->insert(dst->end(), src.begin(), src.end());
        ASSERT_EQ(grads.size(), ref.grads.size());
        // Rows are cut by sequence: a micro-batch's GEMMs and roundings are the full batch's
        // rows; only the parameter gradients' fp32 sums run in another order.
        std::size_t at = 0;
        EXPECT_EQ(worst_violation(grads, ref.grads, 1e-4, 1e-6, &at), 0.0) << "grads at " << at;
        EXPECT_EQ(worst_violation(params, ref.params, 1e-4, 4e-4, &at), 0.0) << "params at " << at;
      }
}

const GroupCommRecord& group(const StageRecord& r, const char* axis) {
  for (const GroupCommRecord& g : *r.comm_groups)
    if (g.axis == axis) return g;
  throw std::runtime_error(std::string("no group ") + axis);
}

// Every emulated rank of `mesh` running cfg along it holds its forms; dp all-reduces the
// fp32 gradients (4 B a parameter the stage holds; nothing with one replica).
void expect_mesh_ranks_as_predicted(const MeshShape& mesh, RunConfig cfg) {
  cfg.mesh = mesh;
  const int W = mesh.world();
  for (int rank = 0; rank < W; ++rank) {
    SCOPED_TRACE(cfg.model.name + " " + std::string(schedule_name(*cfg.schedule)) + " --mesh " + mesh.text() +
                 " rank " + std::to_string(rank));
    CpuBackend backend;
    auto fake = make_fake_communicator(W, rank, &backend);
    const StageRecord r = run_pipeline(cfg, backend, *fake);
    EXPECT_EQ(r.resting.total, r.predicted.resting_total);
    EXPECT_EQ(r.peak.total, r.predicted.peak_total);
    EXPECT_EQ(r.peak.by_category.bytes, r.predicted.peak_by_category.bytes);
    EXPECT_GT(r.peak.by_category.bytes[static_cast<int>(Category::param_cast)], 0);
    EXPECT_EQ(r.saved.peak_live_bytes, r.predicted.saved.peak_live_bytes);
    EXPECT_EQ(r.saved.total_tensors, r.predicted.saved.total_tensors);
    EXPECT_EQ(r.comm_bytes, r.predicted.comm_bytes);
    for (const char* axis : {"dp", "tp", "pp"})
      EXPECT_EQ(group(r, axis).comm_bytes, group(r, axis).predicted_comm_bytes) << axis;
    EXPECT_EQ(group(r, "dp").comm_bytes, mesh.dp > 1 ? r.resting.bytes[static_cast<int>(Category::param)] : 0);
  }
}

// --mesh dp=D,tp=T,pp=S: every emulated rank of dp=2,tp=2,pp=2 and tp=4,pp=2, GPT-2 and
// Llama (flash and math, tied and untied, biases, one kv head replicated on every tp rank),
// gpipe, 1f1b and interleaved-1f1b: each
// stage's blocks a tp rank's shards under autocast (its weights' casts a T-th, the
// row-parallel outputs all-reduced in bf16 over tp), the residual stream sent whole.
TEST(PipelineAutocast, TensorParallelMeshEveryEmulatedRankHoldsItsPredictions) {
  for (const MeshShape mesh : {MeshShape{2, 2, 2, true}, MeshShape{1, 4, 2, true}})
    for (const Grid& g : kBuilt) {
      const int S = mesh.pp, M = 2 * S;
      ModelConfig llama = testing::llama_of(2 * S + 1, 8, 4, 4, 8, 12, 4, 2 * S, AttentionMode::flash, false);
      llama.transformer.qkv_bias = llama.transformer.out_bias = true;
      for (const ModelConfig& model :
           {testing::llama_of(2 * S + 1, 8, 4, 4, 8, 12, 4, 2 * S, AttentionMode::math, true), llama,
            testing::gpt2_of(2 * S + 1, 8, 4, 12, 4, 2 * S, AttentionMode::flash),
            testing::gpt2_of(2 * S + 1, 8, 4, 12, 4, 2 * S, AttentionMode::math),
            testing::llama_of(2 * S + 1, 8, 4, 1, 8, 12, 4, 2 * S, AttentionMode::flash, false)})
        expect_mesh_ranks_as_predicted(mesh, bf16_config(g.schedule, M, g.chunks, model));
    }
}

// --mesh dp=D,pp=S: every emulated rank of W = 4 and 8, GPT-2, Llama and the MLP.
TEST(PipelineAutocast, MeshEveryEmulatedRankHoldsItsPredictions) {
  for (const MeshShape mesh : {MeshShape{2, 1, 2, true}, MeshShape{4, 1, 2, true}, MeshShape{2, 1, 4, true}})
    for (const Grid& g : kBuilt) {
      const int S = mesh.pp, M = 2 * S;
      for (const ModelConfig& model :
           {testing::llama_of(2 * S + 1, 8, 4, 2, 12, 13, 4, 2 * S, AttentionMode::math, true),
            testing::gpt2_of(2 * S + 1, 8, 2, 13, 4, 2 * S, AttentionMode::flash),
            testing::model_of(2 * S + 1, 12, 2 * S, Activation::relu, Loss::mse)})
        expect_mesh_ranks_as_predicted(mesh, bf16_config(g.schedule, M, g.chunks, model));
    }
}

// What is not built is refused naming the flags.
TEST(PipelineAutocast, RefusesWhatIsNotBuilt) {
  auto refused = [](const RunConfig& cfg, const std::string& words) {
    try {
      pipeline_shape(cfg, 2);
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "not refused: " << words;
  };
  const ModelConfig gpt2 = testing::gpt2_of(4, 8, 2, 11, 4, 4, AttentionMode::flash);
  refused(bf16_config("zb-h1", 2, 1, gpt2), "--schedule zb-h1");
  refused(bf16_config("zbv", 4, 2, gpt2), "--schedule zbv");
  RunConfig tp_zbv = bf16_config("zbv", 4, 2, testing::gpt2_of(4, 8, 2, 12, 4, 4, AttentionMode::flash));
  tp_zbv.mesh = MeshShape{1, 2, 2, true};
  refused(tp_zbv, "--schedule zbv");
  RunConfig mlp = bf16_config("1f1b", 2, 1, testing::model_of(4, 12, 4, Activation::relu, Loss::mse));
  mlp.mesh = MeshShape{1, 2, 2, true};
  refused(mlp, "--mesh tp=2");
}

// --autocast-region step: one autocast region around each stage's schedule step, so every
// parameter's cast is made by its chunk's first F and held (autocast's cache) to the step's
// end. Every stage of gpipe, 1f1b and interleaved-1f1b at S = 1 to 4, M = 2 to 4, GPT-2
// (flash, math), Llama (tied, untied) and the MLP (relu/none, mse/sum), even and uneven
// splits: measured equal to the forms, and the casts gone when the step ends.
RunConfig step_config(const std::string& schedule, int M, int chunks, const ModelConfig& model) {
  RunConfig cfg = bf16_config(schedule, M, chunks, model);
  cfg.model.autocast_step = true;
  return cfg;
}

TEST(PipelineAutocastStep, EveryFamilyMeasuredEqualsPredictedOnEveryStage) {
  int checked = 0;
  for (int S = 1; S <= 4; ++S)
    for (const Grid& g : kBuilt)
      for (int M : {2, 3, 4})
        for (const bool uneven : {false, true}) {
          if (g.chunks > 1 && M % S != 0) continue;
          const int V = S * g.chunks, L = V + 2;
          std::vector<ModelConfig> models = {
              testing::gpt2_of(L, 8, 2, 11, 4, 7, AttentionMode::flash),
              testing::gpt2_of(L, 8, 2, 11, 4, 7, AttentionMode::math),
              testing::llama_of(L, 8, 4, 2, 12, 11, 4, 7, AttentionMode::flash, false),
              testing::llama_of(L, 8, 4, 2, 12, 11, 4, 7, AttentionMode::math, true),
              testing::model_of(L, 9, 7, Activation::relu, Loss::mse),
              testing::model_of(L, 9, 7, Activation::none, Loss::sum)};
          for (const ModelConfig& model : models) {
            RunConfig cfg = step_config(g.schedule, M, g.chunks, model);
            if (uneven) {
              cfg.split.assign(static_cast<std::size_t>(V), 1);
              cfg.split[0] += 2;
            }
            for (int s = 0; s < S; ++s) {
              SCOPED_TRACE(model.name + " " + g.schedule + " S=" + std::to_string(S) + " s=" + std::to_string(s) +
                           " M=" + std::to_string(M) + (uneven ? " uneven" : " even"));
              expect_stage_equals_forms(cfg, S, s);
              ++checked;
            }
          }
        }
  EXPECT_GT(checked, 400);
}

// Under step a stage holds one cast of each weight however many micro-batches are in
// flight: GPipe's first stage of GPT-2 (blocks 0 and 1, M in flight) peaks with 2c of casts
// (the blocks' weights'), where a region per micro-batch holds M times as many; the
// saved-tensor instrument counts that one storage once.
TEST(PipelineAutocastStep, OneCastOfEachWeightWhateverIsInFlight) {
  const ModelConfig model = testing::gpt2_of(4, 8, 2, 11, 4, 4, AttentionMode::flash);
  const std::int64_t h = 8, f = 32, c = 2 * (4 * h * h + 2 * h * f);  // a block's casts, bytes
  const int cast = static_cast<int>(Category::param_cast);
  for (const int M : {2, 4}) {
    const StageForms step = predict_pipeline_stage(pipeline_shape(step_config("gpipe", M, 1, model), 2), 0);
    const StageForms each = predict_pipeline_stage(pipeline_shape(bf16_config("gpipe", M, 1, model), 2), 0);
    EXPECT_EQ(step.peak.bytes[cast], 2 * c);
    EXPECT_GE(each.peak.bytes[cast], (M - 1) * 2 * c + c);
    EXPECT_EQ(each.saved.peak_live_bytes - step.saved.peak_live_bytes, (M - 1) * 2 * c);
    EXPECT_EQ(step.saved.peak_live_tensors, each.saved.peak_live_tensors);  // every save still recorded
    expect_stage_equals_forms(step_config("gpipe", M, 1, model), 2, 0);
  }
}

// --mesh dp=D,pp=S and dp=D,tp=T,pp=S under step: every emulated rank.
TEST(PipelineAutocastStep, MeshEveryEmulatedRankHoldsItsPredictions) {
  for (const Grid& g : kBuilt) {
    for (const MeshShape mesh : {MeshShape{2, 1, 2, true}, MeshShape{1, 1, 4, true}}) {
      const int S = mesh.pp, M = 2 * S;
      for (const ModelConfig& model :
           {testing::llama_of(2 * S + 1, 8, 4, 2, 12, 13, 4, 2 * S, AttentionMode::math, true),
            testing::gpt2_of(2 * S + 1, 8, 2, 13, 4, 2 * S, AttentionMode::flash),
            testing::model_of(2 * S + 1, 12, 2 * S, Activation::relu, Loss::mse)})
        expect_mesh_ranks_as_predicted(mesh, step_config(g.schedule, M, g.chunks, model));
    }
    const MeshShape tp{2, 2, 2, true};
    for (const ModelConfig& model : {testing::llama_of(5, 8, 4, 4, 8, 12, 4, 4, AttentionMode::flash, false),
                                     testing::gpt2_of(5, 8, 4, 12, 4, 4, AttentionMode::math)})
      expect_mesh_ranks_as_predicted(tp, step_config(g.schedule, 4, g.chunks, model));
  }
}

}  // namespace
}  // namespace shardscope
