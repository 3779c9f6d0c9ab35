// Llama's kv heads replicated when fewer than tp (grouped-query attention with K < T, T
// divisible by K): rank r of T holds a copy of kv head r / (T/K), the one its query heads
// read, starting as the one-rank model's rows of that head; its k_proj and v_proj
// gradients are summed over the group (one all-reduce a layer of every kv head's
// gradients, the rank's copy's in its head's slot). Every emulated rank of such a mesh
// against the closed forms, byte for byte and group by group; kv heads that neither
// divide nor are divided by tp refused naming them; Llama-2-70B's 8 kv heads planned at
// tp = 16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "harness/comm/fake_comm.hpp"
#include "harness/model/models.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/pipeline/run_pipeline.hpp"
#include "harness/predict/transformer_forms.hpp"
#include "harness/run/records.hpp"
#include "shardscope/check.hpp"
#include "support/mesh_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::llama_of;

// The flat offset of the tensor named `name` in a model, or -1.
std::int64_t offset_of(const Model& m, const std::string& name) {
  for (int t = 0; t < m.param_tensors(); ++t)
    if (m.tensor(t).name == name) return m.tensor_offset(t);
  return -1;
}

// Each rank's k_proj and v_proj (weights and biases) are the rows of kv head r / (T/K) of
// the one-rank model's, d of them, and its tensors are the forms' sizes.
TEST(KvReplicas, EachRankHoldsTheOneRankModelsRowsOfItsQueryHeadsKvHead) {
  struct Case {
    int heads, kv, tp;
  };
  for (const Case& k : {Case{8, 2, 4}, Case{4, 1, 2}, Case{8, 1, 4}, Case{8, 2, 8}})
    for (bool bias : {false, true}) {
      ModelConfig m = llama_of(2, 32, k.heads, k.kv, 48, 64, 8, 1, AttentionMode::flash, false);
      m.transformer.qkv_bias = bias;
      const auto whole = make_model(m);
      const std::vector<float> all = whole->init_flat_slice(3, 0, whole->params());
      const std::int64_t d = 32 / k.heads, h = 32;
      const int replicas = k.tp / k.kv;
      for (int r = 0; r < k.tp; ++r) {
        SCOPED_TRACE("heads " + std::to_string(k.heads) + " kv " + std::to_string(k.kv) + " tp " +
                     std::to_string(k.tp) + " rank " + std::to_string(r) + (bias ? " bias" : ""));
        const auto slice = make_model(m, TensorParallel{k.tp, r});
        const std::vector<std::int64_t> sizes = transformer_tensor_sizes(m.transformer, k.tp);
        ASSERT_EQ(static_cast<int>(sizes.size()), slice->param_tensors());
        for (int t = 0; t < slice->param_tensors(); ++t) EXPECT_EQ(slice->tensor_elems(t), sizes[t]);
        const std::vector<float> mine = slice->init_flat_slice(3, 0, slice->params());
        const std::int64_t head = r / replicas;
        for (int layer = 0; layer < 2; ++layer)
          for (const char* proj : {"k_proj", "v_proj"}) {
            const std::string p = "model.layers." + std::to_string(layer) + ".self_attn." + proj;
            const std::int64_t ws = offset_of(*slice, p + ".weight"), ww = offset_of(*whole, p + ".weight");
            ASSERT_GE(ws, 0);
            ASSERT_GE(ww, 0);
            const std::vector<float> got(mine.begin() + ws, mine.begin() + ws + d * h);
            const std::vector<float> want(all.begin() + ww + head * d * h, all.begin() + ww + (head + 1) * d * h);
            ASSERT_GT(std::abs(want.at(0)), 0.0f);
            EXPECT_EQ(got, want) << p;
            if (bias) {
              const std::int64_t bs = offset_of(*slice, p + ".bias"), bw = offset_of(*whole, p + ".bias");
              ASSERT_GE(bs, 0);
              EXPECT_EQ(std::vector<float>(mine.begin() + bs, mine.begin() + bs + d),
                        std::vector<float>(all.begin() + bw + head * d, all.begin() + bw + (head + 1) * d));
            }
          }
      }
    }
}

