// Megatron's tensor parallelism of the transformers (--mesh dp=D,tp=T, --model gpt2|llama):
// what a rank holds (at most 0.6 of the one-rank model's parameters at tp = 2 on a GPT-2
// shape; a slice starts as the one-rank model's elements), the vocabulary-parallel
// kernels against the whole ones, shapes tp does not divide refused naming them, and
// every rank of W = 2, 4 and 8 meshes played alone (--emulate) against the closed forms,
// byte for byte and group by group.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "harness/comm/fake_comm.hpp"
#include "harness/model/models.hpp"
#include "harness/predict/transformer_forms.hpp"
#include "shardscope/check.hpp"
#include "support/mesh_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::gpt2_of;
using testing::llama_of;

TEST(TensorParallelTransformer, Gpt2TpTwoHoldsAtMostSixTenthsOfTheParameters) {
  // GPT-2 small's proportions, shrunk: h 64, 4 heads, ffn 4h, vocab 512, 64 positions.
  const ModelConfig m = gpt2_of(4, 64, 4, 512, 32, 2, AttentionMode::flash, 0, 64);
  const std::int64_t whole = make_model(m)->params();
  ASSERT_EQ(whole, transformer_params(m.transformer));
  const auto whole_model = make_model(m);
  const std::vector<float> all = whole_model->init_flat_slice(5, 0, whole_model->params());
  for (int tp : {2, 4})
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(r));
      const auto slice = make_model(m, TensorParallel{tp, r});
      std::int64_t forms = 0;
      const std::vector<std::int64_t> sizes = transformer_tensor_sizes(m.transformer, tp);
      ASSERT_EQ(static_cast<int>(sizes.size()), slice->param_tensors());
      for (int t = 0; t < slice->param_tensors(); ++t) {
        EXPECT_EQ(slice->tensor_elems(t), sizes[t]) << slice->tensor(t).name;
        forms += sizes[t];
      }
      EXPECT_EQ(slice->params(), forms);
      if (tp == 2) {
        EXPECT_LE(static_cast<double>(slice->params()), 0.6 * static_cast<double>(whole));
      }
      // A slice starts as the one-rank model's elements: q, k and v's rows of its heads,
      // c_proj's columns, the vocabulary's rows.
      const std::vector<float> mine = slice->init_flat_slice(5, 0, slice->params());
      ASSERT_GT(std::abs(mine.at(0)), 0.0f);
      EXPECT_EQ(mine, testing::pick(all, testing::full_indices(m, tp, r)));
    }
}

// Llama tied and untied, with q/k/v biases (qwen2's): each rank's tensors are the forms'
// and start as the one-rank model's elements (its query and kv heads' rows, o_proj's and
// down_proj's columns, gate's and up's rows, the vocabulary's rows of the table and head).
TEST(TensorParallelTransformer, LlamaSlicesAreTheFormsAndTheOneRankModelsElements) {
  for (bool tied : {false, true})
    for (bool bias : {false, true}) {
      ModelConfig m = llama_of(2, 64, 8, 4, 96, 256, 16, 2, AttentionMode::flash, tied);
      m.transformer.qkv_bias = m.transformer.out_bias = bias;
      const auto whole = make_model(m);
      ASSERT_EQ(whole->params(), transformer_params(m.transformer));
      const std::vector<float> all = whole->init_flat_slice(7, 0, whole->params());
      for (int tp : {2, 4})
        for (int r = 0; r < tp; ++r) {
          SCOPED_TRACE("tied " + std::to_string(tied) + " bias " + std::to_string(bias) + " tp " +
                       std::to_string(tp) + " rank " + std::to_string(r));
          const auto slice = make_model(m, TensorParallel{tp, r});
          const std::vector<std::int64_t> sizes = transformer_tensor_sizes(m.transformer, tp);
          ASSERT_EQ(static_cast<int>(sizes.size()), slice->param_tensors());
          for (int t = 0; t < slice->param_tensors(); ++t)
            EXPECT_EQ(slice->tensor_elems(t), sizes[t]) << slice->tensor(t).name;
          if (tp == 2) {
            EXPECT_LE(static_cast<double>(slice->params()), 0.6 * static_cast<double>(whole->params()));
          }
          EXPECT_EQ(slice->init_flat_slice(7, 0, slice->params()), testing::pick(all, testing::full_indices(m, tp, r)));
        }
    }
}

