// Pipelines over MPI at the world this binary was started with (W = 2, 3, 4 from ctest;
// W = the stage count): every schedule (zbv's V included) trains like one rank on the full batch (each
// stage's gradients, parameters and AdamW state equal the matching slice of the
// non-pipelined reference), saved tensors and resting bytes equal the closed forms on every stage,
// a stage played alone with the fake communicator holds the real stage's bytes, and at
// W = 2 the seed's last-stage numbers come out.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/pipeline/run_pipeline.hpp"
#include "harness/records/json_read.hpp"
#include "harness/records/json_write.hpp"
#include "shardscope/comm.hpp"
#include "support/pipeline_configs.hpp"
#include "support/dp_harness.hpp"

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

RunConfig pipeline_config(const std::string& schedule, int microbatches, int chunks,
                          const ModelConfig& model) {
  return testing::pipeline_config(schedule, microbatches, chunks, model, 2, 7);
}

using testing::model_of;

std::vector<float> slice(const std::vector<float>& v, std::int64_t begin, std::int64_t count) {
  return {v.begin() + begin, v.begin() + begin + count};
}

TEST(PipelineMpi, EveryStageTrainsLikeTheFullBatch) {
  const World w;
  const int S = w.size;
  struct Case {
    std::string schedule;
    int chunks;
    std::vector<int> microbatches;
  };
  const std::vector<Case> cases = {{"gpipe", 1, {S, 3, 6}},
                                   {"1f1b", 1, {1, S, 3, 6}},
                                   {"zb-h1", 1, {S, 3, 6}},
                                   {"interleaved-1f1b", 2, {S, 2 * S}},
                                   {"zbv", 2, {2 * S - 1, 2 * S}}};
  const std::vector<ModelConfig> models = {model_of(2 * S + 1, 12, 8, Activation::relu, Loss::mse),
                                           model_of(2 * S + 1, 12, 8, Activation::none, Loss::sum)};
  for (const ModelConfig& model : models)
    for (const Case& c : cases)
      for (int M : c.microbatches) {
        if (M > model.batch) continue;
        const RunConfig cfg = pipeline_config(c.schedule, M, c.chunks, model);
        SCOPED_TRACE(c.schedule + " S=" + std::to_string(S) + " M=" + std::to_string(M) + " stage " +
                     std::to_string(w.rank) + (model.activation == Activation::relu ? " relu mse" : " none sum"));
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        PipelineStage stage(cfg, backend, *comm);
        stage.setup();
        for (int i = 0; i < cfg.steps; ++i) {
          stage.prepare_batch(i);
          stage.step();
        }
        const HostState ref = testing::reference_training(cfg, 1);
        ASSERT_TRUE(any_nonzero(ref.grads));
        const std::int64_t per_layer = model.layer_elems();
        for (int ch = 0; ch < c.chunks; ++ch) {
          const int k = stage.vstage(ch);
          const std::int64_t begin = stage.layout().first_layer(k) * per_layer;
          const std::int64_t count = (stage.layout().end_layer(k) - stage.layout().first_layer(k)) * per_layer;
          const std::vector<float> grads = stage.download_grads(ch);
          EXPECT_TRUE(any_nonzero(grads)) << "chunk " << ch;
          std::size_t at = 0;
          EXPECT_EQ(worst_violation(grads, slice(ref.grads, begin, count), 1e-5, 1e-7, &at), 0.0)
              << "grads of chunk " << ch << " at " << at;
          EXPECT_EQ(worst_violation(stage.download_params(ch), slice(ref.params, begin, count), 1e-5, 1e-7, &at), 0.0)
              << "params of chunk " << ch << " at " << at;
          EXPECT_EQ(worst_violation(stage.download_exp_avg(ch), slice(ref.exp_avg, begin, count), 1e-5, 1e-7, &at), 0.0)
              << "exp_avg of chunk " << ch << " at " << at;
          EXPECT_EQ(
              worst_violation(stage.download_exp_avg_sq(ch), slice(ref.exp_avg_sq, begin, count), 1e-5, 1e-9, &at),
              0.0)
              << "exp_avg_sq of chunk " << ch << " at " << at;
        }
        const StageForms p = predict_pipeline_stage(pipeline_shape(cfg, S), w.rank);
        EXPECT_EQ(stage.saved().peak_live(), p.saved.peak_live_tensors);
        EXPECT_EQ(stage.saved().peak_live_bytes(), p.saved.peak_live_bytes);
        EXPECT_EQ(stage.saved().total(), p.saved.total_tensors);
        EXPECT_EQ(stage.saved().before_first_backward(), p.saved.before_first_backward);
        EXPECT_EQ(backend.tracker().current_total(), p.resting.total());
        if (c.schedule != "interleaved-1f1b") {
          EXPECT_EQ(backend.tracker().peak().by_category, p.peak);
        }

        // The same stage played alone with the fake communicator holds the same bytes.
        CpuBackend backend2;
        auto fake = make_fake_communicator(S, w.rank, &backend2);
        PipelineStage alone(cfg, backend2, *fake);
        alone.setup();
        for (int i = 0; i < cfg.steps; ++i) {
          alone.prepare_batch(i);
          alone.step();
        }
        EXPECT_EQ(backend2.tracker().current(), backend.tracker().current());
        EXPECT_EQ(backend2.tracker().peak().total, backend.tracker().peak().total);
        EXPECT_EQ(backend2.tracker().peak().by_category, backend.tracker().peak().by_category);
        EXPECT_EQ(alone.peak_where(), stage.peak_where());
        EXPECT_EQ(alone.saved().peak_live_bytes(), stage.saved().peak_live_bytes());
        EXPECT_EQ(fake->ledger()[CollKind::send].bytes, comm->ledger()[CollKind::send].bytes);
        EXPECT_EQ(fake->ledger()[CollKind::recv].bytes, comm->ledger()[CollKind::recv].bytes);
      }
}

