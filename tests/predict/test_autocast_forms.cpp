// What GPT-2 and Llama save under autocast(bfloat16) (harness/predict/autocast_forms):
// the closed forms against torch 2.15's figures, measured by the benches on the CPU
// (unique storages saved for backward after forward + loss, parameters excluded; the
// Linears' bf16 weight casts among them, reported apart as param_cast).
#include <gtest/gtest.h>

#include <string>

#include "harness/predict/autocast_forms.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

struct Shape {
  int layers, hidden, heads, kv_heads, ffn, vocab, seq, batch;
};

TransformerShape gpt2(const Shape& s, AttentionMode mode) {
  TransformerShape t;
  t.model_type = "gpt2";
  t.layers = s.layers;
  t.hidden = s.hidden;
  t.heads = t.kv_heads = s.heads;
  t.head_dim = s.hidden / s.heads;
  t.ffn = 4 * s.hidden;
  t.vocab = s.vocab;
  t.seq = t.positions = s.seq;
  t.tied_embeddings = t.qkv_bias = t.out_bias = true;
  t.attention = mode;
  return t;
}

TransformerShape llama(const Shape& s, AttentionMode mode) {
  TransformerShape t;
  t.model_type = "llama";
  t.layers = s.layers;
  t.hidden = s.hidden;
  t.heads = s.heads;
  t.kv_heads = s.kv_heads;
  t.head_dim = s.hidden / s.heads;
  t.ffn = s.ffn;
  t.vocab = s.vocab;
  t.seq = s.seq;
  t.positions = 64;
  t.attention = mode;
  return t;
}

std::string label(const Shape& s, AttentionMode mode) {
  return std::string(mode == AttentionMode::flash ? "flash" : "math") + " L=" + std::to_string(s.layers) +
         " h=" + std::to_string(s.hidden) + " B=" + std::to_string(s.batch);
}

struct TorchSaved {
  Shape shape;
  AttentionMode mode;
  CheckpointPolicy checkpoint;
  i64 bytes;
  int storages;
  i64 cast_bytes;
  int casts;
};

// bench/torch_saved.py --precision bf16 (nanoGPT's module under torch.autocast("cpu",
// dtype=torch.bfloat16)):
//   --layers 2 --hidden 64 --heads 4 --vocab 100 --seq 16 --batch 2
//     math 424836 B in 48 storages (param_cast 209408 B in 9) / flash 384900 B in 44
//   --layers 3 --hidden 96 --heads 6 --vocab 257 --seq 24 --batch 3
//     math 1829092 B in 67 (param_cast 712896 B in 13) / flash 1585444 B in 61
//   --layers 2 --hidden 48 --heads 3 --vocab 50 --seq 12 --batch 1   (one sequence: math's
//     v is an fp32 copy, never a view, unlike fp32's)
//     math 173860 B in 48 (param_cast 115392 B in 9) / flash 163780 B in 44
//   --layers 3 --hidden 64 --heads 4 --vocab 100 --seq 16 --batch 2 --checkpoint every:2
//     math 248196 B in 31 (param_cast 111104 B in 5) / flash 228228 B in 29
//   --layers 12 --hidden 768 --heads 12 --vocab 50257 --seq 256 --positions 1024 --batch 1
//     math 436603396 B in 238 (param_cast 247064064 B in 49) / flash 384846340 B in 214
const CheckpointPolicy kNone{};
const CheckpointPolicy kEvery2{CheckpointKind::every, 2};
const TorchSaved kTorchGpt2[] = {
    {{2, 64, 4, 4, 256, 100, 16, 2}, AttentionMode::math, kNone, 424836, 48, 209408, 9},
    {{2, 64, 4, 4, 256, 100, 16, 2}, AttentionMode::flash, kNone, 384900, 44, 209408, 9},
    {{3, 96, 6, 6, 384, 257, 24, 3}, AttentionMode::math, kNone, 1829092, 67, 712896, 13},
    {{3, 96, 6, 6, 384, 257, 24, 3}, AttentionMode::flash, kNone, 1585444, 61, 712896, 13},
    {{2, 48, 3, 3, 192, 50, 12, 1}, AttentionMode::math, kNone, 173860, 48, 115392, 9},
    {{2, 48, 3, 3, 192, 50, 12, 1}, AttentionMode::flash, kNone, 163780, 44, 115392, 9},
    {{3, 64, 4, 4, 256, 100, 16, 2}, AttentionMode::math, kEvery2, 248196, 31, 111104, 5},
    {{3, 64, 4, 4, 256, 100, 16, 2}, AttentionMode::flash, kEvery2, 228228, 29, 111104, 5},
    {{12, 768, 12, 12, 3072, 50257, 256, 1}, AttentionMode::math, kNone, 436603396, 238, 247064064, 49},
    {{12, 768, 12, 12, 3072, 50257, 256, 1}, AttentionMode::flash, kNone, 384846340, 214, 247064064, 49},
};

