// --engine fsdp2 (harness/strategies/fsdp2.hpp, harness/predict/fsdp2_forms.hpp): every
// emulated rank measures what the closed forms predict, the seed model's ranks rest at
// what torch's fully_shard holds, and the tensors' dim-0 shapes the forms list are the
// model's.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "harness/comm/fake_comm.hpp"
#include "harness/predict/fsdp2_forms.hpp"
#include "harness/strategies/partition.hpp"
#include "support/dp_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::run_dp;

RunConfig fsdp2_config(const ModelConfig& m, const char* strategy, int units, int prefetch) {
  RunConfig cfg;
  cfg.model = m;
  cfg.steps = 2;
  cfg.strategy = parse_strategy(strategy);
  cfg.engine = EngineKind::fsdp2;
  cfg.layers_per_unit = units;
  cfg.prefetch = prefetch;
  return cfg;
}

ModelConfig gpt2_model(int layers, int hidden, int heads, int vocab, int seq, int batch, AttentionMode mode) {
  ModelConfig m;
  m.name = "gpt2";
  m.layers = layers;
  m.width = hidden;
  m.batch = batch;
  TransformerShape& t = m.transformer;
  t.model_type = "gpt2";
  t.layers = layers;
  t.hidden = hidden;
  t.heads = t.kv_heads = heads;
  t.head_dim = hidden / heads;
  t.ffn = 4 * hidden;
  t.vocab = vocab;
  t.seq = seq;
  t.positions = seq + 3;
  t.tied_embeddings = t.qkv_bias = t.out_bias = true;
  t.attention = mode;
  return m;
}

// One emulated rank against its prediction: resting per category and the bytes handed
// to collectives always; the peak (total, categories, phase, place) and the saves after
// forward where the forms know the peak.
// Returns the measured peak's comm bytes (the flat buffer of a gather or a reduce-scatter).
std::int64_t check_rank(const RunConfig& cfg, int world, int rank, const std::string& what) {
  CpuBackend backend;
  auto comm = make_fake_communicator(world, rank, &backend);
  const auto r = run_dp(cfg, backend, *comm, false);
  const Prediction p = predict_data_parallel(cfg, world, rank);
  SCOPED_TRACE(what + " W=" + std::to_string(world) + " r=" + std::to_string(rank));
  for (int k = 0; k < kCategoryCount; ++k)
    EXPECT_EQ(r.resting.bytes[k], p.resting.bytes[k]) << "resting " << kCategoryNames[k];
  for (int k = 0; k < kCollKindCount; ++k)
    EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]) << "comm " << kCollKindNames[k];
  EXPECT_TRUE(p.peak_known);
  EXPECT_EQ(r.peak.total, p.peak_total);
  for (int k = 0; k < kCategoryCount; ++k)
    EXPECT_EQ(r.peak.by_category.bytes[k], p.peak_by_category.bytes[k]) << "at the peak " << kCategoryNames[k];
  EXPECT_EQ(std::string(phase_name(r.peak.phase)), std::string(phase_name(p.peak_phase)));
  EXPECT_EQ(r.where, p.peak_where);
  EXPECT_EQ(r.saved.bytes, p.saved_after_forward_bytes);
  EXPECT_EQ(r.saved.tensors, p.saved_after_forward_tensors);
  return r.peak.by_category[Category::comm];
}

TEST(Fsdp2, Dim0ShardsAreTorchChunkSizes) {
  // torch.chunk(256 rows, 3): 86, 86, 84; (5 rows, 4): 2, 2, 1 and none.
  const Dim0Shard w = dim0_shard({256, 256}, 3);
  EXPECT_EQ(w.chunk_rows, 86);
  EXPECT_EQ(w.padded(), 86 * 256);
  EXPECT_EQ(w.local_rows(0), 86);
  EXPECT_EQ(w.local_rows(2), 84);
  const Dim0Shard b = dim0_shard({5}, 4);
  EXPECT_EQ(b.chunk_rows, 2);
  EXPECT_EQ(b.local_rows(2), 1);
  EXPECT_EQ(b.local_rows(3), 0);
  EXPECT_EQ(b.padded(), 2);
}

