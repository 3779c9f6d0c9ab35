// What GPT-2 and Llama save under autocast(bfloat16) (autocast_forms.hpp has the
// symbols and the op-by-op account).
#include "harness/predict/autocast_forms.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

// A GPT-2 block's Linear weights (c_attn 3h·h, c_proj h·h, c_fc f·h, mlp c_proj h·f) and
// a Llama layer's (q H·d·h, k and v K·d·h, o h·H·d, gate and up f·h, down h·f), elements
// (a tensor-parallel rank's: each a T-th; Llama's k and v one kv head's when K < T).
i64 gpt2_linear_elems(const TransformerShape& s) {
  const i64 h = s.hidden, f = s.ffn;
  return 4 * h * h + 2 * h * f;
}
i64 llama_linear_elems(const TransformerShape& s, int tp) {
  const i64 h = s.hidden, f = s.ffn / tp, hd = static_cast<i64>(s.heads / tp) * s.head_dim,
            kd = static_cast<i64>(kv_heads_per_rank(s, tp)) * s.head_dim;
  return 2 * h * hd + 2 * h * kd + 3 * h * f;
}

// The whole model from its blocks': `base` the activations outside the blocks (in
// `base_storages`), the head's weight cast 2Vh/T, and each checkpointed block its input a alone.
AutocastSaved model_saved(const AutocastSaved& block, const TokenSizes& z, const TransformerShape& s,
                          i64 base, int base_storages, const CheckpointPolicy& checkpoint, int tp) {
  const int w = checkpoint.wrapped_of(z.L);
  const int kept = z.L - w;
  AutocastSaved m;
  m.activations = {base + kept * block.activations.bytes + w * z.a, base_storages + kept * block.activations.tensors + w};
  m.param_cast = {kept * block.param_cast.bytes + 2 * static_cast<i64>(s.vocab / tp) * s.hidden,
                  kept * block.param_cast.tensors + 1};
  return m;
}

// --checkpoint attention: a block less the attention core's own save, A/T in one storage
// (flash's log-sum-exp, math's probabilities); the checkpoint keeps its inputs (q, k, v),
// and the output is the next Linear's save.
AutocastSaved without_core_save(AutocastSaved block, const TokenSizes& z, const CheckpointPolicy& checkpoint, int tp) {
  if (checkpoint.attention()) block.activations = {block.activations.bytes - z.A / tp, block.activations.tensors - 1};
  return block;
}

}  // namespace

AutocastSaved gpt2_block_saved_autocast(const TransformerShape& shape, int batch, int tp) {
  const TokenSizes z = token_sizes(shape, batch);
  const i64 q = z.a / tp;  // one of the attention's (N, h/T) tensors, fp32
  AutocastSaved b;
  // fp32: ln_1's input, x_mid, the norms' statistics; bf16 the rest.
  const i64 attention = z.flash ? 3 * q / 2 + q / 2 : 3 * q + q / 2;
  b.activations = {2 * z.a + 16 * z.N + z.a / 2 + attention + z.a / 2 + z.F / tp + z.A / tp, z.flash ? 13 : 15};
  b.param_cast = {2 * gpt2_linear_elems(shape) / tp, 4};
  return b;
}

AutocastSaved gpt2_saved_after_forward_autocast(const TransformerShape& shape, int batch,
                                                const CheckpointPolicy& checkpoint, int tp) {
  const TokenSizes z = token_sizes(shape, batch);
  // ids, arange(T); ln_f's input, mean, rstd and output cast; log-probabilities, target, total_weight
  const i64 base = 8 * z.N + 8 * z.T + z.a + 8 * z.N + z.a / 2 + z.lambda / tp + 8 * z.N + 4;
  return model_saved(without_core_save(gpt2_block_saved_autocast(shape, batch, tp), z, checkpoint, tp), z, shape,
                     base, 9, checkpoint, tp);
}

AutocastSaved llama_block_saved_autocast(const TransformerShape& shape, int batch, int tp) {
  const TokenSizes z = token_sizes(shape, batch);
  const i64 Q = 4 * z.N * (shape.heads / tp) * shape.head_dim,
            C = 4 * z.N * kv_heads_per_rank(shape, tp) * shape.head_dim;
  AutocastSaved b;
  const i64 attention = z.flash ? Q / 2 + C + Q / 2 : 3 * Q + Q / 2;
  // the input and x_mid (fp32), two rstd, five input casts (a/2), the attention, four (N, f) bf16
  b.activations = {2 * z.a + 8 * z.N + 5 * z.a / 2 + attention + z.A / tp + 2 * z.F / tp, 18};
  b.param_cast = {2 * llama_linear_elems(shape, tp), 7};
  return b;
}

AutocastSaved llama_saved_after_forward_autocast(const TransformerShape& shape, int batch,
                                                 const CheckpointPolicy& checkpoint, int tp) {
  const TokenSizes z = token_sizes(shape, batch);
  // ids; the final norm's input and rstd, the head's input cast; log-probabilities, target, total_weight
  const i64 base = 8 * z.N + z.a + 4 * z.N + z.a / 2 + z.lambda / tp + 8 * z.N + 4;
  return model_saved(without_core_save(llama_block_saved_autocast(shape, batch, tp), z, checkpoint, tp), z, shape,
                     base, 7, checkpoint, tp);
}

}  // namespace shardscope