// GPT-2 and Llama (its head untied and tied) pipelined over real ranks: the embeddings
// with the first stage, the final block and loss with the last, a tied embedding held on
// both and its gradient all-reduced between them. Each stage's chunks hold the
// reference's gradients, parameters and AdamW state (the last stage's copy of the tied
// table the reference's: the head's part and the embeddings'), and every measured figure
// equals its closed form.
TEST(PipelineMpi, TransformersEveryStageTrainsLikeTheFullBatch) {
  const World w;
  const int S = w.size;
  struct Case {
    std::string schedule;
    int chunks;
    std::vector<int> microbatches;
  };
  const std::vector<Case> cases = {{"gpipe", 1, {S, 3}},
                                   {"1f1b", 1, {1, S, 5}},
                                   {"interleaved-1f1b", 2, {S, 2 * S}},
                                   {"zb-h1", 1, {1, S, 5}},
                                   {"zbv", 2, {2 * S - 1, 2 * S}}};
  std::vector<ModelConfig> models;
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    models.push_back(testing::gpt2_of(2 * S + 1, 8, 2, 13, 4, 2 * S + 1, mode));
    for (const bool tied : {false, true})
      models.push_back(testing::llama_of(2 * S + 1, 8, 4, 2, 12, 13, 4, 2 * S + 1, mode, tied));
  }
  for (const ModelConfig& model : models)
    for (const Case& c : cases)
      for (int M : c.microbatches) {
        const AttentionMode mode = model.transformer.attention;
        const bool tied = model.name == "gpt2" || model.transformer.tied_embeddings;
        if (M > model.batch) continue;
        const RunConfig cfg = pipeline_config(c.schedule, M, c.chunks, model);
        SCOPED_TRACE(model.name + (tied ? " tied " : " untied ") + c.schedule + " S=" + std::to_string(S) + " M=" +
                     std::to_string(M) + " stage " + std::to_string(w.rank) +
                     (mode == AttentionMode::flash ? " flash" : " math"));
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        PipelineStage stage(cfg, backend, *comm);
        stage.setup();
        for (int i = 0; i < cfg.steps; ++i) {
          stage.prepare_batch(i);
          stage.step();
        }
        const HostState ref = testing::reference_training(cfg, 1);
        const std::unique_ptr<Model> m = make_model(cfg.model);
        std::size_t at = 0;
        auto expect_state = [&](const std::string& what, const std::vector<float>& grads,
                                const std::vector<float>& params, std::int64_t begin) {
          const std::int64_t count = static_cast<std::int64_t>(grads.size());
          EXPECT_TRUE(any_nonzero(grads)) << what;
          EXPECT_EQ(worst_violation(grads, slice(ref.grads, begin, count), 1e-5, 1e-7, &at), 0.0)
              << "grads of " << what << " at " << at;
          // The key bias's gradient is zero in exact arithmetic: rounding noise, which
          // AdamW's g / (sqrt(v) + 1e-8) turns into up to lr / 10 a step.
          EXPECT_EQ(worst_violation(params, slice(ref.params, begin, count), 1e-5, 4e-4, &at), 0.0)
              << "params of " << what << " at " << at;
        };
        for (int ch = 0; ch < c.chunks; ++ch) {
          const int k = stage.vstage(ch);
          expect_state("chunk " + std::to_string(ch), stage.download_grads(ch), stage.download_params(ch),
                       m->block_offset(stage.layout().first_layer(k)));
          std::vector<float> exp_avg = stage.download_exp_avg(ch);
          EXPECT_EQ(worst_violation(exp_avg, slice(ref.exp_avg, m->block_offset(stage.layout().first_layer(k)),
                                                   static_cast<std::int64_t>(exp_avg.size())),
                                    1e-5, 1e-7, &at),
                    0.0)
              << "exp_avg of chunk " << ch << " at " << at;
        }
        // zbv's V puts the embeddings and the head both on stage 0: no copy, no all-reduce.
        EXPECT_EQ(stage.holds_tied_copy(), tied && S > 1 && w.rank == S - 1 && c.schedule != "zbv");
        if (stage.holds_tied_copy())  // the token embedding, the model's tensor 0
          expect_state("the tied copy of the embedding", stage.download_tied_grads(), stage.download_tied_params(), 0);

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
      }
}

