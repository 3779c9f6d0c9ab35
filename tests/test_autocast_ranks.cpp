// GPT-2 and Llama under autocast(bfloat16) through ddp and zero1 on every emulated rank of
// W = 1 to 4, flash and math: each rank saves what the autocast form says, rests and
// communicates what the fp32 closed forms predict (autocast keeps parameters, gradients and
// AdamW state fp32, and frees every weight cast by the end of the backward; the all-reduce
// carries the fp32 gradients), and its peak (total, per category, phase and place) is the
// bf16 step's closed form (harness/predict/autocast_step.hpp); with --accumulate (and
// --no-sync) every micro-step walks the same instants, the first one's peak kept; with
// --checkpoint full|every:K a wrapped block's casts stay in autocast's cast cache until the
// loss's end and its re-run makes them again. The shapes put the peak in different
// places: the top block's forward and backward, the head's backward, the loss's end.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "harness/predict/autocast_forms.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::mode_name;

struct AutocastShape {
  const char* family;
  int layers, hidden, heads, kv_heads, ffn, vocab, seq, batch;
  bool tied, biases;  // llama: a tied head; qkv and o biases
};

// GPT-2: the grid's shape, a wide vocabulary (the head's widened weight), long sequences
// (math's probabilities), a narrow MLP (f < h), a narrow model over a wide vocabulary and
// long sequences (the log-probabilities beside the logits). Llama: grouped-query untied,
// multi-head tied with biases, long sequences, a wide vocabulary, and the narrow one. Both:
// one long sequence through a narrow MLP (the attention's backward).
const AutocastShape kShapes[] = {
    {"gpt2", 2, 32, 4, 4, 128, 37, 8, 2, true, true},    {"gpt2", 2, 32, 4, 4, 128, 1000, 8, 2, true, true},
    {"gpt2", 3, 16, 2, 2, 64, 23, 48, 2, true, true},    {"gpt2", 2, 48, 3, 3, 24, 40, 12, 3, true, true},
    {"gpt2", 2, 16, 2, 2, 64, 200, 32, 2, true, true},   {"llama", 2, 32, 4, 2, 48, 37, 8, 2, false, false},
    {"llama", 2, 32, 4, 4, 48, 37, 8, 2, true, true},    {"llama", 3, 16, 2, 1, 40, 23, 48, 2, false, false},
    {"llama", 2, 32, 4, 2, 48, 900, 8, 2, false, true},  {"llama", 2, 16, 2, 1, 40, 200, 32, 2, false, false},
    {"gpt2", 2, 16, 2, 2, 16, 23, 128, 1, true, true},   {"llama", 2, 16, 2, 1, 16, 23, 128, 1, false, false},
};

ModelConfig autocast_model(const AutocastShape& s, AttentionMode mode) {
  TransformerShape t = testing::shape(s.family, s.layers, s.hidden, s.heads, s.kv_heads, s.ffn, s.vocab, s.seq, mode);
  t.tied_embeddings = s.tied;
  t.qkv_bias = t.out_bias = s.biases;
  ModelConfig m = testing::transformer_model(s.family, t, s.batch);
  m.autocast = true;
  return m;
}

std::string shape_label(const AutocastShape& s) {
  return std::string(s.family) + " L=" + std::to_string(s.layers) + " h=" + std::to_string(s.hidden) + " f=" +
         std::to_string(s.ffn) + " V=" + std::to_string(s.vocab) + " T=" + std::to_string(s.seq) + " B=" +
         std::to_string(s.batch);
}

