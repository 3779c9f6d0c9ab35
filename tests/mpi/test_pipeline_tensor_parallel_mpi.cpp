// Tensor-parallel pipeline stages over MPI (--mesh dp=1,tp=2,pp=W/2 --schedule) at the
// world this binary was started with (W = 2 and 4 from ctest; W = 3 has no tp of 2): GPT-2
// (flash), Llama (math, grouped-query, untied head) and the MLP, gpipe, 1f1b,
// interleaved-1f1b, zb-h1 and zbv, train like one rank of the whole model: the last stage's loss each
// step equals the one-rank model's within fp32's tolerance, and each stage's tp slice of
// the parameters, gradients and AdamW state (and a tied copy's) the one-rank model's
// elements; its bytes equal the closed forms, each group's ledger the forms' bytes, and
// the same rank played alone (--emulate) holds the same bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "shardscope/mesh.hpp"
#include "support/mesh_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::pick;
using testing::worst_violation;

struct Trained {
  MeshComms mesh;  // before the stage, which holds its groups
  std::unique_ptr<PipelineStage> stage;
  std::vector<float> losses;
  CommLedger pp, dp, tp;  // the last step's
};

Trained train(const RunConfig& cfg, Backend& backend, Communicator& world) {
  Trained t;
  t.mesh = make_mesh_comms(world, cfg.mesh);
  MeshComms& mesh = t.mesh;
  t.stage = std::make_unique<PipelineStage>(cfg, backend, mesh.group(MeshAxis::pp),
                                            make_pipeline_layout(cfg, cfg.mesh.pp), &mesh.group(MeshAxis::dp),
                                            &mesh.group(MeshAxis::tp));
  t.stage->setup();
  for (int i = 0; i < cfg.steps; ++i) {
    t.stage->prepare_batch(i);
    t.losses.push_back(t.stage->step());
  }
  t.pp = mesh.group(MeshAxis::pp).ledger();
  t.dp = mesh.group(MeshAxis::dp).ledger();
  t.tp = mesh.group(MeshAxis::tp).ledger();
  return t;
}

// Runs cfg's stages over MPI_COMM_WORLD: the last stage's loss each step equals the
// one-rank model's, each chunk's slice of the parameters, gradients and AdamW state (and a
// tied copy's) the one-rank model's elements; its bytes and each group's equal the
// closed forms; the same rank played alone holds the same bytes.
void expect_stage_trains_like_one_rank(const RunConfig& cfg, int world, int rank) {
  const MeshShape& mesh = cfg.mesh;
  const int S = mesh.pp;
  CpuBackend backend;
  auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
  const Trained t = train(cfg, backend, *comm);
  PipelineStage& stage = *t.stage;
  const MeshCoord coord = mesh.coord(rank);

  // One rank, the whole model, on the same batches.
  RunConfig one = cfg;
  one.mesh = MeshShape{};
  std::vector<std::vector<float>> losses;
  const HostState ref = testing::reference_training(one, 1, &losses);
  if (stage.holds_loss()) {
    ASSERT_EQ(t.losses.size(), losses.size());
    for (std::size_t s = 0; s < losses.size(); ++s) {
      const float want = losses[s][0];
      ASSERT_GT(want, 0.0f);
      EXPECT_NEAR(t.losses[s], want, 1e-5 * want) << "step " << s;
    }
  }
  // Each chunk's flat slice of the tp rank's model, mapped to the whole model's elements.
  const std::vector<std::int64_t> at = testing::full_indices(cfg.model, mesh.tp, coord.tp);
  const std::unique_ptr<Model> m = make_model(cfg.model, TensorParallel{mesh.tp, coord.tp});
  std::size_t i = 0;
  for (int ch = 0; ch < cfg.chunks; ++ch) {
    const int k = stage.vstage(ch);
    const std::int64_t begin = m->block_offset(stage.layout().first_layer(k));
    const std::int64_t count = m->block_offset(stage.layout().end_layer(k)) - begin;
    const std::vector<std::int64_t> mine(at.begin() + begin, at.begin() + begin + count);
    const std::vector<float> grads = stage.download_grads(ch);
    ASSERT_EQ(static_cast<std::int64_t>(grads.size()), count);
    EXPECT_TRUE(any_nonzero(grads)) << "chunk " << ch;
    EXPECT_EQ(worst_violation(grads, pick(ref.grads, mine), 1e-3, 1e-6, &i), 0.0) << "grads of chunk " << ch << " at " << i;
    EXPECT_EQ(worst_violation(stage.download_params(ch), pick(ref.params, mine), 1e-5, 1e-5, &i), 0.0)
        << "params of chunk " << ch << " at " << i;
    EXPECT_EQ(worst_violation(stage.download_exp_avg(ch), pick(ref.exp_avg, mine), 1e-3, 1e-7, &i), 0.0)
        << "exp_avg of chunk " << ch << " at " << i;
  }
  if (stage.holds_tied_copy()) {  // the token embedding's V/T rows, the model's tensor 0
    const std::vector<float> grads = stage.download_tied_grads();
    const std::vector<std::int64_t> mine(at.begin(), at.begin() + static_cast<std::int64_t>(grads.size()));
    EXPECT_EQ(worst_violation(grads, pick(ref.grads, mine), 1e-3, 1e-6, &i), 0.0) << "tied grads at " << i;
    EXPECT_EQ(worst_violation(stage.download_tied_params(), pick(ref.params, mine), 1e-5, 1e-5, &i), 0.0)
        << "tied params at " << i;
  }

  // The closed forms: the stage's bytes, and each group's.
  const StageForms p = predict_pipeline_stage(pipeline_shape(cfg, S), coord.pp, mesh.dp);
  EXPECT_EQ(backend.tracker().current_total(), p.resting.total());
  EXPECT_EQ(backend.tracker().peak().by_category, p.peak);
  EXPECT_EQ(stage.saved().peak_live_bytes(), p.saved.peak_live_bytes);
  EXPECT_EQ(t.pp.total_bytes(), p.pp_comm_bytes());
  EXPECT_EQ(t.tp.total_bytes(), p.tp_all_reduce_bytes);
  EXPECT_GT(p.tp_all_reduce_bytes, 0);
  EXPECT_EQ(t.dp.total_bytes(), 0);

  // The same rank played alone.
  CpuBackend backend2;
  auto fake = make_fake_communicator(world, rank, &backend2);
  const Trained e = train(cfg, backend2, *fake);
  EXPECT_EQ(backend2.tracker().current(), backend.tracker().current());
  EXPECT_EQ(backend2.tracker().peak().by_category, backend.tracker().peak().by_category);
  EXPECT_EQ(e.tp.total_bytes(), t.tp.total_bytes());
  EXPECT_EQ(e.pp.total_bytes(), t.pp.total_bytes());
}