TEST(KvReplicas, KvHeadsThatNeitherDivideNorAreDividedByTpAreRefusedNamingThem) {
  try {
    check_tensor_parallel(llama_of(2, 48, 12, 6, 96, 256, 8, 1, AttentionMode::flash, false), 4);
    ADD_FAILURE() << "accepted kv heads 6 at tp 4";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--mesh tp=4: the kv heads (6)"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_tensor_parallel(llama_of(2, 64, 8, 2, 96, 256, 8, 1, AttentionMode::flash, false), 4));
  EXPECT_NO_THROW(check_tensor_parallel(llama_of(2, 64, 8, 1, 96, 256, 8, 1, AttentionMode::flash, false), 8));
}

// The forms' extra all-reduce: 8·K·d·(h + b) bytes a layer, none when tp divides K.
TEST(KvReplicas, TheCopiesAllReduceIsEveryKvHeadsKAndVGradients) {
  ModelConfig m = llama_of(2, 64, 8, 2, 96, 256, 8, 1, AttentionMode::flash, false);
  EXPECT_EQ(kv_replica_all_reduce_bytes(m.transformer, 2), 0);
  EXPECT_EQ(kv_replica_all_reduce_bytes(m.transformer, 4), 8 * 2 * 8 * 64);
  m.transformer.qkv_bias = true;
  EXPECT_EQ(kv_replica_all_reduce_bytes(m.transformer, 8), 8 * 2 * 8 * 65);
}

void expect_every_rank_as_predicted(const RunConfig& cfg) {
  const int world = cfg.mesh.world();
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("--mesh " + cfg.mesh.text() + " --kv-heads " + std::to_string(cfg.model.transformer.kv_heads) +
                 " " + std::string(strategy_name(cfg.strategy)) + " batch " + std::to_string(cfg.model.batch) +
                 (cfg.model.transformer.attention == AttentionMode::flash ? " flash" : " math") +
                 (cfg.model.sequence_parallel ? " --sp" : "") + " rank " + std::to_string(rank));
    CpuBackend backend;
    auto fake = make_fake_communicator(world, rank, &backend);
    const testing::MeshResult r = testing::run_mesh(cfg, backend, *fake, false);
    const Prediction p = predict_data_parallel(cfg, world, rank);
    EXPECT_EQ(r.dp.resting, p.resting);
    EXPECT_EQ(r.dp.peak.total, p.peak_total);
    EXPECT_EQ(r.dp.peak.by_category, p.peak_by_category);
    EXPECT_EQ(std::string(phase_name(r.dp.peak.phase)), std::string(phase_name(p.peak_phase)));
    EXPECT_EQ(r.dp.where, p.peak_where);
    ASSERT_GT(r.dp.saved.bytes, 0);
    EXPECT_EQ(r.dp.saved.bytes, p.saved_after_forward_bytes);
    EXPECT_EQ(r.dp.saved.tensors, p.saved_after_forward_tensors);
    EXPECT_EQ(r.dp.ledger.total_bytes(), p.axis_comm_bytes[static_cast<int>(MeshAxis::dp)]);
    EXPECT_GT(r.tp_ledger.total_bytes(), 0);
    EXPECT_EQ(r.tp_ledger.total_bytes(), p.axis_comm_bytes[static_cast<int>(MeshAxis::tp)]);
    for (int k = 0; k < kCollKindCount; ++k)
      EXPECT_EQ(r.dp.ledger.by_kind[k].bytes + r.tp_ledger.by_kind[k].bytes, p.comm_bytes[k]) << kCollKindNames[k];
  }
}

