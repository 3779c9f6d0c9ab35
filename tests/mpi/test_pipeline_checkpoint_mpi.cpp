// Checkpointed pipeline stages over MPI at the world this binary was started with (W = 2,
// 3, 4 from ctest; W = the stage count): the MLP, GPT-2 and Llama under gpipe, 1f1b and
// interleaved-1f1b with --checkpoint full, every:2 and (the transformers) attention train
// like one rank running the unwrapped model on the full batch (each stage's gradients,
// parameters and AdamW state equal the matching slice of the reference), and every stage's
// saved tensors, resting and peak bytes and p2p equal the closed forms; under bf16 GPT-2's
// and Llama's checkpointed stages train like the unwrapped pipeline, to the bit.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "shardscope/comm.hpp"
#include "support/dp_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

struct World {
  int size = 1, rank = 0;
  World() {
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
};

CheckpointPolicy policy(const std::string& text) {
  CheckpointPolicy p;
  if (text == "attention") {
    p.kind = CheckpointKind::attention;
  } else {
    p.kind = CheckpointKind::every;
    p.every = text == "full" ? 1 : 2;
  }
  return p;
}

std::vector<float> slice(const std::vector<float>& v, std::int64_t begin, std::int64_t count) {
  return {v.begin() + begin, v.begin() + begin + count};
}

TEST(PipelineCheckpointMpi, EveryStageTrainsLikeTheUnwrappedModel) {
  const World w;
  const int S = w.size;
  struct Case {
    std::string schedule;
    int chunks;
    int microbatches;
  };
  const std::vector<Case> cases = {{"gpipe", 1, 3}, {"1f1b", 1, 2 * S}, {"interleaved-1f1b", 2, 2 * S}};
  std::vector<ModelConfig> models = {testing::model_of(2 * S + 1, 12, 8, Activation::relu, Loss::mse),
                                     testing::model_of(2 * S + 1, 12, 8, Activation::none, Loss::sum),
                                     testing::gpt2_of(2 * S + 1, 8, 2, 13, 4, 2 * S + 1, AttentionMode::flash),
                                     testing::gpt2_of(2 * S + 1, 8, 2, 13, 4, 2 * S + 1, AttentionMode::math),
                                     testing::llama_of(2 * S + 1, 8, 4, 2, 12, 13, 4, 2 * S + 1,
                                                       AttentionMode::math, true)};
  int checked = 0;
  for (const ModelConfig& base : models)
    for (const std::string ck : {"full", "every:2", "attention"})
      for (const Case& c : cases) {
        if (ck == "attention" && !base.is_transformer()) continue;
        ModelConfig model = base;
        model.checkpoint = policy(ck);
        const RunConfig cfg = testing::pipeline_config(c.schedule, c.microbatches, c.chunks, model, 2, 7);
        SCOPED_TRACE(model.name + " " + c.schedule + " S=" + std::to_string(S) + " stage " + std::to_string(w.rank) +
                     " --checkpoint " + ck);
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        PipelineStage stage(cfg, backend, *comm);
        stage.setup();
        for (int i = 0; i < cfg.steps; ++i) {
          stage.prepare_batch(i);
          stage.step();
        }
        RunConfig plain = cfg;  // the unwrapped model on the full batch, one rank
        plain.model.checkpoint = CheckpointPolicy{};
        const HostState ref = testing::reference_training(plain, 1);
        ASSERT_TRUE(any_nonzero(ref.grads));
        const std::unique_ptr<Model> m = make_model(cfg.model);
        for (int ch = 0; ch < c.chunks; ++ch) {
          const int k = stage.vstage(ch);
          const std::int64_t begin = m->block_offset(stage.layout().first_layer(k));
          const std::vector<float> grads = stage.download_grads(ch);
          const std::int64_t count = static_cast<std::int64_t>(grads.size());
          EXPECT_TRUE(any_nonzero(grads)) << "chunk " << ch;
          std::size_t at = 0;
          EXPECT_EQ(worst_violation(grads, slice(ref.grads, begin, count), 1e-5, 1e-7, &at), 0.0)
              << "grads of chunk " << ch << " at " << at;
          // The key bias's gradient is zero in exact arithmetic: rounding noise, which
          // AdamW's g / (sqrt(v) + 1e-8) turns into up to lr / 10 a step.
          EXPECT_EQ(worst_violation(stage.download_params(ch), slice(ref.params, begin, count), 1e-5, 4e-4, &at), 0.0)
              << "params of chunk " << ch << " at " << at;
          EXPECT_EQ(worst_violation(stage.download_exp_avg(ch), slice(ref.exp_avg, begin, count), 1e-5, 1e-7, &at),
                    0.0)
              << "exp_avg of chunk " << ch << " at " << at;
        }
        const StageForms p = predict_pipeline_stage(pipeline_shape(cfg, S), w.rank);
        EXPECT_EQ(stage.saved().peak_live(), p.saved.peak_live_tensors);
        EXPECT_EQ(stage.saved().peak_live_bytes(), p.saved.peak_live_bytes);
        EXPECT_EQ(stage.saved().total(), p.saved.total_tensors);
        EXPECT_EQ(stage.saved().before_first_backward(), p.saved.before_first_backward);
        EXPECT_EQ(backend.tracker().current(), p.resting);
        EXPECT_EQ(backend.tracker().peak().by_category, p.peak);
        EXPECT_EQ(comm->ledger()[CollKind::send].bytes, p.p2p_sent_bytes);
        EXPECT_EQ(comm->ledger()[CollKind::recv].bytes, p.p2p_sent_bytes);
        EXPECT_EQ(comm->ledger()[CollKind::all_reduce].bytes, p.tied_all_reduce_bytes);
        ++checked;
      }
  EXPECT_EQ(checked, 3 * 3 * 3 + 2 * 2 * 3);
}

// Under --precision bf16 (autocast, a region per micro-batch): GPT-2's and Llama's
// checkpointed stages over MPI compute what the unwrapped pipeline does, to the bit (each
// stage's gradients after two steps), every figure as predicted.
TEST(PipelineCheckpointMpi, Bf16StagesTrainLikeTheUnwrappedPipelineBitForBit) {
  const World w;
  const int S = w.size;
  auto run = [&](const RunConfig& cfg, bool check_forms) {
    CpuBackend backend;
    auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
    PipelineStage stage(cfg, backend, *comm);
    stage.setup();
    for (int i = 0; i < cfg.steps; ++i) {
      stage.prepare_batch(i);
      stage.step();
    }
    if (check_forms) {
      const StageForms p = predict_pipeline_stage(pipeline_shape(cfg, S), w.rank);
      EXPECT_EQ(stage.saved().peak_live_bytes(), p.saved.peak_live_bytes);
      EXPECT_EQ(stage.saved().total(), p.saved.total_tensors);
      EXPECT_EQ(backend.tracker().current(), p.resting);
      EXPECT_EQ(backend.tracker().peak().by_category, p.peak);
    }
    std::vector<float> grads;
    for (int c = 0; c < cfg.chunks; ++c) {
      const std::vector<float> g = stage.download_grads(c);
      grads.insert(grads.end(), g.begin(), g.end());
    }
    return grads;
  };
  for (const ModelConfig& base :
       {testing::gpt2_of(2 * S + 1, 8, 2, 13, 4, 2 * S + 1, AttentionMode::flash),
        testing::llama_of(2 * S + 1, 8, 4, 2, 12, 13, 4, 2 * S + 1, AttentionMode::math, false)})
    for (const std::string schedule : {"1f1b", "interleaved-1f1b"})
      for (const std::string ck : {"full", "every:2"}) {
        ModelConfig model = base;
        model.autocast = true;
        RunConfig plain = testing::pipeline_config(schedule, 2 * S, schedule == "1f1b" ? 1 : 2, model, 2, 7);
        plain.precision = PrecisionKind::bf16;
        RunConfig wrapped = plain;
        wrapped.model.checkpoint = policy(ck);
        SCOPED_TRACE(model.name + " bf16 " + schedule + " S=" + std::to_string(S) + " stage " +
                     std::to_string(w.rank) + " --checkpoint " + ck);
        const std::vector<float> a = run(plain, false), b = run(wrapped, true);
        ASSERT_TRUE(any_nonzero(a));
        EXPECT_EQ(a, b);
      }
}

}  // namespace
}  // namespace shardscope
