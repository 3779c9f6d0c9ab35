// What a transformer's data-parallel step holds besides its model states, walked once
// for both families (docs/formulas.md, "A transformer's step"): the instants at which a
// step's live bytes can be highest, in time order, each a formula. The family says what
// its blocks hold (gpt2_forms.hpp, llama_forms.hpp); the walk says when FSDP's units are
// gathered, prefetched and given their full gradients, and which block is the top one
// backward reaches; the units say how many bytes each holds gathered and as its full
// gradient (FSDP1's flat parameter, or --engine fsdp2's per-tensor buffers).
//
// Symbols: N = B·T tokens, a = 4Nh (one (N, h) activation), Λ = 4NV (the logits),
// X = 16N (the batch's ids and the target: temp for the whole step).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/predict/micro_steps.hpp"
#include "shardscope/category.hpp"
#include "shardscope/config.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

// Saved for backward: unique storages holding bytes (parameters excluded), as torch's
// saved_tensors_hooks count them.
struct SavedForm {
  std::int64_t bytes = 0;
  int tensors = 0;
};

// FSDP's units as the step's walk needs them (harness/strategies/partition.hpp forms
// them): unit 0 the root (the embeddings and the final block), then units of
// transformer blocks. Empty for ddp and zero1.
struct StepUnits {
  std::vector<std::int64_t> bytes;       // each unit's gathered parameters (4 × its padded flat parameter)
  std::vector<std::int64_t> grad_bytes;  // each unit's full gradient (4 × its padded flat parameter)
  // --engine fsdp2: a gather copies out of, and a reduce-scatter copies into, a flat comm
  // buffer of the unit's gathered bytes, live beside every gathered tensor of the unit
  // (the copy-out) or every full gradient of it (the copy-in).
  bool flat_comm = false;
  std::vector<std::int64_t> shard_bytes;  // each unit's reduce-scatter output (4 × shard; fsdp2's 4·A_u)
  std::vector<int> top_block;       // each unit's last block (a model block index)
  bool reshard = false;             // zero3: units but the root are freed after their forward
  bool prefetch = true;             // --prefetch 1: a unit's backward gathers the next
  // --overlap on: a unit's reduce-scatter stays in flight through the next unit's
  // backward, its full gradient (FSDP1) or flat input (fsdp2), and a staging output when
  // it adds onto the shard, held until that unit's reduce begins. Off where nothing is
  // posted (DeepSpeed's walk, deepspeed_forms.cpp, builds its units without it).
  bool overlap = false;
  // --accumulate: the step's distinct micro-steps in time order (micro_steps.hpp), each
  // walked; one plain step without.
  std::vector<MicroStep> micro{MicroStep{}};
  // --precision bf16 (FSDP1's MixedPrecision, param_bf16_forms.hpp): bytes and grad_bytes
  // are the bf16 unit's and its bf16 full gradient (2 B an element); a gather holds the
  // shard's bf16 cast (cast_bytes, param_cast) until its all-gather completes (under
  // --overlap on a prefetch's to its wait), and a reduction casts the bf16 gradient to an
  // fp32 one (reduce_bytes) beside it before the bf16 goes; that fp32 one is reduce-scattered
  // (the one in flight under --overlap on).
  bool bf16 = false;
  std::vector<std::int64_t> cast_bytes, reduce_bytes;
  // --engine fsdp2 under bf16 with --accumulate --no-sync (fsdp2.hpp): each unit's gradients
  // kept across the micro-steps in fp32 (accum_bytes, 4·E_u), each micro-step's bf16 ones
  // (grad_bytes) folded in when the unit's backward ends; the first micro-step's fold is
  // highest at the unit's last tensor, accum_bytes plus that tensor's bf16 gradient
  // (fold_bytes). Empty otherwise: a unit keeps its grad_bytes.
  std::vector<std::int64_t> accum_bytes, fold_bytes;
};
StepUnits step_units(const RunConfig& cfg, int world);

// What a data-parallel step holds beyond its resting bytes at its peak, per category,
// with the phase and place of that instant.
struct StepTransient {
  CategoryBytes bytes;
  Phase phase = Phase::forward;
  std::string where;
};

// One instant of a walk, as a pipeline's piece reads a top block's (transformer_piece.hpp):
// temp and activation, and whether the block's dy (a, counted in temp) is still alive.
struct WalkInstant {
  std::int64_t temp = 0, act = 0;
  bool dy_live = false;
};

// The walk's instants: the first of the largest total is kept, as the tracker keeps it.
class PeakWalk {
 public:
  // One instant: temp and activation beyond the resting bytes, gathered parameters and
  // full gradients; dy_live: a block's backward still holds its dy (in temp).
  // cast: the shards' bf16 casts live (param_cast, --precision bf16).
  void consider(std::int64_t temp, std::int64_t act, std::int64_t gathered, std::int64_t grad_full, Phase phase,
                const std::string& where, bool dy_live = false, std::int64_t comm = 0, std::int64_t cast = 0);
  const StepTransient& best() const { return best_; }
  // Every instant considered is also appended here (none when null).
  void record(std::vector<WalkInstant>* into) { record_ = into; }
  // Bytes held beside every instant considered from now on (a collective in flight:
  // its full gradient, its comm buffers), until held again.
  void hold(std::int64_t grad_full, std::int64_t comm, std::int64_t cast = 0) {
    held_grad_ = grad_full;
    held_comm_ = comm;
    held_cast_ = cast;
  }

 private:
  StepTransient best_;
  std::int64_t best_total_ = -1;
  std::int64_t held_grad_ = 0, held_comm_ = 0, held_cast_ = 0;
  std::vector<WalkInstant>* record_ = nullptr;
};

