// Pipeline stages in one process (docs/design.md §4): S = 1 with the self communicator (every
// schedule, numerics against one rank on the full batch), and every stage of S = 2..4
// played alone with the fake communicator: the saved-tensor counts and bytes, the
// resting bytes, the step's peak per category and the p2p bytes measured equal the
// closed forms (harness/predict/pipeline_forms) exactly, and the seed's last-stage
// numbers come out.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/pipeline/run_pipeline.hpp"
#include "harness/records/json_write.hpp"
#include "shardscope/check.hpp"
#include "support/pipeline_configs.hpp"
#include "support/dp_harness.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

RunConfig pipeline_config(const std::string& schedule, int microbatches, int chunks,
                          const ModelConfig& model) {
  return testing::pipeline_config(schedule, microbatches, chunks, model, 1, 5);
}

using testing::model_of;

struct Measured {
  int peak_live = 0;
  std::int64_t peak_bytes = 0;
  int total = 0;
  int before_first_backward = 0;
  std::int64_t resting = 0;
  CategoryBytes resting_by_category;
  std::int64_t peak_total = 0;
  CategoryBytes peak_by_category;
  std::int64_t sent = 0, received = 0;
};

Measured run_stage(const RunConfig& cfg, Backend& backend, Communicator& comm) {
  PipelineStage stage(cfg, backend, comm);
  stage.setup();
  for (int i = 0; i < cfg.steps; ++i) {
    stage.prepare_batch(i);
    stage.step();
  }
  Measured r;
  r.peak_live = stage.saved().peak_live();
  r.peak_bytes = stage.saved().peak_live_bytes();
  r.total = stage.saved().total();
  r.before_first_backward = stage.saved().before_first_backward();
  r.resting = backend.tracker().current_total();
  r.resting_by_category = backend.tracker().current();
  r.peak_total = backend.tracker().peak().total;
  r.peak_by_category = backend.tracker().peak().by_category;
  r.sent = comm.ledger()[CollKind::send].bytes;
  r.received = comm.ledger()[CollKind::recv].bytes;
  return r;
}

bool schedule_fits(const std::string& schedule, int stages, int microbatches, int chunks) {
  if (schedule == "interleaved-1f1b") return chunks >= 2 && microbatches % stages == 0;
  if (schedule == "zbv") return chunks == 2 && microbatches >= 2 * stages - 1;
  return chunks == 1;
}

// ---- the seed -------------------------------------------------------------------------

struct SeedRow {
  std::string schedule;
  int microbatches, peak_live, before_first_backward, total;
};

std::vector<SeedRow> seed_rows() {
  std::vector<SeedRow> rows;
  if (const char* dir = std::getenv("SHARDSCOPE_REFERENCE_DIR")) {
    std::ifstream in(std::string(dir) + "/seed-3.13.json");
    if (in) {
      const nlohmann::json doc = nlohmann::json::parse(in);
      for (const auto& r : doc.at("pipeline").at("last_stage"))
        rows.push_back({r.at("schedule").get<std::string>(), r.at("microbatches").get<int>(),
                        r.at("peak_live").get<int>(), r.at("saved_before_first_backward").get<int>(),
                        r.at("saved_total").get<int>()});
    }
  }
  if (rows.empty())  // the same numbers, when run outside ctest
    rows = {{"gpipe", 2, 10, 10, 10}, {"gpipe", 4, 20, 20, 20}, {"gpipe", 8, 40, 40, 40},
            {"1f1b", 2, 5, 5, 10},    {"1f1b", 4, 5, 5, 20},    {"1f1b", 8, 5, 5, 40}};
  return rows;
}

ModelConfig seed_model() { return model_of(2, 32, 8, Activation::relu, Loss::mse); }

TEST(pipeline, SeedLastStageMatchesTheReference) {
  const std::vector<SeedRow> rows = seed_rows();
  ASSERT_EQ(rows.size(), 6u);
  for (const SeedRow& row : rows) {
    SCOPED_TRACE(row.schedule + " M=" + std::to_string(row.microbatches));
    RunConfig cfg = pipeline_config(row.schedule, row.microbatches, 1, seed_model());
    cfg.steps = 2;
    CpuBackend backend;
    auto comm = make_fake_communicator(2, 1, &backend);
    const Measured r = run_stage(cfg, backend, *comm);
    EXPECT_EQ(r.peak_live, row.peak_live);
    EXPECT_EQ(r.before_first_backward, row.before_first_backward);
    EXPECT_EQ(r.total, row.total);
    // input, ReLU output (= MSE input) and target per micro-batch, rows B/M
    const int live_mb = row.schedule == "gpipe" ? row.microbatches : 1;
    EXPECT_EQ(r.peak_bytes, live_mb * 3 * (8 / row.microbatches) * 32 * 4);
  }
}