TEST(AutocastRanks, EveryRankSavesRestsCommunicatesAndPeaksAsPredicted) {
  int checked = 0;
  std::set<std::string> places;
  for (const AutocastShape& s : kShapes)
    for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash})
      for (const char* strategy : {"ddp", "zero1", "ddp copy", "ddp accumulate 3", "zero1 accumulate 2 no_sync",
                                   "ddp full", "zero1 every:2", "ddp every:3 accumulate 2"})
        for (int world : {1, 2, 3, 4})
          for (int rank = 0; rank < world; ++rank) {
            RunConfig cfg;
            cfg.model = autocast_model(s, mode);
            cfg.steps = 2;
            const std::string setting = strategy;
            cfg.strategy = parse_strategy(setting.substr(0, setting.find(' ')));
            if (setting == "ddp copy") cfg.ddp_bucket = "copy";
            if (const auto k = setting.find("accumulate "); k != std::string::npos) cfg.accumulate = setting[k + 11] - '0';
            cfg.no_sync = setting.find("no_sync") != std::string::npos;
            if (setting.find("full") != std::string::npos) cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::every, 1};
            if (const auto k = setting.find("every:"); k != std::string::npos)
              cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::every, setting[k + 6] - '0'};
            SCOPED_TRACE(shape_label(s) + " " + mode_name(mode) + " " + strategy + " W=" + std::to_string(world) +
                         " r=" + std::to_string(rank));
            testing::expect_rank_measured_equals_predicted(cfg, world, rank);
            // The saves are the autocast form's (weight casts included), not the fp32 one's.
            const Prediction p = predict_data_parallel(cfg, world, rank);
            const CheckpointPolicy& ck = cfg.model.checkpoint;
            const AutocastSaved form = std::string(s.family) == "gpt2"
                                           ? gpt2_saved_after_forward_autocast(cfg.model.transformer, s.batch, ck)
                                           : llama_saved_after_forward_autocast(cfg.model.transformer, s.batch, ck);
            EXPECT_EQ(p.saved_after_forward_bytes, form.total().bytes);
            places.insert(std::string(phase_name(p.peak_phase)) + " " + p.peak_where);
            ++checked;
          }
  EXPECT_EQ(checked, 12 * 2 * 8 * 10);
  std::string seen;
  for (const std::string& p : places) seen += " [" + p + "]";
  // The peak falls in the top block's backward (layer 2 of two, 3 of three), the head's
  // backward (layer 3 after two), at the loss's end (forward, layer 3 after two) and, with
  // wrapped blocks' casts in the cache, in the top block's forward (layer 2 of two).
  EXPECT_EQ(places.size(), 4u) << seen;
  EXPECT_EQ(places.count("forward layer 3"), 1u) << seen;
  EXPECT_EQ(places.count("forward layer 2"), 1u) << seen;
}

// --checkpoint attention (the attention core's own save not kept, its recompute in bf16 in
// backward) on every shape, flash and math, ddp and zero1 (one with --accumulate 2), every
// rank of W = 1 to 4: measured == the forms, which save L·A less than the plain step's.
TEST(AutocastRanks, AttentionRecomputeOnEveryRankIsPredicted) {
  int checked = 0;
  for (const AutocastShape& s : kShapes)
    for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash})
      for (const char* strategy : {"ddp", "zero1", "ddp accumulate 2"})
        for (int world : {1, 2, 3, 4})
          for (int rank = 0; rank < world; ++rank) {
            RunConfig cfg;
            cfg.model = autocast_model(s, mode);
            cfg.steps = 2;
            const std::string setting = strategy;
            cfg.strategy = parse_strategy(setting.substr(0, setting.find(' ')));
            if (setting.find("accumulate") != std::string::npos) cfg.accumulate = 2;
            cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::attention, 1};
            SCOPED_TRACE(shape_label(s) + " " + mode_name(mode) + " " + strategy + " W=" + std::to_string(world) +
                         " r=" + std::to_string(rank));
            testing::expect_rank_measured_equals_predicted(cfg, world, rank);
            const Prediction p = predict_data_parallel(cfg, world, rank);
            const TransformerShape& t = cfg.model.transformer;
            const bool gpt2 = std::string(s.family) == "gpt2";
            const CheckpointPolicy none;
            const std::int64_t plain = (gpt2 ? gpt2_saved_after_forward_autocast(t, s.batch, none)
                                             : llama_saved_after_forward_autocast(t, s.batch, none))
                                           .total()
                                           .bytes;
            EXPECT_EQ(p.saved_after_forward_bytes, plain - s.layers * token_sizes(t, s.batch).A);
            ++checked;
          }
  EXPECT_EQ(checked, 12 * 2 * 3 * 10);
}

}  // namespace
}  // namespace shardscope