// bench/torch_fsdp2.py measured torch 2.15.0 (CPU, gloo) on the seed model (8 x 256, relu,
// mse, batch 32 a rank, AdamW, after step 3), per rank, the storages of the sharded
// parameters, their gradients and AdamW's state (what shardscope categorises; c10's
// allocator holds 4·W bytes more per fully_shard group, made at construction):
//   bench/torch_fsdp2.py --torch-only --worlds 2,3,4 --configs zero2-unit,zero3-unit
//   W = 2  4,210,752 on both ranks
//   W = 3  2,829,120 / 2,829,120 / 2,796,224
//   W = 4  2,105,408 on every rank
// (param / grad / optim at W = 3: 707,264 / 707,264 / 1,414,592, rank 2's optim 1,381,696).
TEST(Fsdp2, TheSeedModelRestsWhereTorchsFullyShardDoes) {
  const std::vector<std::vector<std::int64_t>> torch_resting = {
      {4'210'752, 4'210'752}, {2'829'120, 2'829'120, 2'796'224}, {2'105'408, 2'105'408, 2'105'408, 2'105'408}};
  ModelConfig seed;
  seed.activation = Activation::relu;
  seed.loss = Loss::mse;
  for (const char* strategy : {"zero2", "zero3"})
    for (int world = 2; world <= 4; ++world)
      for (int rank = 0; rank < world; ++rank) {
        const RunConfig cfg = fsdp2_config(seed, strategy, 1, 1);
        CpuBackend backend;
        auto comm = make_fake_communicator(world, rank, &backend);
        const auto r = run_dp(cfg, backend, *comm, false);
        SCOPED_TRACE(std::string(strategy) + " W=" + std::to_string(world) + " r=" + std::to_string(rank));
        EXPECT_EQ(r.resting.total(), torch_resting[world - 2][rank]);
        EXPECT_EQ(predict_data_parallel(cfg, world, rank).resting.total(), torch_resting[world - 2][rank]);
      }
  // Where the torch engine (FSDP1's flat units) rests alike on every rank.
  RunConfig flat = fsdp2_config(seed, "zero2", 1, 1);
  flat.engine = EngineKind::torch;
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(predict_data_parallel(flat, 3, rank).resting.total(), 2'807'200);
}

TEST(Fsdp2, MlpMeasuredEqualsPredictedEveryRank) {
  ModelConfig seed;  // 8 x 256, none, sum, batch 32
  ModelConfig small;
  small.layers = 5;
  small.width = 24;
  small.batch = 3;
  small.activation = Activation::relu;
  small.loss = Loss::mse;
  ModelConfig odd;  // 7 rows: at W = 4 the last rank holds one row, at W = 3 ... 3, 3, 1
  odd.layers = 3;
  odd.width = 7;
  odd.batch = 2;
  odd.loss = Loss::mse;
  ModelConfig tiny;  // 2 rows: at W = 3 and 4 some ranks hold none of any tensor
  tiny.layers = 2;
  tiny.width = 2;
  tiny.batch = 5;
  tiny.activation = Activation::relu;
  ModelConfig wide_batch;  // activations above the gathered units
  wide_batch.layers = 4;
  wide_batch.width = 16;
  wide_batch.batch = 512;
  int checked = 0;
  for (const ModelConfig& m : {seed, small, odd, tiny, wide_batch})
    for (const char* s : {"zero2", "zero3"})
      for (int k : {0, 1, 2})
        for (int pf : {0, 1})
          for (int world = 1; world <= 4; ++world)
            for (int rank = 0; rank < world; ++rank) {
              if (k > m.layers) continue;
              check_rank(fsdp2_config(m, s, k, pf), world, rank,
                         std::string(s) + " units=" + std::to_string(k) + " prefetch=" + std::to_string(pf) +
                             " " + std::to_string(m.layers) + "x" + std::to_string(m.width));
              ++checked;
            }
  EXPECT_GT(checked, 500);
}

