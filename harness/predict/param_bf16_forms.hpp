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
StepBlocks gpt2_param_bf16_blocks(const TransformerShape& shape, int batch,
                                  const CheckpointPolicy& checkpoint = CheckpointPolicy{});

// StepUnits of FSDP1's bf16 units: gathered and full gradient 2·padded, the shard's cast
// 2·shard, the fp32 gradient reduce-scattered 4·padded (set when cfg.model.param_bf16).
void make_units_bf16(StepUnits& units, const RunConfig& cfg, int world);

}  // namespace shardscope