// --kv-heads 2 at tp = 4 and --kv-heads 1 at tp = 2 and 4, with dp = 1 and 2: ddp,
// zero1, zero2 and zero3 along dp, flash and math, q/k/v biases or none, one sequence
// and several.
TEST(KvReplicas, EveryEmulatedRankOfAReplicatedKvMeshIsPredicted) {
  struct Case {
    MeshShape mesh;
    int kv;
  };
  const std::vector<Case> cases = {{{1, 4, 1, true}, 2}, {{2, 4, 1, true}, 2}, {{2, 2, 1, true}, 1},
                                   {{1, 4, 1, true}, 1}};
  for (const Case& k : cases)
    for (const char* strategy : {"ddp", "zero1", "zero2", "zero3"})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
        const bool variant = std::string(strategy) == "zero1" || std::string(strategy) == "zero3";
        RunConfig cfg;
        cfg.mesh = k.mesh;
        cfg.steps = 2;
        cfg.strategy = parse_strategy(strategy);
        cfg.layers_per_unit = 1;
        cfg.model = llama_of(2, 32, 8, k.kv, 48, 64, 8, variant ? 1 : 3, mode, variant);
        cfg.model.transformer.qkv_bias = !variant;
        expect_every_rank_as_predicted(cfg);
      }
}

// A wide, short model (h 128, 4 heads of 32, one kv head; 4 tokens, a vocabulary of
// 16): the copies' all-reduce buffer (every kv head's k and v gradients, 32 KiB) beside
// d y1 is the step's peak, with and without --sp, flash and math, at tp = 2 and 4.
TEST(KvReplicas, TheCopiesGradientBufferIsThePeakOfAWideModel) {
  for (const MeshShape& mesh : {MeshShape{2, 2, 1, true}, MeshShape{1, 4, 1, true}})
    for (bool sp : {false, true})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
        RunConfig cfg;
        cfg.mesh = mesh;
        cfg.steps = 1;
        cfg.strategy = parse_strategy("ddp");
        cfg.model = llama_of(1, 128, 4, 1, 16, 16, 4, 1, mode, false);
        cfg.model.sequence_parallel = sp;
        expect_every_rank_as_predicted(cfg);
        const Prediction p = predict_data_parallel(cfg, mesh.world(), 0);
        EXPECT_EQ(p.peak_phase, Phase::backward);
        EXPECT_GE(p.peak_by_category[Category::temp], kv_replica_all_reduce_bytes(cfg.model.transformer, mesh.tp));
      }
}

// With --sp, --checkpoint (full, attention) and --accumulate 3: the copies' all-reduce
// once a layer's backward whatever re-runs its forward, once a micro-step.
TEST(KvReplicas, EveryEmulatedRankWithSequenceParallelismCheckpointOrAccumulationIsPredicted) {
  for (int variant = 0; variant < 4; ++variant)
    for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
      RunConfig cfg;
      cfg.mesh = variant % 2 == 0 ? MeshShape{2, 2, 1, true} : MeshShape{1, 4, 1, true};
      cfg.steps = 2;
      cfg.strategy = parse_strategy(variant == 2 ? "zero3" : "ddp");
      cfg.layers_per_unit = 1;
      cfg.model = llama_of(2, 32, 8, 1, 48, 64, 8, 2, mode, false);
      cfg.model.transformer.qkv_bias = true;
      if (variant == 0 || variant == 1) cfg.model.sequence_parallel = true;
      if (variant == 1 || variant == 2)
        cfg.model.checkpoint = variant == 1 ? CheckpointPolicy{CheckpointKind::every, 1}
                                            : CheckpointPolicy{CheckpointKind::attention, 1};
      if (variant == 3) cfg.accumulate = 3;
      expect_every_rank_as_predicted(cfg);
    }
}