TEST(PipelineTensorParallelMpi, StagesSplitAlongTpTrainLikeOneRank) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world % 2 != 0) GTEST_SKIP() << "no tp of 2 divides W = " << world;
  const MeshShape mesh{1, 2, world / 2, true};
  const int S = mesh.pp;
  struct Case {
    std::string schedule;
    int chunks;
  };
  const std::vector<Case> cases = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zb-h1", 1}, {"zbv", 2}};
  ModelConfig llama = testing::llama_of(4, 16, 4, 2, 24, 24, 4, 4, AttentionMode::math, false);
  llama.transformer.qkv_bias = true;
  const std::vector<ModelConfig> models = {testing::gpt2_of(4, 16, 4, 24, 4, 4, AttentionMode::flash), llama,
                                           testing::model_of(8, 12, 4, Activation::relu, Loss::mse)};
  for (const ModelConfig& model : models)
    for (const Case& c : cases) {
      RunConfig cfg = testing::pipeline_config(c.schedule, 2 * S, c.chunks, model, 3, 7);
      cfg.mesh = mesh;
      SCOPED_TRACE(model.name + " " + c.schedule + " --mesh " + mesh.text() + " rank " + std::to_string(rank));
      expect_stage_trains_like_one_rank(cfg, world, rank);
    }
}

// --sp (sequence-parallel stages: each stage's blocks on the rank's seq/T tokens, the
// stages sending those tokens): GPT-2 (flash) and Llama (math, grouped-query, untied,
// q/k/v and o_proj biases), gpipe, 1f1b and interleaved-1f1b, train like one rank of the
// whole model (so like the unsplit pipeline), every figure predicted.
TEST(PipelineTensorParallelMpi, SequenceParallelStagesTrainLikeOneRank) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world % 2 != 0) GTEST_SKIP() << "no tp of 2 divides W = " << world;
  const MeshShape mesh{1, 2, world / 2, true};
  const int S = mesh.pp;
  struct Case {
    std::string schedule;
    int chunks;
  };
  const std::vector<Case> cases = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}};
  ModelConfig llama = testing::llama_of(4, 16, 4, 2, 24, 24, 4, 4, AttentionMode::math, false);
  llama.transformer.qkv_bias = llama.transformer.out_bias = true;
  const std::vector<ModelConfig> models = {testing::gpt2_of(4, 16, 4, 24, 4, 4, AttentionMode::flash), llama};
  for (ModelConfig model : models)
    for (const Case& c : cases) {
      model.sequence_parallel = true;
      RunConfig cfg = testing::pipeline_config(c.schedule, 2 * S, c.chunks, model, 3, 7);
      cfg.mesh = mesh;
      SCOPED_TRACE(model.name + " --sp " + c.schedule + " --mesh " + mesh.text() + " rank " + std::to_string(rank));
      expect_stage_trains_like_one_rank(cfg, world, rank);
    }
}

// Llama's kv heads replicated (one kv head at tp = 2): 1f1b, zb-h1 and zbv (the copies'
// gradients made and all-reduced in W) train like one rank of the whole model, every
// figure predicted.
TEST(PipelineTensorParallelMpi, ReplicatedKvHeadStagesTrainLikeOneRank) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world % 2 != 0) GTEST_SKIP() << "no tp of 2 divides W = " << world;
  const MeshShape mesh{1, 2, world / 2, true};
  const int S = mesh.pp;
  struct Case {
    std::string schedule;
    int chunks;
  };
  ModelConfig llama = testing::llama_of(4, 16, 4, 1, 24, 24, 4, 4, AttentionMode::flash, false);
  llama.transformer.qkv_bias = true;
  for (const Case& c : std::vector<Case>{{"1f1b", 1}, {"zb-h1", 1}, {"zbv", 2}}) {
    RunConfig cfg = testing::pipeline_config(c.schedule, 2 * S, c.chunks, llama, 3, 7);
    cfg.mesh = mesh;
    SCOPED_TRACE("llama --kv-heads 1 " + c.schedule + " --mesh " + mesh.text() + " rank " + std::to_string(rank));
    expect_stage_trains_like_one_rank(cfg, world, rank);
  }
}

}  // namespace
}  // namespace shardscope