TEST(TensorParallelTransformer, ShapesThatDoNotDivideAreRefusedNamingThem) {
  auto refused = [](const ModelConfig& m, int tp, const std::string& what) {
    try {
      check_tensor_parallel(m, tp);
      ADD_FAILURE() << "accepted " << what;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--mesh tp=" + std::to_string(tp)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(gpt2_of(2, 48, 3, 256, 8, 1, AttentionMode::flash), 2, "heads (3)");
  refused(gpt2_of(2, 64, 4, 250, 8, 1, AttentionMode::flash), 4, "vocabulary (250)");
  refused(gpt2_of(2, 64, 4, 256, 8, 1, AttentionMode::flash, 90), 4, "ffn (90)");
  EXPECT_NO_THROW(check_tensor_parallel(gpt2_of(2, 64, 4, 256, 8, 1, AttentionMode::flash), 4));
  // Llama: kv heads that tp neither divides nor is divided by (fewer than tp and
  // dividing it are replicated: test_kv_replicas.cpp), and heads tp does not divide.
  refused(llama_of(2, 48, 12, 6, 96, 256, 8, 1, AttentionMode::flash, false), 4, "kv heads (6)");
  refused(llama_of(2, 64, 8, 8, 96, 256, 8, 1, AttentionMode::flash, false), 3, "heads (8)");
  EXPECT_NO_THROW(check_tensor_parallel(llama_of(2, 64, 8, 4, 96, 256, 8, 1, AttentionMode::flash, false), 4));
}

// The vocabulary-parallel kernels on T column slices against the whole ones: the
// lookup's slices sum to the whole lookup; the group's statistics give the whole
// log-softmax; the slices' losses sum to the loss; the gradients are the whole one's
// columns.
TEST(TensorParallelTransformer, VocabularyParallelKernelsMatchTheWholeOnes) {
  const int n = 6, V = 12, T = 3, Vl = V / T, h = 5;
  std::vector<std::int64_t> ids = {0, 5, 11, 4, 7, 8};
  std::vector<float> table(V * h), logits(n * V);
  for (int i = 0; i < V * h; ++i) table[i] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
  for (int i = 0; i < n * V; ++i) logits[i] = 3.0f * std::cos(0.91f * static_cast<float>(i));
  CpuBackend be;
  std::vector<float> whole(n * h), sum(n * h, 0.0f), part(n * h);
  be.embedding_forward(whole.data(), ids.data(), table.data(), n, h);
  std::vector<float> lp(n * V), dl(n * V);
  float loss = 0.0f;
  be.log_softmax_forward(lp.data(), logits.data(), n, V);
  be.nll_loss_forward(&loss, lp.data(), ids.data(), n, V, 1.0f);
  be.cross_entropy_backward(dl.data(), lp.data(), ids.data(), n, V, 1.0f);
  // Column slices of the logits, and the statistics all-reduced by hand.
  std::vector<std::vector<float>> cols(T, std::vector<float>(n * Vl));
  for (int r = 0; r < T; ++r)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < Vl; ++j) cols[r][i * Vl + j] = logits[i * V + r * Vl + j];
  std::vector<float> mx(n, -1e30f), se(n, 0.0f), one(n);
  for (int r = 0; r < T; ++r) {
    be.row_max(one.data(), cols[r].data(), n, Vl);
    for (int i = 0; i < n; ++i) mx[i] = std::max(mx[i], one[i]);
  }
  for (int r = 0; r < T; ++r) {
    be.row_sum_exp(one.data(), cols[r].data(), mx.data(), n, Vl);
    for (int i = 0; i < n; ++i) se[i] += one[i];
  }
  float loss_sum = 0.0f;
  for (int r = 0; r < T; ++r) {
    be.vocab_embedding_forward(part.data(), ids.data(), table.data() + r * Vl * h, n, h, r * Vl, Vl);
    for (int i = 0; i < n * h; ++i) sum[i] += part[i];
    std::vector<float> lpr(n * Vl), dlr(n * Vl);
    be.log_softmax_given(lpr.data(), cols[r].data(), mx.data(), se.data(), n, Vl);
    float lr = 0.0f;
    be.vocab_nll_loss_forward(&lr, lpr.data(), ids.data(), n, Vl, r * Vl, 1.0f);
    loss_sum += lr;
    be.vocab_cross_entropy_backward(dlr.data(), lpr.data(), ids.data(), n, Vl, r * Vl, 1.0f);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < Vl; ++j) {
        EXPECT_NEAR(lpr[i * Vl + j], lp[i * V + r * Vl + j], 1e-5f);
        EXPECT_NEAR(dlr[i * Vl + j], dl[i * V + r * Vl + j], 1e-6f);
      }
    // The table's gradient: only this rank's rows, each the whole one's.
    std::vector<float> dt(Vl * h, 9.0f), dwhole(V * h);
    be.vocab_embedding_backward(dt.data(), ids.data(), whole.data(), n, h, r * Vl, Vl, 0.0f);
    be.embedding_backward(dwhole.data(), ids.data(), whole.data(), n, h, V, 0.0f);
    for (int i = 0; i < Vl * h; ++i) EXPECT_EQ(dt[i], dwhole[r * Vl * h + i]);
  }
  ASSERT_GT(std::abs(loss), 0.0f);
  EXPECT_NEAR(loss_sum, loss, 1e-5f);
  EXPECT_EQ(sum, whole);
}