// --checkpoint full|every:K on the MLP under fsdp2: a wrapped layer's forward keeps only
// its input, its backward re-runs it after the unit is gathered (and the unit below
// prefetched) and its full gradients made. Both activations and losses, zero2 and zero3,
// the root unit and units of one and two layers, prefetch and --overlap on and off, one
// and two micro-steps (with and without --no-sync): every rank of W = 1 to 4 measures the
// prediction, some peaks fall in a unit's top layer's recompute (block 3 or 4), and the
// saves after forward drop the last relu output when the last layer is wrapped.
TEST(Fsdp2, CheckpointedMlpMeasuresWhatItPredicts) {
  int checked = 0, recompute_peaks = 0;
  std::set<std::string> places;
  for (const int every : {1, 2, 3})
    for (Activation act : {Activation::none, Activation::relu})
      for (Loss loss : {Loss::sum, Loss::mse})
        for (const char* s : {"zero2", "zero3"})
          for (int units : {0, 1, 2})
            for (int variant = 0; variant < 4; ++variant)  // prefetch+overlap, neither, --accumulate 2 (+ --no-sync)
              for (int world = 1; world <= 4; ++world)
                for (int rank = 0; rank < world; ++rank) {
                  ModelConfig m;
                  m.layers = 5;
                  m.width = 13;  // uneven chunks at W = 2, 3, 4
                  m.batch = 7;
                  m.activation = act;
                  m.loss = loss;
                  m.checkpoint = CheckpointPolicy{CheckpointKind::every, every};
                  RunConfig cfg = fsdp2_config(m, s, units, variant == 1 ? 0 : 1);
                  cfg.overlap = variant != 1;
                  if (variant >= 2) cfg.accumulate = 2;
                  cfg.no_sync = variant == 3;
                  check_rank(cfg, world, rank,
                             std::string(s) + " checkpoint=" + m.checkpoint.text() +
                                 (act == Activation::relu ? " relu" : " none") + (loss == Loss::mse ? " mse" : " sum") +
                                 " units=" + std::to_string(units) + " variant=" + std::to_string(variant));
                  const Prediction p = predict_data_parallel(cfg, world, rank);
                  if (p.peak_where.rfind("recompute", 0) == 0) {
                    ++recompute_peaks;
                    places.insert(p.peak_where);
                  }
                  ++checked;
                }
  EXPECT_EQ(checked, 3 * 2 * 2 * 2 * 3 * 4 * 10);
  EXPECT_GT(recompute_peaks, 0);
  EXPECT_LT(recompute_peaks, checked);
  for (const std::string& at : places) EXPECT_TRUE(at == "recompute of block 3" || at == "recompute of block 4") << at;
  // The saves after forward: every Linear's input, mse's target and its input, and the
  // last layer's relu output only when the last layer (4) is not wrapped.
  ModelConfig m;
  m.layers = 5, m.width = 13, m.batch = 7, m.activation = Activation::relu;
  const std::int64_t a = 4 * 7 * 13;
  for (const int every : {1, 2, 3}) {
    m.checkpoint = CheckpointPolicy{CheckpointKind::every, every};
    const Prediction p = predict_data_parallel(fsdp2_config(m, "zero3", 1, 1), 3, 0);
    const bool last_wrapped = 4 % every == 0;
    EXPECT_EQ(p.saved_after_forward_bytes, (last_wrapped ? 5 : 6) * a) << every;
  }
}

TEST(Fsdp2, TheFormsTensorRowsAreTheModelsShapes) {
  ModelConfig mlp;
  mlp.layers = 3;
  mlp.width = 9;
  std::vector<ModelConfig> models = {mlp, gpt2_model(2, 16, 2, 29, 6, 2, AttentionMode::flash)};
  for (const ModelConfig& m : models) {
    const std::unique_ptr<Model> model = make_model(m);
    const auto rows = fsdp2_tensor_rows(m);
    ASSERT_EQ(static_cast<int>(rows.size()), model->param_tensors()) << m.name;
    for (int t = 0; t < model->param_tensors(); ++t) {
      const Dim0Shard s = dim0_shard(model->tensor(t).shape, 3);
      EXPECT_EQ(rows[t].first, s.rows) << m.name << " tensor " << model->tensor(t).name;
      EXPECT_EQ(rows[t].second, s.row_elems) << m.name << " tensor " << model->tensor(t).name;
    }
  }
}

// A transformer's step: the torch engine's walk with fsdp2's buffers. Units of one block
// (k = 1), of two, and the root alone (k = 0); prefetch on and off; flash and math; the
// shapes chosen so that the peak falls at the flat comm buffer of a gather or a
// reduce-scatter (a short batch beside a large vocabulary) as well as in a block's
// backward (a long one).
int check_transformer(const ModelConfig& m, const std::string& name, int& at_comm) {
  int checked = 0;
  for (const char* s : {"zero2", "zero3"})
    for (int k : {0, 1, 2})
      for (int pf : {0, 1})
        for (int world = 1; world <= 4; ++world)
          for (int rank = 0; rank < world; ++rank) {
            const std::int64_t comm = check_rank(fsdp2_config(m, s, k, pf), world, rank,
                                                 name + " " + s + " units=" + std::to_string(k) +
                                                     " prefetch=" + std::to_string(pf));
            if (comm > 0) ++at_comm;
            ++checked;
          }
  return checked;
}