TEST(AutocastForms, Gpt2SavesWhatTorchAutocastSaves) {
  for (const TorchSaved& c : kTorchGpt2) {
    SCOPED_TRACE(label(c.shape, c.mode) + " checkpoint " + c.checkpoint.text());
    const AutocastSaved form = gpt2_saved_after_forward_autocast(gpt2(c.shape, c.mode), c.shape.batch, c.checkpoint);
    EXPECT_EQ(form.total().bytes, c.bytes);
    EXPECT_EQ(form.total().tensors, c.storages);
    EXPECT_EQ(form.param_cast.bytes, c.cast_bytes);
    EXPECT_EQ(form.param_cast.tensors, c.casts);
  }
}

// bench/hf_llama_saved.py --precision bf16 (transformers' LlamaForCausalLM under
// autocast; sdpa is torch's CPU flash kernel, sdpa-math SDPBackend.MATH):
//   --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 160 --vocab 100 --seq 16 --batch 2
//     sdpa 435332 B in 65 storages (param_cast 184832 B in 15) / sdpa-math 483460 B in 65
//   --layers 3 --hidden 96 --heads 6 --kv-heads 2 --ffn 256 --vocab 257 --seq 24 --batch 3
//     sdpa 1885828 B in 92 (param_cast 639168 B in 22) / sdpa-math 2184772 B in 92
//   --layers 3 (first shape) --checkpoint every:2
//     sdpa 258436 B in 40 (param_cast 98816 B in 8)
// Ours saves less by what the fp32 comparison itemizes: each composite RMSNorm's x·rstd
// (fp32, a; 2L + 1 of them, or 2·unwrapped + 1 under checkpointing) and the rotary cos
// and sin (fp32, (1, 1, T, d) each, once per forward). Its casts are HF's exactly.
const TorchSaved kHfLlama[] = {
    {{2, 64, 4, 2, 160, 100, 16, 2}, AttentionMode::math, kNone, 483460, 65, 184832, 15},
    {{2, 64, 4, 2, 160, 100, 16, 2}, AttentionMode::flash, kNone, 435332, 65, 184832, 15},
    {{3, 96, 6, 2, 256, 257, 24, 3}, AttentionMode::math, kNone, 2184772, 92, 639168, 22},
    {{3, 96, 6, 2, 256, 257, 24, 3}, AttentionMode::flash, kNone, 1885828, 92, 639168, 22},
    {{3, 64, 4, 2, 160, 100, 16, 2}, AttentionMode::flash, kEvery2, 258436, 40, 98816, 8},
};

TEST(AutocastForms, LlamaSavesHuggingFacesAutocastFigureLessItsNormProductsAndRotaryTables) {
  for (const TorchSaved& c : kHfLlama) {
    SCOPED_TRACE(label(c.shape, c.mode) + " checkpoint " + c.checkpoint.text());
    const TransformerShape t = llama(c.shape, c.mode);
    const AutocastSaved form = llama_saved_after_forward_autocast(t, c.shape.batch, c.checkpoint);
    const int norms = 2 * (c.shape.layers - c.checkpoint.wrapped_of(c.shape.layers)) + 1;
    const i64 a = 4 * static_cast<i64>(c.shape.batch) * c.shape.seq * c.shape.hidden;
    const i64 rotary = 2 * 4 * static_cast<i64>(c.shape.seq) * t.head_dim;
    EXPECT_EQ(form.total().bytes, c.bytes - norms * a - rotary);
    EXPECT_EQ(form.total().tensors, c.storages - norms - 2);
    EXPECT_EQ(form.param_cast.bytes, c.cast_bytes);
    EXPECT_EQ(form.param_cast.tensors, c.casts);
  }
}

// The casts are the Linears' weights in bf16, whatever the batch: 2 bytes per weight
// element of every Linear, the head's included (a tied head's cast is the embedding's).
TEST(AutocastForms, ParamCastIsTwoBytesPerLinearWeightElement) {
  const Shape s{4, 128, 8, 2, 352, 1000, 32, 3};
  for (int batch : {1, 5}) {
    const TransformerShape g = gpt2(s, AttentionMode::flash);
    const i64 h = s.hidden, f = g.ffn;
    EXPECT_EQ(gpt2_saved_after_forward_autocast(g, batch).param_cast.bytes,
              2 * (s.layers * (3 * h * h + h * h + f * h + h * f) + s.vocab * h));
    const TransformerShape l = llama(s, AttentionMode::math);
    const i64 q = static_cast<i64>(s.heads) * l.head_dim, kv = static_cast<i64>(s.kv_heads) * l.head_dim;
    EXPECT_EQ(llama_saved_after_forward_autocast(l, batch).param_cast.bytes,
              2 * (s.layers * (q * h + 2 * kv * h + h * q + 3 * s.ffn * h) + s.vocab * h));
  }
}

}  // namespace
}  // namespace shardscope
