// Pipelines replicated along dp over MPI (--mesh dp=D,pp=S --schedule) at the world this
// binary was started with (W = 2, 3, 4 from ctest: every mesh of it with D >= 2): each
// stage of each replica trains like one rank on the data-parallel group's concatenated
// batch (its chunks' gradients, parameters and AdamW state, and a tied copy's, equal the
// reference's slice), its bytes equal the closed forms, its groups' ledgers the forms'
// bytes, and the same rank played alone (--emulate) holds the same bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "shardscope/mesh.hpp"
#include "support/dp_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

std::vector<float> slice(const std::vector<float>& v, std::int64_t begin, std::int64_t count) {
  return {v.begin() + begin, v.begin() + begin + count};
}

struct Trained {
  MeshComms mesh;  // before the stage, which holds its groups
  std::unique_ptr<PipelineStage> stage;
  CommLedger pp, dp;
};

Trained train(const RunConfig& cfg, Backend& backend, Communicator& world) {
  Trained t;
  t.mesh = make_mesh_comms(world, cfg.mesh);
  MeshComms& mesh = t.mesh;
  t.stage = std::make_unique<PipelineStage>(cfg, backend, mesh.group(MeshAxis::pp),
                                            make_pipeline_layout(cfg, cfg.mesh.pp), &mesh.group(MeshAxis::dp));
  t.stage->setup();
  for (int i = 0; i < cfg.steps; ++i) {
    t.stage->prepare_batch(i);
    t.stage->step();
  }
  t.pp = mesh.group(MeshAxis::pp).ledger();
  t.dp = mesh.group(MeshAxis::dp).ledger();
  return t;
}

TEST(PipelineMeshMpi, EveryReplicaTrainsLikeOneRankOnTheGroupsBatch) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  struct Case {
    std::string schedule;
    int chunks;
  };
  const std::vector<Case> cases = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zbv", 2}};
  for (int D = 2; D <= world; ++D) {
    if (world % D != 0) continue;
    const int S = world / D;
    const MeshShape mesh{D, 1, S, true};
    const std::vector<ModelConfig> models = {
        testing::model_of(2 * S + 1, 12, 2 * S, Activation::relu, Loss::mse),
        testing::model_of(2 * S + 1, 12, 2 * S, Activation::none, Loss::sum),
        testing::gpt2_of(2 * S + 1, 8, 2, 13, 4, 2 * S, AttentionMode::flash)};
    for (const ModelConfig& model : models)
      for (const Case& c : cases) {
        const int M = 2 * S;
        RunConfig cfg = testing::pipeline_config(c.schedule, M, c.chunks, model, 3, 11);
        cfg.mesh = mesh;
        SCOPED_TRACE(model.name + " " + c.schedule + " --mesh " + mesh.text() + " rank " + std::to_string(rank) +
                     (model.loss == Loss::sum ? " sum" : ""));
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        const Trained t = train(cfg, backend, *comm);
        PipelineStage& stage = *t.stage;

        // One rank on the D replicas' batches, the whole model.
        RunConfig one = cfg;
        one.mesh = MeshShape{};
        const HostState ref = testing::reference_training(one, D);
        const std::unique_ptr<Model> m = make_model(cfg.model);
        std::size_t at = 0;
        for (int ch = 0; ch < c.chunks; ++ch) {
          const int k = stage.vstage(ch);
          const std::int64_t begin = m->block_offset(stage.layout().first_layer(k));
          const std::vector<float> grads = stage.download_grads(ch);
          const std::int64_t count = static_cast<std::int64_t>(grads.size());
          EXPECT_TRUE(any_nonzero(grads)) << "chunk " << ch;
          EXPECT_EQ(worst_violation(grads, slice(ref.grads, begin, count), 1e-5, 1e-7, &at), 0.0)
              << "grads of chunk " << ch << " at " << at;
          // GPT-2's key bias has a zero gradient in exact arithmetic: rounding noise, which
          // AdamW's g / (sqrt(v) + 1e-8) turns into up to lr / 10 a step.
          EXPECT_EQ(worst_violation(stage.download_params(ch), slice(ref.params, begin, count), 1e-5, 4e-4, &at), 0.0)
              << "params of chunk " << ch << " at " << at;
          EXPECT_EQ(worst_violation(stage.download_exp_avg(ch), slice(ref.exp_avg, begin, count), 1e-5, 1e-7, &at),
                    0.0)
              << "exp_avg of chunk " << ch << " at " << at;
        }
        if (stage.holds_tied_copy()) {  // the token embedding, the model's tensor 0
          const std::vector<float> grads = stage.download_tied_grads();
          EXPECT_EQ(worst_violation(grads, slice(ref.grads, 0, static_cast<std::int64_t>(grads.size())), 1e-5, 1e-7,
                                    &at),
                    0.0)
              << "grads of the tied copy at " << at;
        }

        // The closed forms: the stage's bytes, and each group's.
        const MeshCoord coord = mesh.coord(rank);
        const StageForms p = predict_pipeline_stage(pipeline_shape(cfg, S), coord.pp, D);
        EXPECT_EQ(backend.tracker().current_total(), p.resting.total());
        EXPECT_EQ(backend.tracker().peak().by_category, p.peak);
        EXPECT_EQ(stage.saved().peak_live_bytes(), p.saved.peak_live_bytes);
        EXPECT_EQ(t.dp.total_bytes(), p.dp_all_reduce_bytes);
        EXPECT_EQ(t.pp.total_bytes(), p.pp_comm_bytes());

        // The same rank played alone.
        CpuBackend backend2;
        auto fake = make_fake_communicator(world, rank, &backend2);
        const Trained e = train(cfg, backend2, *fake);
        EXPECT_EQ(backend2.tracker().current(), backend.tracker().current());
        EXPECT_EQ(backend2.tracker().peak().by_category, backend.tracker().peak().by_category);
        EXPECT_EQ(e.dp.total_bytes(), t.dp.total_bytes());
        EXPECT_EQ(e.pp.total_bytes(), t.pp.total_bytes());
      }
  }
}

}  // namespace
}  // namespace shardscope
