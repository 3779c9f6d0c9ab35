// Closed forms of what a transformer saves for backward under --precision bf16 with the
// torch engine: torch.autocast(bfloat16) semantics (docs/formulas.md, "bf16: what
// autocast saves"). Parameters stay fp32; each Linear runs its GEMM in bf16 on a bf16
// cast of its input (made per call: autocast caches only leaf tensors) and of its weight
// (made once per forward by autocast's cast cache, saved by the GEMM and so held by
// autograd until that Linear's backward: category param_cast); the GEMM's output is
// bf16; LayerNorm and RMSNorm, softmax and the loss run in fp32; a residual add of fp32
// and bf16 is fp32. Flash attention takes and saves bf16 q, k, v and output and an fp32
// log-sum-exp; the math attention on the CPU computes in fp32 (torch upcasts bf16 q, k
// and v: fp32 copies saved) and hands back bf16.
//
// Measured against torch 2.15 (bench/torch_saved.py --precision bf16: nanoGPT's module,
// equal byte for byte and storage for storage) and Hugging Face's Llama
// (bench/hf_llama_saved.py --precision bf16: equal less what the fp32 comparison
// already itemizes: the composite RMSNorm's x·rstd per norm and the rotary cos and sin).
//
// Symbols as gpt2_forms.hpp and llama_forms.hpp: B sequences, T tokens a sequence,
// N = B·T, h hidden, f ffn, V vocab, H heads, K kv heads, d head_dim; a = 4Nh, F = 4Nf,
// Λ = 4NV, Q = 4NHd, C = 4NKd; A = 4BHT (flash's log-sum-exp) or 4BHT² (math's
// probabilities). A bf16 tensor takes half its fp32 bytes (a/2, F/2, Q/2, C/2).
// --checkpoint attention (selective recompute of the attention core): each block less the
// core's own save, A in one storage (flash's lse, math's probabilities); the core's inputs
// (bf16 q, k, v) are the checkpoint's saves and its output the next Linear's.
// Under tensor parallelism (tp = T, Megatron's split) a rank saves its shards' part: every
// tensor of the attention's heads or the MLP's inner features a T-th (GPT-2's qkv and
// output, Llama's Q and C, F, A), its weights' casts a T-th, the log-probabilities Λ/T and
// the head's cast 2Vh/T; the residual stream's tensors, the norms' statistics and the
// Linears' input casts (a/2, the whole input: column-parallel GEMMs take all of it) whole;
// the storages as many.
#pragma once

#include "harness/predict/transformer_step.hpp"

namespace shardscope {

// What a forward under autocast holds for backward, split as the categories hold it:
// activations (what the model computes and saves) and param_cast (the bf16 copies of
// weights autograd holds). Torch's saved_tensors_hooks see both as saved storages that
// are no parameter: their sum is torch's figure.
struct AutocastSaved {
  SavedForm activations;
  SavedForm param_cast;
  SavedForm total() const {
    return {activations.bytes + param_cast.bytes, activations.tensors + param_cast.tensors};
  }
};

// GPT-2, one transformer block:
//   activations  flash 5a + F + 16N + A in 13 storages: ln_1's input (fp32), mean and
//                rstd; c_attn's input cast (a/2); qkv (3a/2, q, k, v its views); the
//                output (a/2, c_proj's input too); the lse; x_mid (fp32); ln_2's mean,
//                rstd and input cast (a/2); c_fc's output (F/2, GELU's input); GELU's
//                output (F/2, mlp c_proj's input)
//                math 13a/2 + F + 16N + A in 15: qkv and the output replaced by fp32
//                q, k, v (3a, whatever B and H) and the bf16 output copied token-major (a/2)
//   param_cast   2·(4h² + 2hf) in 4: c_attn's, c_proj's, c_fc's and mlp c_proj's weights
AutocastSaved gpt2_block_saved_autocast(const TransformerShape& shape, int batch, int tp = 1);
// The model after forward and loss: the ids and arange(T) 8N + 8T, the blocks, ln_f's
// input a, mean and rstd 8N and output cast a/2, the log-probabilities Λ (fp32), the
// target 8N and total_weight 4 (activations, 9 storages beside the blocks'), and the
// head's cast of the tied wte 2Vh (param_cast, 1). A block checkpointed saves its input
// alone (a, 1 storage) and holds no cast after forward (its casts die with the cast cache
// when the autocast region ends, and are made again by its recompute).
AutocastSaved gpt2_saved_after_forward_autocast(const TransformerShape& shape, int batch,
                                                const CheckpointPolicy& checkpoint = CheckpointPolicy{}, int tp = 1);

// Llama (ours: RMSNorm fused, saving its fp32 input and rstd; RoPE in the attention's
// kernel, no cos and sin tables), one decoder layer:
//   activations  flash 9a/2 + Q + C + 8N + A + 2F in 18 storages: the input (fp32) and
//                rstd; q_proj's, k_proj's and v_proj's input casts (a/2 each: one per
//                call, as torch's autocast casts); rotated q and k and v (Q/2, C/2,
//                C/2); the output (Q/2, o_proj's input); the lse; x_mid (fp32); rstd;
//                gate_proj's and up_proj's input casts (a/2 each); gate's output, its
//                SiLU, up's output and their product (F/2 each)
//                math 9a/2 + 7Q/2 + 8N + A + 2F in 18: q, k and v expanded to H heads in
//                fp32 (Q each) and the output bf16 token-major (Q/2)
//   param_cast   4hHd + 4hKd + 6hf in 7: q, k, v, o, gate, up and down weights
AutocastSaved llama_block_saved_autocast(const TransformerShape& shape, int batch, int tp = 1);
// The model after forward and loss: the ids 8N, the layers, the final norm's input a and
// rstd 4N and the head's input cast a/2, the log-probabilities Λ, the target 8N and
// total_weight 4 (activations, 7 storages beside the layers'), and the head's weight cast
// 2Vh (lm_head's, or the tied embedding's: param_cast, 1). Checkpointed layers as GPT-2's.
AutocastSaved llama_saved_after_forward_autocast(const TransformerShape& shape, int batch,
                                                 const CheckpointPolicy& checkpoint = CheckpointPolicy{}, int tp = 1);

}  // namespace shardscope