// A shape's sizes in bytes, for `batch` sequences: N = B·T tokens, a = 4Nh, F = 4Nf,
// Λ = 4NV, and the attention's save A: flash's log-sum-exp 4·B·H·T, math's
// probabilities 4·B·H·T².
struct TokenSizes {
  std::int64_t N = 0, T = 0, a = 0, F = 0, lambda = 0, A = 0;
  int L = 0;
  bool flash = true;
};
TokenSizes token_sizes(const TransformerShape& shape, int batch);

// What a family's blocks hold, for the walk.
struct StepBlocks {
  explicit StepBlocks(const TokenSizes& z) : N(z.N), a(z.a), lambda(z.lambda), L(z.L) {}
  std::int64_t N = 0, a = 0, lambda = 0;
  int L = 0;
  std::int64_t base = 0;        // activations before block 1: the embeddings' saves beside the ids, and x0
  std::int64_t K = 0;           // a transformer block's: its saves less its input, with its output
  std::int64_t final_held = 0;  // the final block's beside its input: the norm's statistics and output
  std::int64_t loss_weight = 4;  // nll_loss's total_weight (saved): fp32 4 B, bf16 logits' 2 B
  // Tensor parallelism: vocab_parallel_cross_entropy's statistics (temp), made once the
  // loss's total_weight is and freed before the loss scalar is written (0: none).
  std::int64_t loss_stats = 0;
  // --sp: the final norm's output gathered for the head (temp, the whole (N, h)) beside
  // the logits, before the loss (0: none). With --sp a block's `a` (its input, output and
  // dy) is the rank's N/T tokens' a/T.
  std::int64_t head_gather = 0;
  // The final block's backward after the loss's gradient, from A1 (the activations once
  // the log-probabilities and total_weight are released) with dlogits (Λ) in temp. Empty:
  // its d norm (a) beside dlogits, then its dx (a) with the norm's output released.
  std::function<void(PeakWalk&, std::int64_t A1, std::int64_t gathered, std::int64_t grad_full,
                     const std::string& where)>
      final_backward;
  // --checkpoint: transformer block i (model block i + 1) wrapped when checkpoint.wraps(i);
  // a wrapped block holds only its output (a) between its forward and its backward.
  CheckpointPolicy checkpoint;
  // A top block's backward: each gradient buffer as it is made, from A4 (the
  // activations once its output is freed) with dy = a held.
  std::function<void(PeakWalk&, std::int64_t A4, std::int64_t gathered, std::int64_t grad_full,
                     const std::string& where)>
      backward;
  // Instants inside a block's forward, from S (the activations below it, its input among
  // them), that can rise above its output: --checkpoint attention's (math), the
  // probabilities beside the head-major output once they are no longer kept; --sp's, the
  // row-parallel Linear's whole partial product beside the block's output. Empty
  // otherwise (every forward instant then lies below the block's output or the same
  // block's backward).
  std::function<void(PeakWalk&, std::int64_t S, std::int64_t gathered, std::int64_t grad_full,
                     const std::string& where)>
      forward_attention;
  // A wrapped block's re-run at the start of its backward: its forward's instants from
  // S (the activations below it, its input among them) with dy = a held; the re-run
  // output is temp (no block saves its own output) and freed at once.
  std::function<void(PeakWalk&, std::int64_t S, std::int64_t gathered, std::int64_t grad_full,
                     const std::string& where)>
      recompute;
  // A family whose blocks save no bf16 stream (Llama's bf16 module: each norm saves its fp32
  // upcast): between blocks the stream tensor (a, temp) lives until the next block's forward
  // ends, and K is a block's saves alone; a wrapped block's input is its checkpoint's save (a,
  // activation: held[b] counts it, at the block's own place) and stays through its backward.
  // Then forward_block walks every block's forward (b: its model index, 1..L; S: the
  // activations below it, its saved input not among them), recompute starts from S with its
  // saved input, and backward from A4 = the activations with the block's saves (its saved
  // input among them). Off for every other family (their figures unchanged).
  bool stream_temp = false;
  std::function<void(PeakWalk&, int b, std::int64_t S, std::int64_t gathered, std::int64_t grad_full,
                     const std::string& where)>
      forward_block;
  // The forward's end and the loss's gradient when the loss holds more than the logits
  // (Llama's bf16 module: the final block's bf16 logits beside its input, their fp32 upcast
  // beside the log-probabilities, the fp32 dlogits then their bf16 cast), from S = the
  // activations after the last block; dlogits (λ) is what the final block's backward
  // starts from. Empty: the logits' and log-probabilities' Λ each.
  std::function<void(PeakWalk&, std::int64_t S, std::int64_t gathered, std::int64_t grad_full,
                     const std::string& forward_where, const std::string& backward_where)>
      loss;
};
StepTransient transformer_step_transient(const StepBlocks& blocks, const StepUnits& units);

// --sp's final block, both families: its norm's output gathered for the head (w, the
// whole (N, h)); in backward (dlogits Λ held) gathered again, the head's whole input
// gradient (w) reduce-scattered to d norm out (a, the rank's tokens), then dx (a) and the
// norm's part of its gradients (g), its output released.
void sequence_parallel_final(StepBlocks& blocks, std::int64_t w, std::int64_t g);

// Completes a transformer's data-parallel predictions, whose model states are filled:
// the peak (resting + the step's transient) and the saves after forward, on every rank.
void complete_step(const StepTransient& step, const SavedForm& saved, std::vector<Prediction>& ranks);

}  // namespace shardscope
