// GPT-2's step under --precision bf16 with zero2/zero3/hsdp (FSDP1's MixedPrecision(
// param_dtype=bf16, reduce_dtype=fp32); harness/model/gpt2_param_bf16.cpp): what the bf16
// module saves (torch 2.15's figures, bench/torch_saved.py --precision module) and what its
// blocks hold, for the transformer step's walk (transformer_step.hpp), whose units are
// gathered in bf16 (StepUnits::bf16). docs/formulas.md, "bf16 under FSDP, the transformers".
//
// Symbols: N = B·T tokens; b = 2Nh (one bf16 (N, h) activation), p = 2Nf, Λ' = 2NV (the
// bf16 logits); the attention's save A: flash's fp32 log-sum-exp 4·B·H·T, math's fp32
// probabilities 4·B·H·T²; X = 16N (the ids and the target, int64, temp throughout).
#pragma once

#include "harness/predict/transformer_step.hpp"

namespace shardscope {

// Saved for backward after forward + loss: per block
//   flash  8b + 8N + A + 2p in 13 storages (ln_1's input, bf16 mean and rstd 2N each, ln_1's
//          output, qkv 3b, the output, the lse, x_mid, ln_2's mean, rstd and output, c_fc's
//          and GELU's outputs)
//   math   11b + 8N + A + 2p in 15 (q, k, v fp32 head-major 2b each in place of qkv)
// and the model 8N + 8T + L·block + b + 4N + b + Λ' + 8N + 2 in 9 + 13L | 9 + 15L (the ids,
// arange(T); ln_f's input, mean, rstd and output; the bf16 log-probabilities, the target and
// a bf16 total_weight).
// --checkpoint full|every:K: a wrapped block saves its bf16 input alone (b, one storage).
// --checkpoint attention: a block saves 8b + 8N + 2p in 12 storages, flash and math alike
// (the core's inputs qkv and its output y; no lse, no fp32 q, k, v or probabilities).
SavedForm gpt2_saved_after_forward_param_bf16(const TransformerShape& shape, int batch,
                                              const CheckpointPolicy& checkpoint = CheckpointPolicy{});

// What GPT-2's bf16 blocks hold (the walk's a is b, its Λ is Λ'): base 8T + b (arange, x0),
// K = 8N + 8b + A + 2p (flash) | 8N + 11b + A + 2p (math) a block's activations beside its
// input, its output included; the final block's 4N + b; total_weight 2 B. A block's
// backward from A4 = S + K − b with dy = b (temp):
//   mlp c_proj   temp X + b + p (d gelu), act A4
//   c_fc         temp X + 2b + p (d ln_2), act A4 − 2p (GELU's and c_fc's outputs released)
//   ln_2         temp X + 3b (dx_mid), act A4 − 2p − b
//   c_proj       temp X + 2b (dx_mid, d y), act R = S + 4N + b + H (H: flash 4b + A, math 7b + A)
//   flash        temp X + 5b (dqkv 3b), act R
//   math         the output released (R − b); dy's fp32 upcast 2b beside d y: temp X + 4b;
//                then the math backward in fp32 (d out head-major 2b beside it: X + 5b; dP A,
//                dv 2b: X + 5b + A; v and the probabilities released; dq, dk 2b each: X + 5b
//                + A and X + 7b + A, act S + 4N + 5b); dqkv bf16 3b beside dq, dk, dv: X + 10b,
//                act S + 4N + b
//   c_attn       temp X + 5b (d ln_1 beside dqkv), act S + 4N + b
//   ln_1         temp X + 3b (dx beside d ln_1 and dx_mid), act S + 4N.
// The forward's instants lie below the block's end (its output beside K), which the walk
// takes at each unit's top block; the final block's are fp32's walk with Λ' and 2 B.
// --checkpoint full|every:K: a wrapped block holds its output b past its forward; its re-run
// at the start of its backward peaks at its output made (temp, freed at once) beside dy:
// temp X + 2b, act S + K − b (math's instants inside lie lower: its upcast q, k, v beside
// qkv hold 4N + 7b + 4b, its output's fp32 copy 4N + 9b + A + 3b, against 8N + 11b + A + 2p
// + 2b).
// --checkpoint attention: K = 8N + 8b + 2p; math's forward under the core's checkpoint and
// the core's re-run in backward (flash and math) as formulas.md writes them.
StepBlocks gpt2_param_bf16_blocks(const TransformerShape& shape, int batch,
                                  const CheckpointPolicy& checkpoint = CheckpointPolicy{});

// Llama's bf16 module (harness/model/llama_param_bf16.cpp: Hugging Face's LlamaForCausalLM
// cast to bf16; llama_param_bf16_forms.cpp). Symbols besides the above: q2 = 2N·H·d (bf16 q
// and the attention's output), c2 = 2N·K·d (bf16 k, v), Q = 4N·H·d (math's fp32 q, k and v
// head-major, k and v expanded to H heads), Λ = 4NV (the fp32 log-probabilities).
// Saved for backward after forward + loss: per layer sv =
//   flash  6b + 8N + 2q2 + 2c2 + A + 4p in 15 storages (each norm's fp32 upcast 2b, fp32
//          rstd 4N and bf16 output b; q, k, v, the output and the lse; the MLP's four)
//   math   6b + 8N + 3Q + A + q2 + 4p in 15 (fp32 q, k, v head-major and probabilities, the
//          bf16 output, in place of flash's five)
// and the model 8N + L·sv + 3b + 4N + Λ + 8N + 4 in 7 + 15L (the ids; the final norm's
// upcast, rstd and output; the log-probabilities, the target and total_weight). Hugging
// Face's module saves (2L + 1)·b (each norm's bf16 x·rstd) and 4Td (bf16 cos and sin, once
// a forward) more, in 2L + 3 storages.
// --checkpoint full|every:K: a wrapped layer saves its bf16 input alone (b, one storage).
SavedForm llama_saved_after_forward_param_bf16(const TransformerShape& shape, int batch,
                                               const CheckpointPolicy& checkpoint = CheckpointPolicy{});
// What Llama's bf16 blocks hold, for the walk (StepBlocks::stream_temp: no block saves the
// bf16 stream). K = sv; the final block's 3b + 4N; total_weight 4 B. A layer's forward from
// T0 = X + its input (temp; activation when wrapped, then in A0) and A0 = S: the input
// norm's upcast, rstd and output (A0 + 3b + 4N); flash: q, k, v and then the output and lse
// (A0 + 3b + 4N + H, H = 2q2 + 2c2 + A); math: q, k, v bf16 (temp q2 + 2c2) beside their
// fp32 copies (3Q), then the probabilities A, the head-major output (temp Q) and its
// token-major fp32 copy (Q, activation) beside it, then the bf16 output (q2) beside that
// copy (H = 3Q + A + q2); x_mid (temp b); the second norm's 3b + 4N; the MLP's 4p; the output
// (b: temp, or activation when the next layer is wrapped) beside x_mid, which is then freed.
// A layer's backward from A4 = S + sv (a wrapped layer's saved input in S), dy = b:
//   down         temp X + b + p (d product), act A4
//   the factors  temp X + b + 2p (d up), act A4 − p
//   up, gate     temp X + 2b + 2p (d y2), act A4 − 4p
//   norm 2       temp X + 3b (d x_mid), act A4 − 4p − b; then A5 = A4 − 4p − 3b − 4N
//   o_proj       temp X + b + q2 (d out, dy freed), act A5
//   flash        temp X + b + 2q2 + 2c2 (d q, k, v), act A5; then A6 = A5 − H
//   math         the output freed (Am = A5 − q2): d out's fp32 upcast X + b + q2 + Q; d out
//                head-major X + b + 2Q; dP X + b + Q + A; dv X + b + 2Q + A; v and the
//                probabilities released (Am − Q − A): dq X + b + 2Q + A, dk X + b + 3Q + A; q
//                and k released (A6 = Am − 3Q − A): dq, dk, dv bf16 beside them X + b + 3Q +
//                q2 + 2c2
//   v, k, q      temp X + 2b + q2 + 2c2 (d y1), act A6 = S + 3b + 4N
//   norm 1       temp X + 3b (dx beside d y1 and d x_mid), act A6 − b.
// A wrapped layer's re-run at the start of its backward is its forward with dy held
// (T0 = X + b), its output temp and freed at once. The loss: the final block's bf16 logits
// (2NV) beside its input (temp X + b + 2NV, act S + 3b + 4N); their fp32 upcast beside the
// logits, the loss scalar, the log-probabilities and total_weight (temp X + 6NV + 4, act S +
// 3b + 4N + Λ + 4); in backward the fp32 dlogits (X + Λ) beside them, then (released) the bf16
// dlogits beside the fp32 (X + 6NV, act S + 3b + 4N); the final block's backward from the
// bf16 dlogits (2NV).
StepBlocks llama_param_bf16_blocks(const TransformerShape& shape, int batch,
                                   const CheckpointPolicy& checkpoint = CheckpointPolicy{});

// The family's bf16 module (GPT-2's or Llama's, by the model's name): its saves after
// forward and its blocks for the walk.
SavedForm param_bf16_saved_after_forward(const ModelConfig& model, const CheckpointPolicy& checkpoint);
StepBlocks param_bf16_blocks(const ModelConfig& model, const CheckpointPolicy& checkpoint);

// StepUnits of FSDP1's bf16 units: gathered and full gradient 2·padded, the shard's cast
// 2·shard, the fp32 gradient reduce-scattered 4·padded (set when cfg.model.param_bf16).
void make_units_bf16(StepUnits& units, const RunConfig& cfg, int world);

}  // namespace shardscope
