// A pipeline along a mesh's pp axis with its stages replicated along dp (--mesh dp=D,pp=S
// --schedule): every emulated rank of W = 4 and 8, every schedule (gpipe, 1f1b,
// interleaved-1f1b, zbv), the MLP, GPT-2 and Llama, holds its closed forms per category,
// its saved tensors, and each group's bytes: the schedule's sends and the tied all-reduce
// in its pipeline group, its gradients' all-reduce (4 B a parameter, one call per chunk
// and one for a tied copy) in its data-parallel group. The in-place all-reduce adds no
// buffer: every figure of memory is the pipeline-only stage's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "harness/comm/fake_comm.hpp"
#include "harness/pipeline/run_pipeline.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "harness/run/records.hpp"
#include "shardscope/mesh.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

struct Case {
  std::string schedule;
  int chunks;
};

std::vector<ModelConfig> models_for(int S) {
  return {testing::model_of(2 * S + 1, 12, 2 * S, Activation::relu, Loss::mse),
          testing::gpt2_of(2 * S + 1, 8, 2, 13, 4, 2 * S, AttentionMode::flash),
          testing::llama_of(2 * S + 1, 8, 4, 2, 12, 13, 4, 2 * S, AttentionMode::math, true)};
}

const GroupCommRecord& group(const StageRecord& r, const char* axis) {
  for (const GroupCommRecord& g : *r.comm_groups)
    if (g.axis == axis) return g;
  throw std::runtime_error(std::string("no group ") + axis);
}

TEST(PipelineMesh, EveryEmulatedRankHoldsItsPredictions) {
  const std::vector<Case> cases = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zbv", 2}};
  for (const MeshShape mesh : {MeshShape{2, 1, 2, true}, MeshShape{2, 1, 4, true}, MeshShape{4, 1, 2, true}})
    for (const ModelConfig& model : models_for(mesh.pp))
      for (const Case& c : cases)
        for (const int M : {2 * mesh.pp - 1, 2 * mesh.pp}) {
          if (c.schedule == "interleaved-1f1b" && M % mesh.pp != 0) continue;  // its M is a multiple of S
          RunConfig cfg = testing::pipeline_config(c.schedule, M, c.chunks, model, 2, 3);
          cfg.mesh = mesh;
          const int W = mesh.world();
          const PipelineShape shape = pipeline_shape(cfg, mesh.pp);
          for (int rank = 0; rank < W; ++rank) {
            const MeshCoord at = mesh.coord(rank);
            SCOPED_TRACE(model.name + " " + c.schedule + " --mesh " + mesh.text() + " M=" + std::to_string(M) +
                         " rank " + std::to_string(rank));
            CpuBackend backend;
            auto fake = make_fake_communicator(W, rank, &backend);
            const StageRecord r = run_pipeline(cfg, backend, *fake);
            EXPECT_EQ(r.stage, at.pp);
            EXPECT_EQ(r.rank, rank);
            EXPECT_EQ(r.world, mesh.pp);
            // Measured == predicted.
            EXPECT_EQ(r.resting.total, r.predicted.resting_total);
            EXPECT_EQ(r.peak.total, r.predicted.peak_total);
            EXPECT_EQ(r.peak.by_category.bytes, r.predicted.peak_by_category.bytes);
            EXPECT_EQ(r.saved.peak_live_tensors, r.predicted.saved.peak_live_tensors);
            EXPECT_EQ(r.saved.peak_live_bytes, r.predicted.saved.peak_live_bytes);
            EXPECT_EQ(r.saved.total_tensors, r.predicted.saved.total_tensors);
            EXPECT_EQ(r.comm_bytes, r.predicted.comm_bytes);
            ASSERT_TRUE(r.comm_groups);
            for (const char* axis : {"dp", "tp", "pp"})
              EXPECT_EQ(group(r, axis).comm_bytes, group(r, axis).predicted_comm_bytes) << axis;
            EXPECT_EQ(group(r, "dp").members, mesh.group(rank, MeshAxis::dp));
            EXPECT_EQ(group(r, "pp").members, mesh.group(rank, MeshAxis::pp));

            // The forms without dp: the same stage of a pipeline alone holds the same bytes;
            // dp adds its all-reduce, 4 B for each parameter the stage holds (its resting
            // param bytes), in one call per chunk and one for a tied copy.
            const StageForms alone = predict_pipeline_stage(shape, at.pp);
            EXPECT_EQ(r.peak.total, alone.peak.total());
            EXPECT_EQ(r.resting.total, alone.resting.total());
            const std::int64_t params = r.resting.bytes[static_cast<int>(Category::param)];
            EXPECT_GT(params, 0);
            EXPECT_EQ(group(r, "dp").comm_bytes, params);
            EXPECT_EQ(group(r, "pp").comm_bytes, alone.comm_bytes());
            const bool tied_copy = alone.tied_all_reduce_bytes > 0 && at.pp == mesh.pp - 1;
            EXPECT_EQ(group(r, "dp").comm[static_cast<int>(CollKind::all_reduce)].calls, c.chunks + (tied_copy ? 1 : 0));
            EXPECT_EQ(group(r, "tp").comm_bytes, 0);
          }
        }
}

// dp = 1: nothing crosses the data-parallel group, and the records are the pipeline's.
TEST(PipelineMesh, OneReplicaReducesNothing) {
  RunConfig cfg = testing::pipeline_config("1f1b", 4, 1, testing::model_of(4, 12, 4, Activation::relu, Loss::mse), 2, 3);
  cfg.mesh = MeshShape{1, 1, 2, true};
  for (int rank = 0; rank < 2; ++rank) {
    CpuBackend backend;
    auto fake = make_fake_communicator(2, rank, &backend);
    const StageRecord r = run_pipeline(cfg, backend, *fake);
    EXPECT_EQ(group(r, "dp").comm_bytes, 0);
    EXPECT_EQ(r.comm_bytes, r.predicted.comm_bytes);
    EXPECT_EQ(r.peak.by_category.bytes, r.predicted.peak_by_category.bytes);
  }
}

}  // namespace
}  // namespace shardscope