TEST(Fsdp2, Gpt2MeasuredEqualsPredictedEveryRank) {
  int checked = 0, at_comm = 0;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string m = mode == AttentionMode::flash ? "flash" : "math";
    // 29 tokens: the embedding's rows split unevenly at W = 2, 3, 4.
    checked += check_transformer(gpt2_model(3, 16, 2, 29, 6, 2, mode), "gpt2 " + m, at_comm);
    checked += check_transformer(gpt2_model(2, 24, 3, 301, 3, 1, mode), "gpt2 short " + m, at_comm);
    checked += check_transformer(gpt2_model(4, 8, 2, 11, 16, 4, mode), "gpt2 long " + m, at_comm);
  }
  EXPECT_EQ(checked, 720);
  EXPECT_GT(at_comm, 0);
  EXPECT_LT(at_comm, checked);
}

TEST(Fsdp2, LlamaMeasuredEqualsPredictedEveryRank) {
  int checked = 0, at_comm = 0;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (bool tied : {false, true}) {
      const std::string m = std::string(mode == AttentionMode::flash ? "flash" : "math") + (tied ? " tied" : "");
      // Grouped-query (4 heads, 2 kv heads), 37 tokens.
      checked += check_transformer(testing::llama_of(3, 16, 4, 2, 40, 37, 6, 2, mode, tied), "llama " + m, at_comm);
      checked += check_transformer(testing::llama_of(2, 24, 2, 1, 56, 401, 3, 1, mode, tied), "llama short " + m,
                                   at_comm);
      checked += check_transformer(testing::llama_of(3, 8, 2, 2, 20, 13, 16, 4, mode, tied), "llama long " + m,
                                   at_comm);
    }
  EXPECT_EQ(checked, 1440);
  EXPECT_GT(at_comm, 0);
  EXPECT_LT(at_comm, checked);
}

// --checkpoint with fsdp2: a wrapped block's re-run and saves are the torch engine's
// walk's, under fsdp2's buffers (full and every:2).
TEST(Fsdp2, CheckpointedTransformersMeasureWhatTheyPredict) {
  int checked = 0, at_comm = 0;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (int every : {1, 2}) {
      CheckpointPolicy ck;
      ck.kind = CheckpointKind::every;
      ck.every = every;
      std::vector<ModelConfig> models = {gpt2_model(3, 16, 2, 29, 6, 2, mode), gpt2_model(4, 8, 2, 11, 16, 4, mode),
                                         testing::llama_of(3, 16, 4, 2, 40, 37, 6, 2, mode, false),
                                         testing::llama_of(2, 24, 2, 1, 56, 401, 3, 1, mode, true)};
      for (ModelConfig& m : models) {
        m.checkpoint = ck;
        checked += check_transformer(m, m.name + " checkpoint " + ck.text(), at_comm);
      }
    }
  EXPECT_EQ(checked, 1920);
  EXPECT_GT(at_comm, 0);
  EXPECT_LT(at_comm, checked);
}

// ddp and zero1 under --engine fsdp2 are the torch engine's, to the byte.
TEST(Fsdp2, DdpAndZero1AreTheTorchEngines) {
  ModelConfig m;
  m.layers = 3;
  m.width = 10;
  m.batch = 4;
  for (const char* s : {"ddp", "zero1"})
    for (int rank = 0; rank < 3; ++rank) {
      RunConfig a = fsdp2_config(m, s, 1, 1), b = a;
      b.engine = EngineKind::torch;
      CpuBackend ba, bb;
      auto ca = make_fake_communicator(3, rank, &ba), cb = make_fake_communicator(3, rank, &bb);
      const auto ra = run_dp(a, ba, *ca, false), rb = run_dp(b, bb, *cb, false);
      EXPECT_EQ(ra.resting, rb.resting) << s;
      EXPECT_EQ(ra.peak.total, rb.peak.total) << s;
    }
}

TEST(Fsdp2, EnginesAreParsedByName) {
  EXPECT_EQ(parse_engine("torch"), EngineKind::torch);
  EXPECT_EQ(parse_engine("fsdp2"), EngineKind::fsdp2);
  EXPECT_EQ(parse_engine("deepspeed"), EngineKind::deepspeed);  // built: test_deepspeed.cpp
  try {
    parse_engine("fsdp1");
    FAIL() << "fsdp1 accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--engine: unknown 'fsdp1'; allowed: torch, fsdp2, deepspeed"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardscope
