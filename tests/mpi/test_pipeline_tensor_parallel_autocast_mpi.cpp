// Tensor-parallel pipeline stages under --precision bf16 (autocast) over MPI (--mesh
// dp=1,tp=2,pp=W/2 --schedule) at the world this binary was started with (W = 2 and 4 from
// ctest; W = 3 has no tp of 2): GPT-2 (flash) and Llama (math, grouped-query, untied head,
// biases), gpipe, 1f1b and interleaved-1f1b. The last stage's loss each step is the
// one-rank bf16 model's within bf16's rounding (each row-parallel output's partial
// products rounded to bf16 before their bf16 sum: held to 1e-3 of the loss); every byte
// of the stage, the saved tensors and each group's ledger equal the closed forms, and the
// same rank played alone (--emulate) holds and moves the same bytes.
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

TEST(PipelineTensorParallelAutocastMpi, StagesSplitAlongTpTrainLikeTheOneRankBf16Model) {
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
  for (ModelConfig model : {testing::gpt2_of(4, 16, 4, 24, 4, 4, AttentionMode::flash), llama})
    for (const Case& c : cases) {
      model.autocast = true;
      RunConfig cfg = testing::pipeline_config(c.schedule, 2 * S, c.chunks, model, 3, 7);
      cfg.precision = PrecisionKind::bf16;
      cfg.mesh = mesh;
      SCOPED_TRACE(model.name + " " + c.schedule + " --mesh " + mesh.text() + " --precision bf16 rank " +
                   std::to_string(rank));
      CpuBackend backend;
      auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
      const Trained t = train(cfg, backend, *comm);
      const MeshCoord coord = mesh.coord(rank);

      // One rank, the whole bf16 model, on the same batches.
      RunConfig one = cfg;
      one.mesh = MeshShape{};
      std::vector<std::vector<float>> losses;
      testing::reference_training(one, 1, &losses);
      if (t.stage->holds_loss()) {
        ASSERT_EQ(t.losses.size(), losses.size());
        for (std::size_t s = 0; s < losses.size(); ++s) {
          const float want = losses[s][0];
          ASSERT_GT(want, 0.0f);
          EXPECT_NEAR(t.losses[s], want, 1e-3 * want) << "step " << s;
        }
      }

      // The closed forms: the stage's bytes, and each group's.
      const StageForms p = predict_pipeline_stage(pipeline_shape(cfg, S), coord.pp, mesh.dp);
      EXPECT_EQ(backend.tracker().current_total(), p.resting.total());
      EXPECT_EQ(backend.tracker().peak().by_category, p.peak);
      EXPECT_GT(backend.tracker().peak().by_category[Category::param_cast], 0);
      EXPECT_EQ(t.stage->saved().peak_live_bytes(), p.saved.peak_live_bytes);
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
}

}  // namespace
}  // namespace shardscope