// The tied embedding's all-reduce is one of two ranks, the first and last stage, whatever
// the world: its record carries its bytes and nccl-tests' bus bandwidth for 2 ranks
// (factor 1, the algorithm bandwidth); the stages between move none.
TEST(PipelineMpi, TiedAllReduceIsOneOfTwoRanks) {
  const World w;
  const RunConfig cfg =
      pipeline_config("1f1b", w.size, 1, testing::gpt2_of(w.size, 8, 2, 13, 4, w.size, AttentionMode::flash));
  CpuBackend backend;
  auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
  const nlohmann::json record = to_json(run_pipeline(cfg, backend, *comm));
  const nlohmann::json& ar = record["comm"]["all_reduce"];
  const bool holder = w.size > 1 && (w.rank == 0 || w.rank == w.size - 1);
  EXPECT_EQ(ar["bytes"].get<std::int64_t>(), holder ? 4 * 13 * 8 : 0);
  EXPECT_EQ(ar["calls"].get<std::int64_t>(), holder ? 1 : 0);
  if (holder && ar["ms"].get<double>() > 0.0) {
    EXPECT_DOUBLE_EQ(ar["busbw_gbps"].get<double>(), ar["bytes"].get<double>() / (ar["ms"].get<double>() * 1e-3) / 1e9);
  }
}