// ---- measured == predicted, every stage ------------------------------------------------

TEST(pipeline, MeasuredEqualsTheClosedFormsOnEveryStage) {
  const std::vector<ModelConfig> models = {model_of(9, 8, 8, Activation::relu, Loss::mse),
                                           model_of(9, 8, 8, Activation::none, Loss::sum),
                                           model_of(8, 6, 8, Activation::none, Loss::mse),
                                           model_of(8, 6, 8, Activation::relu, Loss::sum)};
  int checked = 0;
  for (const ModelConfig& model : models)
    for (int S = 1; S <= 4; ++S)
      for (const std::string_view name : kScheduleNames)
        for (int M : {1, 2, 3, 4, 6, 8})
          for (int v : {1, 2}) {
            const std::string schedule(name);
            if (!schedule_fits(schedule, S, M, v)) continue;
            const RunConfig cfg = pipeline_config(schedule, M, v, model);
            const PipelineShape shape = pipeline_shape(cfg, S);
            for (int s = 0; s < S; ++s) {
              SCOPED_TRACE(schedule + " S=" + std::to_string(S) + " s=" + std::to_string(s) + " M=" +
                           std::to_string(M) + " v=" + std::to_string(v) + " layers=" +
                           std::to_string(model.layers) + (model.activation == Activation::relu ? " relu" : " none") +
                           (model.loss == Loss::mse ? " mse" : " sum"));
              CpuBackend backend;
              auto comm = S == 1 ? make_communicator(CommOptions{"self", 0, 0}, &backend)
                                 : make_fake_communicator(S, s, &backend);
              const Measured r = run_stage(cfg, backend, *comm);
              const StageForms p = predict_pipeline_stage(shape, s);
              ASSERT_GT(r.peak_total, r.resting);
              EXPECT_EQ(r.peak_live, p.saved.peak_live_tensors);
              EXPECT_EQ(r.peak_bytes, p.saved.peak_live_bytes);
              EXPECT_EQ(r.total, p.saved.total_tensors);
              EXPECT_EQ(r.before_first_backward, p.saved.before_first_backward);
              // At rest: params, grads, AdamW state of its layers; every transient freed.
              EXPECT_EQ(r.resting_by_category, p.resting);
              EXPECT_EQ(r.resting_by_category[Category::activation], 0);
              EXPECT_EQ(r.resting_by_category[Category::comm], 0);
              EXPECT_EQ(r.resting_by_category[Category::temp], 0);
              // The step's peak, at its first instant, per category.
              EXPECT_EQ(r.peak_total, p.peak.total());
              for (int k = 0; k < kCategoryCount; ++k)
                EXPECT_EQ(r.peak_by_category.bytes[k], p.peak.bytes[k]) << "at the peak " << kCategoryNames[k];
              // A step's point-to-point bytes, each way.
              EXPECT_EQ(r.sent, p.p2p_sent_bytes);
              EXPECT_EQ(r.received, p.p2p_sent_bytes);
              ++checked;
            }
          }
  EXPECT_GT(checked, 500);
}

// ---- numerics at S = 1 -----------------------------------------------------------------

TEST(pipeline, OneStageTrainsLikeTheFullBatch) {
  for (const ModelConfig& model : {model_of(4, 7, 8, Activation::relu, Loss::mse),
                                   model_of(4, 7, 8, Activation::none, Loss::sum)})
    for (const std::string_view name : kScheduleNames)
      for (int M : {1, 3, 8}) {
        const std::string schedule(name);
        const int v = schedule == "interleaved-1f1b" || schedule == "zbv" ? 2 : 1;
        RunConfig cfg = pipeline_config(schedule, M, v, model);
        cfg.steps = 2;
        SCOPED_TRACE(schedule + " M=" + std::to_string(M) + (model.activation == Activation::relu ? " relu" : " none"));
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"self", 0, 0}, &backend);
        PipelineStage stage(cfg, backend, *comm);
        stage.setup();
        std::vector<float> losses;
        for (int i = 0; i < cfg.steps; ++i) {
          stage.prepare_batch(i);
          losses.push_back(stage.step());
        }
        const HostState ref = testing::reference_training(cfg, 1);
        ASSERT_TRUE(any_nonzero(ref.grads));
        std::vector<float> params, grads, exp_avg, exp_avg_sq;
        for (int c = 0; c < v; ++c) {  // chunk c holds virtual stage c: layers in order
          for (auto [dst, src] : {std::pair{&params, stage.download_params(c)}, std::pair{&grads, stage.download_grads(c)},
                                  std::pair{&exp_avg, stage.download_exp_avg(c)},
                                  std::pair{&exp_avg_sq, stage.download_exp_avg_sq(c)}})
            dst->insert(dst->end(), src.begin(), src.end());
        }
        ASSERT_TRUE(any_nonzero(grads));
        std::size_t at = 0;
        EXPECT_EQ(worst_violation(grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
        EXPECT_EQ(worst_violation(params, ref.params, 1e-5, 1e-7, &at), 0.0) << "params at " << at;
        EXPECT_EQ(worst_violation(exp_avg, ref.exp_avg, 1e-5, 1e-7, &at), 0.0) << "exp_avg at " << at;
        EXPECT_EQ(worst_violation(exp_avg_sq, ref.exp_avg_sq, 1e-5, 1e-9, &at), 0.0) << "exp_avg_sq at " << at;
        EXPECT_NE(losses.back(), 0.0f);
      }
}

