// Sequence-parallel pipeline stages (--mesh dp=D,tp=T,pp=S --sp --schedule), as Megatron
// runs them: each stage's blocks the --sp blocks, the tensor between stages the rank's
// seq/T tokens. Every emulated rank of dp=2,tp=2,pp=2 and tp=4,pp=2, GPT-2 and Llama,
// flash and math, gpipe, 1f1b and interleaved-1f1b, holds its closed forms per category,
// its saved tensors and each group's bytes (the tp group's all-gathers, reduce-scatters
// and all-reduces); it sends 1/T of the activations the stage without --sp sends and
// saves fewer bytes; the zero-bubble schedules are refused by name.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "harness/comm/fake_comm.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/pipeline/run_pipeline.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "harness/run/records.hpp"
#include "shardscope/check.hpp"
#include "shardscope/mesh.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

const GroupCommRecord& group(const StageRecord& r, const char* axis) {
  for (const GroupCommRecord& g : *r.comm_groups)
    if (g.axis == axis) return g;
  throw std::runtime_error(std::string("no group ") + axis);
}

// Shapes whose heads, kv heads, ffn, vocabulary and sequence divide by 4, and that give
// each of 4 virtual stages blocks.
std::vector<ModelConfig> models() {
  ModelConfig llama = testing::llama_of(4, 8, 4, 2, 8, 12, 4, 4, AttentionMode::flash, false);
  llama.transformer.qkv_bias = llama.transformer.out_bias = true;
  std::vector<ModelConfig> out = {testing::gpt2_of(4, 8, 4, 12, 4, 4, AttentionMode::flash),
                                  testing::gpt2_of(4, 8, 4, 12, 4, 4, AttentionMode::math),
                                  testing::llama_of(4, 8, 4, 4, 8, 12, 4, 4, AttentionMode::math, true), llama};
  for (ModelConfig& m : out) m.sequence_parallel = true;
  return out;
}

void expect_rank_holds_forms(const RunConfig& cfg, int rank) {
  const MeshShape& mesh = cfg.mesh;
  const MeshCoord at = mesh.coord(rank);
  CpuBackend backend;
  auto fake = make_fake_communicator(mesh.world(), rank, &backend);
  const StageRecord r = run_pipeline(cfg, backend, *fake);
  EXPECT_EQ(r.stage, at.pp);
  EXPECT_EQ(r.resting.total, r.predicted.resting_total);
  EXPECT_EQ(r.peak.total, r.predicted.peak_total);
  EXPECT_EQ(r.peak.by_category.bytes, r.predicted.peak_by_category.bytes);
  EXPECT_EQ(r.saved.peak_live_tensors, r.predicted.saved.peak_live_tensors);
  EXPECT_EQ(r.saved.peak_live_bytes, r.predicted.saved.peak_live_bytes);
  EXPECT_EQ(r.saved.total_tensors, r.predicted.saved.total_tensors);
  EXPECT_EQ(r.saved.before_first_backward, r.predicted.saved.before_first_backward);
  EXPECT_EQ(r.p2p_sent_bytes, r.predicted.p2p_sent_bytes);
  EXPECT_EQ(r.comm_bytes, r.predicted.comm_bytes);
  ASSERT_TRUE(r.comm_groups);
  for (const char* axis : {"dp", "tp", "pp"})
    EXPECT_EQ(group(r, axis).comm_bytes, group(r, axis).predicted_comm_bytes) << axis;
  // The tp group gathers and reduce-scatters (and all-reduces the norms' parts and the loss).
  const GroupCommRecord& tp = group(r, "tp");
  for (CollKind k : {CollKind::all_gather, CollKind::reduce_scatter, CollKind::all_reduce})
    EXPECT_GT(tp.comm[static_cast<int>(k)].bytes, 0) << kCollKindNames[static_cast<int>(k)];

  // The same stage without --sp: it sends T times the bytes (the whole activation) and
  // saves more.
  RunConfig whole_cfg = cfg;
  whole_cfg.model.sequence_parallel = false;
  const StageForms whole = predict_pipeline_stage(pipeline_shape(whole_cfg, mesh.pp), at.pp, mesh.dp);
  EXPECT_EQ(r.p2p_sent_bytes * mesh.tp, whole.p2p_sent_bytes);
  EXPECT_LT(r.saved.peak_live_bytes, whole.saved.peak_live_bytes);
}

TEST(PipelineSequenceParallel, EveryEmulatedRankHoldsItsPredictions) {
  struct Case {
    std::string schedule;
    int chunks;
  };
  const std::vector<Case> cases = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}};
  for (const MeshShape mesh : {MeshShape{2, 2, 2, true}, MeshShape{1, 4, 2, true}})
    for (const ModelConfig& model : models())
      for (const Case& c : cases)
        for (const int M : {2, 3, 4}) {
          if (c.schedule == "interleaved-1f1b" && M % mesh.pp != 0) continue;  // its M is a multiple of S
          RunConfig cfg = testing::pipeline_config(c.schedule, M, c.chunks, model, 2, 3);
          cfg.mesh = mesh;
          for (int rank = 0; rank < mesh.world(); ++rank) {
            SCOPED_TRACE(model.name + (model.transformer.attention == AttentionMode::flash ? " flash " : " math ") +
                         c.schedule + " --sp --mesh " + mesh.text() + " M=" + std::to_string(M) + " rank " +
                         std::to_string(rank));
            expect_rank_holds_forms(cfg, rank);
          }
        }
}

// The zero-bubble split of a sequence-parallel block is not built: zb-h1 and zbv refused.
TEST(PipelineSequenceParallel, ZeroBubbleSchedulesAreRefused) {
  for (const char* schedule : {"zb-h1", "zbv"}) {
    RunConfig cfg =
        testing::pipeline_config(schedule, 3, std::string(schedule) == "zbv" ? 2 : 1, models()[0], 2, 3);
    cfg.mesh = MeshShape{1, 2, 2, true};
    try {
      (void)pipeline_shape(cfg, cfg.mesh.pp);
      ADD_FAILURE() << "accepted " << schedule;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("--sp and --schedule ") + schedule), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace shardscope