// Stage records gathered on rank 0 (as run_job does) get their replayed bubbles.
TEST(PipelineMpi, RecordsAndReplayedBubble) {
  const World w;
  const RunConfig cfg = pipeline_config("1f1b", 2 * w.size, 1, model_of(w.size, 16, 8, Activation::relu, Loss::mse));
  CpuBackend backend;
  auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
  const nlohmann::json record = to_json(run_pipeline(cfg, backend, *comm));
  EXPECT_EQ(record["saved"]["peak_live_tensors"], record["predicted"]["peak_live_tensors"]);
  EXPECT_EQ(record["saved"]["peak_live_bytes"], record["predicted"]["peak_live_bytes"]);
  const std::string mine = record.dump();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(w.size);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> displs(w.size, 0);
  for (int r = 1; r < w.size; ++r) displs[r] = displs[r - 1] + lens[r - 1];
  std::string all(w.rank == 0 ? static_cast<std::size_t>(displs.back() + lens.back()) : 0, '\0');
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (w.rank != 0) return;
  std::vector<StageRecord> stages;
  for (int r = 0; r < w.size; ++r)
    stages.push_back(read_stage_record(nlohmann::json::parse(all.substr(displs[r], lens[r])), "stage " + std::to_string(r)));
  const std::optional<double> makespan = fill_replayed_bubbles(cfg, stages);
  ASSERT_TRUE(makespan.has_value());
  const std::optional<double> wall = fill_wall_bubbles(stages);
  ASSERT_TRUE(wall.has_value());
  for (const StageRecord& st : stages) {
    // The actions end inside the step; the wall bubble is the stage's idle share of it.
    ASSERT_TRUE(st.actions_end_ms && st.busy_ms && st.bubble_fraction);
    EXPECT_LE(*st.actions_end_ms, st.step_ms_all.back());
    EXPECT_LE(*st.actions_end_ms, *wall);
    EXPECT_DOUBLE_EQ(*st.bubble_fraction, 1.0 - *st.busy_ms / *wall);
    ASSERT_TRUE(st.bubble_fraction_replayed.has_value());
    EXPECT_GE(*st.bubble_fraction_replayed, 0.0);
    EXPECT_LT(*st.bubble_fraction_replayed, 1.0);
    EXPECT_LE(*st.busy_ms, *makespan * (1 + 1e-9));
  }
  EXPECT_TRUE(stages.back().loss.has_value());
  EXPECT_FALSE(stages.front().loss.has_value());
}

// The seed (S = 2, one layer per stage, width 32, relu, mse, batch 8): the last stage.
TEST(PipelineMpi, SeedLastStage) {
  const World w;
  if (w.size != 2) GTEST_SKIP() << "the seed ran 2 stages";
  struct Row {
    std::string schedule;
    int microbatches, peak_live, before_first_backward, total;
  };
  const std::vector<Row> rows = {{"gpipe", 2, 10, 10, 10}, {"gpipe", 4, 20, 20, 20}, {"gpipe", 8, 40, 40, 40},
                                 {"1f1b", 2, 5, 5, 10},    {"1f1b", 4, 5, 5, 20},    {"1f1b", 8, 5, 5, 40}};
  for (const Row& row : rows) {
    SCOPED_TRACE(row.schedule + " M=" + std::to_string(row.microbatches) + " stage " + std::to_string(w.rank));
    const RunConfig cfg = pipeline_config(row.schedule, row.microbatches, 1, model_of(2, 32, 8, Activation::relu, Loss::mse));
    CpuBackend backend;
    auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
    const nlohmann::json r = to_json(run_pipeline(cfg, backend, *comm));
    if (w.rank != 1) continue;
    EXPECT_EQ(r["saved"]["peak_live_tensors"], row.peak_live);
    EXPECT_EQ(r["saved"]["before_first_backward"], row.before_first_backward);
    EXPECT_EQ(r["saved"]["total_tensors"], row.total);
    EXPECT_EQ(r["predicted"]["peak_live_tensors"], row.peak_live);
  }
}

}  // namespace
}  // namespace shardscope