// ---- refusals, header, record ----------------------------------------------------------

TEST(pipeline, RefusesWhatCannotRun) {
  const ModelConfig model = model_of(4, 8, 4, Activation::relu, Loss::mse);
  auto refuses = [&](RunConfig cfg, int S, const std::string& needle) {
    SCOPED_TRACE(needle);
    try {
      validate_pipeline(cfg, S);
      ADD_FAILURE() << "accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refuses(pipeline_config("1f1b", 5, 1, model), 2, "--microbatches 5 exceeds --batch 4");
  refuses(pipeline_config("1f1b", 0, 1, model_of(8, 8, 2, Activation::none, Loss::sum)), 3, "exceeds --batch 2");
  RunConfig bad = pipeline_config("gpipe", 2, 1, model);
  bad.split = {1, 2, 1};
  refuses(bad, 2, "--split: expected 2 entries");
  bad.split = {4, 0};
  refuses(bad, 2, "--split: every virtual stage needs at least 1 layer");
  bad.split = {2, 3};
  refuses(bad, 2, "expected --layers 4");
  refuses(pipeline_config("interleaved-1f1b", 4, 2, model), 4, "--layers 4");
  refuses(pipeline_config("interleaved-1f1b", 3, 2, model), 2, "multiple of the stage count");
  refuses(pipeline_config("1f1b", 2, 2, model), 2, "--chunks 2");
  try {  // an unknown name is refused where it is parsed, before any configuration holds it
    (void)parse_schedule("nope");
    ADD_FAILURE() << "accepted 'nope'";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--schedule"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(validate_pipeline(pipeline_config("zb-h1", 4, 1, model), 4));
  RunConfig good = pipeline_config("interleaved-1f1b", 2, 2, model_of(5, 8, 4, Activation::none, Loss::sum));
  good.split = {2, 1, 1, 1};
  EXPECT_NO_THROW(validate_pipeline(good, 2));
}

TEST(pipeline, SplitsLikeTensorSplit) {
  EXPECT_EQ(tensor_split_sizes(8, 3), (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(tensor_split_sizes(7, 7), (std::vector<int>{1, 1, 1, 1, 1, 1, 1}));
  const RunConfig cfg = pipeline_config("interleaved-1f1b", 4, 2, model_of(9, 8, 10, Activation::none, Loss::sum));
  const nlohmann::json h = pipeline_header(cfg, 2);
  EXPECT_EQ(h["kind"], "pipeline");
  EXPECT_EQ(h["world"], 2);
  EXPECT_EQ(h["microbatches"], 4);
  EXPECT_EQ(h["chunks"], 2);
  EXPECT_EQ(h["split"], nlohmann::json({3, 2, 2, 2}));
  EXPECT_EQ(h["microbatch_rows"], nlohmann::json({3, 3, 2, 2}));
  EXPECT_EQ(h["model"]["layers"], 9);
  RunConfig dflt = cfg;
  dflt.schedule = ScheduleKind::one_f_one_b;
  dflt.chunks = 1;
  dflt.microbatches = 0;  // one per stage
  EXPECT_EQ(pipeline_header(dflt, 3)["microbatches"], 3);
}

TEST(pipeline, RecordCarriesMeasuredAndPredicted) {
  RunConfig cfg = pipeline_config("1f1b", 8, 1, seed_model());
  cfg.steps = 3;
  CpuBackend backend;
  auto comm = make_fake_communicator(2, 1, &backend);
  const StageRecord record = run_pipeline(cfg, backend, *comm);
  const nlohmann::json r = to_json(record);
  EXPECT_EQ(r["stage"], 1);
  EXPECT_EQ(r["layers"], nlohmann::json({1, 1}));
  EXPECT_EQ(r["saved"]["peak_live_tensors"], 5);
  EXPECT_EQ(r["saved"]["peak_live_bytes"], 384);
  EXPECT_EQ(r["saved"]["total_tensors"], 40);
  EXPECT_EQ(r["saved"]["before_first_backward"], 5);
  EXPECT_EQ(r["predicted"]["peak_live_tensors"], 5);
  EXPECT_EQ(r["predicted"]["peak_live_bytes"], 384);
  EXPECT_EQ(r["predicted"]["peak_live_microbatches"], 1);
  EXPECT_EQ(r["predicted"]["peak_held_microbatches"], 1);
  EXPECT_EQ(r["predicted"]["peak_live_microbatches_theory"], 1);
  EXPECT_EQ(r["resting"]["total"], r["predicted"]["resting_total"]);
  EXPECT_EQ(r["peak"]["total"], r["predicted"]["peak_total"]);
  EXPECT_EQ(r["peak"]["by_category"], r["predicted"]["peak_by_category"]);
  EXPECT_EQ(r["resting"]["total"], 16 * (32 * 32 + 32) + 8);
  EXPECT_EQ(r["action_ms"].size(), 16u);
  EXPECT_EQ(r["loss"].size(), 3u);
  EXPECT_TRUE(r["bubble_fraction_replayed"].is_null());
  EXPECT_DOUBLE_EQ(r["bubble_fraction_theory"].get<double>(), 1.0 / 9.0);
  // Stage 1 receives 8 activations and sends 8 gradients of one row each.
  EXPECT_EQ(r["p2p"]["recv_bytes"], 8 * 32 * 4);
  EXPECT_EQ(r["p2p"]["sent_bytes"], 8 * 32 * 4);
  EXPECT_EQ(r["p2p"]["peak_comm_bytes"], 0);  // the last stage receives no gradient
  EXPECT_NE(r["peak"]["where"].get<std::string>().find("(m="), std::string::npos) << r["peak"]["where"];
  EXPECT_TRUE(r["step_ms"].is_object());

  std::vector<StageRecord> one = {record};  // emulated: one stage of two
  EXPECT_FALSE(fill_replayed_bubbles(cfg, one).has_value());
  EXPECT_FALSE(one[0].bubble_fraction_replayed.has_value());
}

// The wall-clock bubble: each stage's idle share of the latest stage's end, the
// optimizer after the last action no part of it; null for one stage of a larger
// (emulated) pipeline or for an untimed step.
TEST(pipeline, WallBubbleFromEveryStagesEnd) {
  auto stage = [](int s, double busy, double end) {
    StageRecord r;
    r.stage = s;
    r.world = 2;
    r.busy_ms = busy;
    r.actions_end_ms = end;
    return r;
  };
  std::vector<StageRecord> stages = {stage(1, 3.0, 4.0), stage(0, 2.0, 5.0)};
  const std::optional<double> makespan = fill_wall_bubbles(stages);
  ASSERT_TRUE(makespan.has_value());
  EXPECT_DOUBLE_EQ(*makespan, 5.0);
  EXPECT_DOUBLE_EQ(*stages[0].bubble_fraction, 1.0 - 3.0 / 5.0);
  EXPECT_DOUBLE_EQ(*stages[1].bubble_fraction, 1.0 - 2.0 / 5.0);

  std::vector<StageRecord> one = {stages[0]};  // one stage of two
  one[0].bubble_fraction.reset();
  EXPECT_FALSE(fill_wall_bubbles(one).has_value());
  EXPECT_FALSE(one[0].bubble_fraction.has_value());
  std::vector<StageRecord> untimed = stages;
  untimed[1].actions_end_ms.reset();
  untimed[0].bubble_fraction.reset();
  EXPECT_FALSE(fill_wall_bubbles(untimed).has_value());
  EXPECT_FALSE(untimed[0].bubble_fraction.has_value());
}

TEST(pipeline, ReplayedBubbleFromActionTimes) {
  for (const std::string& schedule : {std::string("gpipe"), std::string("1f1b"), std::string("zb-h1")}) {
    const int S = 3, M = 6;
    RunConfig cfg = pipeline_config(schedule, M, 1, model_of(3, 4, 6, Activation::none, Loss::sum));
    const Schedule sched = make_schedule(parse_schedule(schedule), S, M, 1);
    std::vector<StageRecord> stages;
    for (int s = S - 1; s >= 0; --s) {  // any order
      StageRecord st;
      st.stage = s;
      st.world = S;
      st.action_ms.emplace();
      for (const Action& a : sched.actions[s]) st.action_ms->push_back({action_name(a.kind), a.microbatch, a.chunk, 1.0});
      stages.push_back(std::move(st));
    }
    const std::optional<double> makespan = fill_replayed_bubbles(cfg, stages);
    ASSERT_TRUE(makespan.has_value()) << schedule;
    for (const StageRecord& st : stages) {
      ASSERT_TRUE(st.bubble_fraction_replayed.has_value()) << schedule;
      EXPECT_NEAR(*st.bubble_fraction_replayed, bubble_theory(sched), 1e-12) << schedule;
    }
  }
}

}  // namespace
}  // namespace shardscope