void expect_every_rank_as_predicted(const RunConfig& cfg) {
  const int world = cfg.mesh.world();
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("--mesh " + cfg.mesh.text() + " " + std::string(strategy_name(cfg.strategy)) + " batch " +
                 std::to_string(cfg.model.batch) + " " +
                 (cfg.model.transformer.attention == AttentionMode::flash ? "flash" : "math") + " rank " +
                 std::to_string(rank));
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

// W = 2, 4 and 8; ddp and zero1 along dp; flash and math attention; one sequence (math's
// v a view of qkv) and several; tp up to the heads (one head a rank: v a view again).
TEST(TensorParallelTransformer, EveryEmulatedRankOfAGpt2MeshIsPredicted) {
  const std::vector<MeshShape> meshes = {{1, 2, 1, true}, {2, 2, 1, true}, {1, 4, 1, true},
                                         {2, 4, 1, true}, {4, 2, 1, true}};
  for (const MeshShape& mesh : meshes)
    for (const char* strategy : {"ddp", "zero1"})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
        for (int batch : {1, 3}) {
          RunConfig cfg;
          cfg.mesh = mesh;
          cfg.steps = 2;
          cfg.strategy = parse_strategy(strategy);
          cfg.model = gpt2_of(2, 32, 4, 64, 8, batch, mode, 0, 12);
          expect_every_rank_as_predicted(cfg);
        }
}

// Llama: grouped-query attention split by heads (K/T kv heads a rank, one at T = K),
// tied and untied heads, q/k/v biases, flash and math.
TEST(TensorParallelTransformer, EveryEmulatedRankOfALlamaMeshIsPredicted) {
  const std::vector<MeshShape> meshes = {{1, 2, 1, true}, {2, 2, 1, true}, {1, 4, 1, true}, {2, 4, 1, true}};
  for (const MeshShape& mesh : meshes)
    for (const char* strategy : {"ddp", "zero1"})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
        for (int variant = 0; variant < 2; ++variant) {
          RunConfig cfg;
          cfg.mesh = mesh;
          cfg.steps = 2;
          cfg.strategy = parse_strategy(strategy);
          cfg.model = llama_of(2, 32, 8, 4, 48, 64, 8, variant == 0 ? 1 : 3, mode, variant == 1);
          cfg.model.transformer.qkv_bias = variant == 0;
          expect_every_rank_as_predicted(cfg);
        }
}

// zero2 and zero3 along dp (FSDP1's flat units of the rank's tensors: one root unit, or
// a root and units of K blocks), GPT-2 and Llama, W = 4 and 8.
TEST(TensorParallelTransformer, EveryEmulatedRankUnderFsdpAlongDataParallelIsPredicted) {
  for (const MeshShape& mesh : {MeshShape{2, 2, 1, true}, MeshShape{4, 2, 1, true}, MeshShape{2, 4, 1, true}})
    for (const char* strategy : {"zero2", "zero3"})
      for (int units : {0, 1, 2})
        for (bool llama : {false, true}) {
          RunConfig cfg;
          cfg.mesh = mesh;
          cfg.steps = 2;
          cfg.strategy = parse_strategy(strategy);
          cfg.layers_per_unit = units;
          cfg.model = llama ? llama_of(3, 32, 8, 4, 48, 64, 8, 2, AttentionMode::math, units == 1)
                            : gpt2_of(3, 32, 4, 64, 8, units == 2 ? 1 : 3, AttentionMode::flash, 0, 12);
          expect_every_rank_as_predicted(cfg);
        }
}

// --checkpoint full, every:2 and attention: a wrapped block's re-run (its all-reduces
// again) and the attention core's recompute, GPT-2 and Llama, flash and math, ddp and
// zero3 along dp.
TEST(TensorParallelTransformer, EveryEmulatedRankOfACheckpointedMeshIsPredicted) {
  for (const MeshShape& mesh : {MeshShape{2, 2, 1, true}, MeshShape{1, 4, 1, true}})
    for (const char* strategy : {"ddp", "zero3"})
      for (const CheckpointPolicy& policy : {CheckpointPolicy{CheckpointKind::every, 1},
                                             CheckpointPolicy{CheckpointKind::every, 2},
                                             CheckpointPolicy{CheckpointKind::attention, 1}})
        for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
          for (bool llama : {false, true}) {
            RunConfig cfg;
            cfg.mesh = mesh;
            cfg.steps = 2;
            cfg.strategy = parse_strategy(strategy);
            cfg.layers_per_unit = 1;
            cfg.model = llama ? llama_of(3, 32, 8, 4, 48, 64, 8, 2, mode, false)
                              : gpt2_of(3, 32, 4, 64, 8, 2, mode, 0, 12);
            cfg.model.checkpoint = policy;
            expect_every_rank_as_predicted(cfg);
          }
}

// --accumulate K (and --no-sync) under ddp and zero1: each micro-step's forward and
// backward with its all-reduces, the gradients reduced after each micro-step or once.
TEST(TensorParallelTransformer, EveryEmulatedRankOfAnAccumulatingMeshIsPredicted) {
  for (const char* strategy : {"ddp", "zero1"})
    for (bool no_sync : {false, true})
      for (bool llama : {false, true}) {
        RunConfig cfg;
        cfg.mesh = MeshShape{2, 2, 1, true};
        cfg.steps = 2;
        cfg.strategy = parse_strategy(strategy);
        cfg.layers_per_unit = 1;
        cfg.accumulate = 3;
        cfg.no_sync = no_sync;
        cfg.model = llama ? llama_of(2, 32, 8, 4, 48, 64, 8, 3, AttentionMode::math, false)
                          : gpt2_of(2, 32, 4, 64, 8, 3, AttentionMode::flash, 0, 12);
        expect_every_rank_as_predicted(cfg);
      }
}

// --sp, Megatron's sequence parallelism: every rank of dp=2,tp=2, tp=4, dp=4,tp=2 and
// dp=2,tp=4, ddp and zero1 along dp, flash and math, one sequence (math's v a view of
// qkv) and several: the norms' and residuals' tokens a T-th, each gathered and partial
// tensor (N, h) in temp, the all-gathers and reduce-scatters of the tp group by kind.
TEST(TensorParallelTransformer, EveryEmulatedRankOfASequenceParallelGpt2MeshIsPredicted) {
  const std::vector<MeshShape> meshes = {{2, 2, 1, true}, {1, 4, 1, true}, {4, 2, 1, true}, {2, 4, 1, true}};
  for (const MeshShape& mesh : meshes)
    for (const char* strategy : {"ddp", "zero1"})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
        for (int batch : {1, 3}) {
          RunConfig cfg;
          cfg.mesh = mesh;
          cfg.steps = 2;
          cfg.strategy = parse_strategy(strategy);
          cfg.model = gpt2_of(2, 32, 4, 64, 8, batch, mode, 0, 12);
          cfg.model.sequence_parallel = true;
          expect_every_rank_as_predicted(cfg);
        }
}

// Llama under --sp: grouped-query attention split by heads, tied and untied, q/k/v biases
// and o_proj's bias, flash and math, the RMSNorms on a rank's N/T tokens, its embedding's
// sum reduce-scattered.
TEST(TensorParallelTransformer, EveryEmulatedRankOfASequenceParallelLlamaMeshIsPredicted) {
  const std::vector<MeshShape> meshes = {{2, 2, 1, true}, {1, 4, 1, true}, {4, 2, 1, true}, {2, 4, 1, true}};
  for (const MeshShape& mesh : meshes)
    for (const char* strategy : {"ddp", "zero1"})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
        for (int variant = 0; variant < 2; ++variant) {
          RunConfig cfg;
          cfg.mesh = mesh;
          cfg.steps = 2;
          cfg.strategy = parse_strategy(strategy);
          cfg.model = llama_of(2, 32, 8, 4, 48, 64, 8, variant == 0 ? 1 : 3, mode, variant == 1);
          cfg.model.transformer.qkv_bias = cfg.model.transformer.out_bias = variant == 0;
          cfg.model.sequence_parallel = true;
          expect_every_rank_as_predicted(cfg);
        }
}

// --sp with zero2 and zero3 along dp (FSDP1's flat units: one root unit, or a root and
// units of 1 or 2 blocks), with --checkpoint full, every:2 and attention (a wrapped
// block's re-run gathers and reduce-scatters again), and with --accumulate 3 under ddp
// and zero1 (the norms' parts added onto the gradient), GPT-2 and Llama.
TEST(TensorParallelTransformer, EveryEmulatedRankOfASequenceParallelFsdpCheckpointedOrAccumulatingMeshIsPredicted) {
  for (const MeshShape& mesh : {MeshShape{2, 2, 1, true}, MeshShape{4, 2, 1, true}, MeshShape{2, 4, 1, true}})
    for (const char* strategy : {"zero2", "zero3"})
      for (int units : {0, 1, 2})
        for (bool llama : {false, true}) {
          RunConfig cfg;
          cfg.mesh = mesh;
          cfg.steps = 2;
          cfg.strategy = parse_strategy(strategy);
          cfg.layers_per_unit = units;
          cfg.model = llama ? llama_of(3, 32, 8, 4, 48, 64, 8, 2, AttentionMode::math, units == 1)
                            : gpt2_of(3, 32, 4, 64, 8, units == 2 ? 1 : 3, AttentionMode::flash, 0, 12);
          cfg.model.sequence_parallel = true;
          expect_every_rank_as_predicted(cfg);
        }
  for (const MeshShape& mesh : {MeshShape{2, 2, 1, true}, MeshShape{1, 4, 1, true}})
    for (const char* strategy : {"ddp", "zero3"})
      for (const CheckpointPolicy& policy : {CheckpointPolicy{CheckpointKind::every, 1},
                                             CheckpointPolicy{CheckpointKind::every, 2},
                                             CheckpointPolicy{CheckpointKind::attention, 1}})
        for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
          for (bool llama : {false, true}) {
            RunConfig cfg;
            cfg.mesh = mesh;
            cfg.steps = 2;
            cfg.strategy = parse_strategy(strategy);
            cfg.layers_per_unit = 1;
            cfg.model = llama ? llama_of(3, 32, 8, 4, 48, 64, 8, 2, mode, false)
                              : gpt2_of(3, 32, 4, 64, 8, 2, mode, 0, 12);
            cfg.model.checkpoint = policy;
            cfg.model.sequence_parallel = true;
            expect_every_rank_as_predicted(cfg);
          }
  for (const char* strategy : {"ddp", "zero1"})
    for (bool no_sync : {false, true})
      for (bool llama : {false, true}) {
        RunConfig cfg;
        cfg.mesh = MeshShape{2, 2, 1, true};
        cfg.steps = 2;
        cfg.strategy = parse_strategy(strategy);
        cfg.accumulate = 3;
        cfg.no_sync = no_sync;
        cfg.model = llama ? llama_of(2, 32, 8, 4, 48, 64, 8, 3, AttentionMode::math, false)
                          : gpt2_of(2, 32, 4, 64, 8, 3, AttentionMode::flash, 0, 12);
        cfg.model.sequence_parallel = true;
        expect_every_rank_as_predicted(cfg);
      }
}

// At the same shape --sp saves fewer bytes than tp alone (the stream's tensors a T-th:
// measured, and as the closed forms say), and moves the tp group's bytes as all-gathers
// and reduce-scatters instead of all-reduces.
TEST(TensorParallelTransformer, SequenceParallelismSavesFewerBytes) {
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (bool llama : {false, true}) {
      RunConfig cfg;
      cfg.mesh = MeshShape{2, 2, 1, true};
      cfg.steps = 1;
      cfg.model = llama ? llama_of(2, 32, 8, 4, 48, 64, 8, 2, mode, false) : gpt2_of(2, 32, 4, 64, 8, 2, mode, 0, 12);
      RunConfig sp = cfg;
      sp.model.sequence_parallel = true;
      CpuBackend b1, b2;
      auto f1 = make_fake_communicator(4, 1, &b1);
      auto f2 = make_fake_communicator(4, 1, &b2);
      const testing::MeshResult tp = testing::run_mesh(cfg, b1, *f1, false);
      const testing::MeshResult seq = testing::run_mesh(sp, b2, *f2, false);
      ASSERT_GT(seq.dp.saved.bytes, 0);
      EXPECT_LT(seq.dp.saved.bytes, tp.dp.saved.bytes);
      EXPECT_EQ(seq.dp.saved.bytes, predict_data_parallel(sp, 4, 1).saved_after_forward_bytes);
      EXPECT_LT(seq.dp.peak.by_category[Category::activation], tp.dp.peak.by_category[Category::activation]);
      EXPECT_EQ(tp.tp_ledger[CollKind::all_gather].calls, 0);
      EXPECT_GT(seq.tp_ledger[CollKind::all_gather].calls, 0);
      EXPECT_GT(seq.tp_ledger[CollKind::reduce_scatter].calls, 0);
    }
}

TEST(TensorParallelTransformer, EveryEmulatedRankOfAnEightWayGpt2MeshIsPredicted) {
  for (const MeshShape& mesh : {MeshShape{1, 8, 1, true}, MeshShape{2, 4, 1, true}})
    for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
      RunConfig cfg;
      cfg.mesh = mesh;
      cfg.steps = 1;
      cfg.strategy = parse_strategy("ddp");
      cfg.model = gpt2_of(1, 64, 8, 128, 8, 2, mode);
      cfg.ddp_bucket = "copy";
      expect_every_rank_as_predicted(cfg);
    }
}

}  // namespace
}  // namespace shardscope
