// Tensor-parallel pipeline stages (--mesh dp=D,tp=T,pp=S --schedule): every emulated rank
// of dp=2,tp=2,pp=2 and tp=4,pp=2, GPT-2, Llama and the MLP, gpipe, 1f1b, interleaved-1f1b,
// zb-h1 and zbv (B all-reducing what the whole backward does), holds its closed forms per
// category, its saved tensors and each group's bytes: the whole activation's sends and
// the tied all-reduce of the rank's V/T rows in its pipeline group, the blocks'
// all-reduces in its tensor-parallel group, its gradients' all-reduce in its
// data-parallel group; the tp ranks of a stage hold less than the stage of tp = 1.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "harness/comm/fake_comm.hpp"
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

struct Case {
  std::string schedule;
  int chunks;
};

// Shapes that split into 4 (heads, kv heads, ffn, vocabulary; the MLP's width) and give
// each of 4 virtual stages blocks (the MLP's an even number of layers).
std::vector<ModelConfig> models() {
  return {testing::gpt2_of(4, 8, 4, 12, 4, 4, AttentionMode::flash),
          testing::gpt2_of(4, 8, 4, 12, 4, 4, AttentionMode::math),
          testing::llama_of(4, 8, 4, 4, 8, 12, 4, 4, AttentionMode::math, true),
          testing::llama_of(4, 8, 4, 4, 8, 12, 4, 4, AttentionMode::flash, false),
          testing::model_of(8, 12, 4, Activation::relu, Loss::mse),
          testing::model_of(8, 12, 4, Activation::none, Loss::sum)};
}

void expect_rank_holds_forms(const RunConfig& cfg, int rank) {
  const MeshShape& mesh = cfg.mesh;
  const int W = mesh.world();
  const MeshCoord at = mesh.coord(rank);
  CpuBackend backend;
  auto fake = make_fake_communicator(W, rank, &backend);
  const StageRecord r = run_pipeline(cfg, backend, *fake);
  EXPECT_EQ(r.stage, at.pp);
  EXPECT_EQ(r.world, mesh.pp);
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
  EXPECT_EQ(group(r, "tp").members, mesh.group(rank, MeshAxis::tp));
  EXPECT_GT(group(r, "tp").comm_bytes, 0);
  // Every all-reduce of the tp group is one of the blocks' (nothing else uses it).
  EXPECT_EQ(group(r, "tp").comm[static_cast<int>(CollKind::all_reduce)].bytes, group(r, "tp").comm_bytes);

  // The stage at tp = 1 (the same pipeline alone): the rank's slice holds fewer parameters,
  // and sends the same whole activations (Megatron without sequence parallelism).
  PipelineShape whole = pipeline_shape(cfg, mesh.pp);
  whole.tp = 1;
  const StageForms one = predict_pipeline_stage(whole, at.pp);
  EXPECT_LT(r.resting.bytes[static_cast<int>(Category::param)], one.resting[Category::param]);
  EXPECT_EQ(r.p2p_sent_bytes, one.p2p_sent_bytes);
  EXPECT_EQ(one.tp_all_reduce_bytes, 0);
}

TEST(PipelineTensorParallel, EveryEmulatedRankHoldsItsPredictions) {
  const std::vector<Case> cases = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zb-h1", 1}, {"zbv", 2}};
  for (const MeshShape mesh : {MeshShape{2, 2, 2, true}, MeshShape{1, 4, 2, true}})
    for (const ModelConfig& model : models())
      for (const Case& c : cases)
        for (const int M : {2, 3, 4}) {
          if (c.schedule == "interleaved-1f1b" && M % mesh.pp != 0) continue;  // its M is a multiple of S
          if (c.schedule == "zbv" && M < 2 * mesh.pp - 1) continue;               // its V needs 2S-1
          RunConfig cfg = testing::pipeline_config(c.schedule, M, c.chunks, model, 2, 3);
          cfg.mesh = mesh;
          for (int rank = 0; rank < mesh.world(); ++rank) {
            SCOPED_TRACE(model.name + " " + c.schedule + " --mesh " + mesh.text() + " M=" + std::to_string(M) +
                         " rank " + std::to_string(rank));
            expect_rank_holds_forms(cfg, rank);
          }
        }
}

// What a tensor-parallel pipeline cannot run is refused naming the flags: an MLP stage
// cut inside a column-row pair, a shape that does not divide.
TEST(PipelineTensorParallel, WhatIsNotBuiltIsRefused) {
  auto refused = [](RunConfig cfg, const std::string& part) {
    try {
      (void)pipeline_shape(cfg, cfg.mesh.pp);
      ADD_FAILURE() << "accepted; expected: " << part;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  RunConfig gpt2 = testing::pipeline_config("zbv", 3, 2, testing::gpt2_of(4, 8, 4, 12, 4, 4, AttentionMode::flash), 2, 3);
  gpt2.mesh = MeshShape{1, 2, 2, true};
  RunConfig mlp = testing::pipeline_config("1f1b", 2, 1, testing::model_of(6, 12, 4, Activation::relu, Loss::mse), 2, 3);
  mlp.mesh = MeshShape{1, 2, 2, true};
  refused(mlp, "virtual stage 0 holds 3 layers");
  mlp.model.width = 13;
  mlp.model.layers = 4;
  refused(mlp, "--width 13");
  gpt2.schedule = parse_schedule("1f1b");
  gpt2.chunks = 1;
  gpt2.model.transformer.vocab = 13;
  refused(gpt2, "the vocabulary (13) must divide by tp");
}

}  // namespace
}  // namespace shardscope