// Tensor-parallel pipeline stages with copies (--mesh dp,tp,pp): every emulated rank of
// dp=2,tp=2,pp=2 (one kv head) and tp=4,pp=2 (two), gpipe, 1f1b, interleaved-1f1b, zb-h1
// and zbv (the copies' gradients made and all-reduced in W), holds its closed forms per
// category and each group's bytes (the tp group's with each layer's copies' all-reduce,
// once a micro-batch).
TEST(KvReplicas, EveryEmulatedRankOfAPipelineMeshIsPredicted) {
  struct Case {
    MeshShape mesh;
    int kv;
  };
  struct Schedule {
    const char* name;
    int chunks;
  };
  for (const Case& k : {Case{{2, 2, 2, true}, 1}, Case{{1, 4, 2, true}, 2}})
    for (const Schedule& sc : {Schedule{"gpipe", 1}, Schedule{"1f1b", 1}, Schedule{"interleaved-1f1b", 2},
                               Schedule{"zb-h1", 1}, Schedule{"zbv", 2}})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
        ModelConfig model = llama_of(4, 32, 4, k.kv, 8, 12, 4, 4, mode, mode == AttentionMode::math);
        model.transformer.qkv_bias = mode == AttentionMode::flash;
        const int M = std::string(sc.name) == "zbv" ? 3 : std::string(sc.name) == "zb-h1" ? 4 : 2;
        RunConfig cfg = testing::pipeline_config(sc.name, M, sc.chunks, model, 2, 3);
        cfg.mesh = k.mesh;
        for (int rank = 0; rank < k.mesh.world(); ++rank) {
          SCOPED_TRACE(std::string(sc.name) + " --mesh " + k.mesh.text() + " --kv-heads " + std::to_string(k.kv) +
                       " rank " + std::to_string(rank));
          CpuBackend backend;
          auto fake = make_fake_communicator(k.mesh.world(), rank, &backend);
          const StageRecord r = run_pipeline(cfg, backend, *fake);
          EXPECT_EQ(r.resting.total, r.predicted.resting_total);
          EXPECT_EQ(r.peak.total, r.predicted.peak_total);
          EXPECT_EQ(r.peak.by_category.bytes, r.predicted.peak_by_category.bytes);
          EXPECT_EQ(r.saved.peak_live_bytes, r.predicted.saved.peak_live_bytes);
          EXPECT_EQ(r.comm_bytes, r.predicted.comm_bytes);
          ASSERT_TRUE(r.comm_groups);
          for (const GroupCommRecord& g : *r.comm_groups) EXPECT_EQ(g.comm_bytes, g.predicted_comm_bytes) << g.axis;
        }
      }
}

// A wide, short model (h 128, 4 heads of 32, one kv head; 4 tokens, a vocabulary of 16)
// under zb-h1 and zbv at tp = 2 and 4, S = 2 and 4, M from S to 2S + 1 (zbv: 2S - 1 up):
// the copies' gradient buffer W makes (32 KiB) sets the stages' peaks (the forms without
// W's instant miss it).
TEST(KvReplicas, TheCopiesGradientBufferInWIsThePeakOfAWideZeroBubbleStage) {
  for (const MeshShape& mesh : {MeshShape{1, 2, 2, true}, MeshShape{1, 4, 2, true}, MeshShape{1, 2, 4, true}})
    for (const char* schedule : {"zb-h1", "zbv"}) {
      const bool zbv = std::string(schedule) == "zbv";
      const int S = mesh.pp;
      for (int M : zbv ? std::vector<int>{2 * S - 1, 2 * S + 1} : std::vector<int>{S, 2 * S + 1}) {
        ModelConfig model = llama_of(2 * S, 128, 4, 1, 16, 16, 4, M, AttentionMode::flash, false);
        RunConfig cfg = testing::pipeline_config(schedule, M, zbv ? 2 : 1, model, 1, 3);
        cfg.mesh = mesh;
        for (int rank = 0; rank < mesh.world(); ++rank) {
          SCOPED_TRACE(std::string(schedule) + " --mesh " + mesh.text() + " M=" + std::to_string(M) + " rank " +
                       std::to_string(rank));
          CpuBackend backend;
          auto fake = make_fake_communicator(mesh.world(), rank, &backend);
          const StageRecord r = run_pipeline(cfg, backend, *fake);
          EXPECT_EQ(r.peak.total, r.predicted.peak_total);
          EXPECT_EQ(r.peak.by_category.bytes, r.predicted.peak_by_category.bytes);
          // The peak's temp is mostly the copies' buffer (P = 32 KiB; an activation a is 2 KiB a sequence).
          EXPECT_GT(2 * r.peak.by_category.bytes[static_cast<int>(Category::temp)],
                    kv_replica_all_reduce_bytes(model.transformer, mesh.tp));
        }
      }
    }
}

}  // namespace
}  // namespace shardscope
