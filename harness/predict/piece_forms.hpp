// What one micro-batch costs a pipeline piece (docs/formulas.md, "The pipeline forms,
// written out" and "Transformers"): a piece is the run of blocks one virtual stage holds
// (the MLP's layers; a transformer's blocks, the embeddings with the first and the final
// block and loss with the last). The pipeline forms (pipeline_forms.cpp) place these
// figures in the schedule; each family writes its own (the MLP's in pipeline_forms.cpp,
// GPT-2's in gpt2_forms.cpp), so the schedules' forms know nothing of a family.
#pragma once

#include <cstdint>
#include <vector>

#include "shardscope/config.hpp"

namespace shardscope {

// Where a piece sits: what the forms of one family need to know of it.
struct PiecePlace {
  int blocks = 0;         // layers (MLP) or transformer blocks
  bool first = false;     // virtual stage 0: its input is the batch
  bool last = false;      // virtual stage V-1: it computes the loss
  bool recv_act = false;  // its input comes from another stage (a received buffer)
  bool send_act = false;  // its output goes to another stage
  // --checkpoint: which of its blocks are wrapped. every:K counts the model's checkpointable
  // blocks (the MLP's layers, a transformer's blocks) from the model's first, as the
  // data-parallel run does, so a split never changes which blocks are wrapped: the piece's
  // block j is the model's checkpointable block first_block + j.
  CheckpointPolicy checkpoint;
  int first_block = 0;
  bool wraps(int j) const { return checkpoint.wraps(first_block + j); }
  // How many of its blocks [lo, hi) are wrapped: ⌈(f+hi)/K⌉ − ⌈(f+lo)/K⌉ (0 unless every:K).
  int wrapped_in(int lo, int hi) const {
    if (!checkpoint.any() || checkpoint.attention() || lo >= hi) return 0;
    const int K = checkpoint.every, f = first_block;
    return (f + hi + K - 1) / K - (f + lo + K - 1) / K;
  }
  // Its topmost wrapped block (-1: none): the largest multiple of K below f + blocks.
  int top_wrapped() const {
    if (wrapped_in(0, blocks) == 0) return -1;
    const int K = checkpoint.every, f = first_block;
    return (f + blocks - 1) / K * K - f;
  }
};

// One instant of the piece's B, relative to the moment B starts: activation and temp
// bytes beyond what is held then (this micro-batch's held bytes included), and whether
// the gradient of the piece's output (received, or left by the next chunk on one stage)
// is still alive then.
struct PieceMoment {
  std::int64_t activation = 0;
  std::int64_t temp = 0;
  bool dy_live = false;
  // A split B's instant after the piece's own output is freed (counted in activation or
  // temp above). zbv's V bottom keeps that output when the next chunk's W still reads it:
  // the forms then add it back.
  bool output_freed = false;
  // param_cast bytes beyond what is held then: under --precision bf16 the weights' bf16
  // casts (0 in fp32).
  std::int64_t cast = 0;
};

// One micro-batch of r rows through the piece; bytes.
struct PieceForms {
  std::int64_t boundary = 0;     // its output: what it sends forward, and its gradient back
  std::int64_t input = 0;        // its input when received, and the input gradient it sends back
  std::int64_t held_act = 0;     // activation held from its F to its B (a received input included)
  std::int64_t held_temp = 0;    // temp held from its F to its B (an unsaved output the next chunk of the same stage reads)
  std::int64_t forward_temp = 0; // temp at the end of its F beyond held_temp: its unsaved output, the logits, the loss scalar
  bool output_saved = false;     // its output is saved (by itself or the loss): never pending, never temp
  std::int64_t saved_bytes = 0;  // distinct bytes its F saves (the saved-tensor instrument)
  std::int64_t saves = 0;        // saves its F records
  std::vector<PieceMoment> backward;  // the instants of its B where bytes can be highest, in time order
  // --checkpoint: a wrapped block's re-run in its B records its saves again (the saved-tensor
  // instrument's total counts them): recompute_saves of them a micro-batch; and the most the
  // live saves (count, distinct bytes) rise above what the pair held when its B began,
  // at the end of the topmost wrapped block's re-run (0 when they never do).
  std::int64_t recompute_saves = 0;
  std::int64_t recompute_live = 0, recompute_live_bytes = 0;
  // --autocast-region step: the bytes' rise when another pair of the chunk is live, whose
  // saves of the same cached casts keep them (the blocks above, the head's) held.
  std::int64_t recompute_live_bytes_shared = 0;
  // --precision bf16 (the torch engine's autocast): the weights' bf16 casts its F makes,
  // held (saved by their GEMMs) from its F to its B, param_cast; and the instants inside
  // its F where bytes can be highest (a GEMM's widened operands beside its output), in
  // time order, relative to the moment F starts (its received input included in
  // activation). Both 0 / empty in fp32, where every instant of an F lies below its end.
  std::int64_t held_cast = 0;
  std::vector<PieceMoment> forward;
  // --autocast-region step (one region around the schedule's step): every cast its
  // parameters' GEMMs take, made once by the chunk's first F and held by autocast's cache
  // to the step's end (later F's and every B make and free none); held_cast of them are
  // saved by every micro-batch (one storage: the saved-tensor instrument counts it once).
  std::int64_t step_cast = 0;
  // A transformer's zero-bubble split (zb-h1): what the piece holds from its B to its W
  // beyond what it held before its F, per category (docs/formulas.md, "Transformers: what
  // B keeps for W"): the saves W reads (activation), the kept output gradients (temp), the
  // received dy its top block keeps (comm); and the saves still recorded (count, distinct
  // bytes).
  std::int64_t half_act = 0, half_temp = 0, half_comm = 0;
  std::int64_t half_saves = 0, half_saved_bytes = 0;
  // The instants of its split B (zb-h1) where bytes can be highest, in time order, as
  // `backward`'s: activation relative to B's start, temp this B holds (the received dy,
  // comm, alive throughout, not counted). Its W's instants never pass the moment before
  // it: each allocation of a W (a norm's scratch dx, a) follows frees of more.
  std::vector<PieceMoment> split_backward;
  // The instants of its W (zb-h1, zbv) above the moment it starts, relative to that moment:
  // activation and temp (negative: what the W freed before), dy_live false when the top
  // block's received dy (half_comm) is freed by then. Only Llama's replicated kv heads
  // have one: every kv head's k and v gradients (temp) made once the top layer's W has
  // freed its MLP's, norms' and o_proj's part. Empty otherwise: each allocation of a W
  // (a norm's scratch dx, a) follows frees of more.
  std::vector<PieceMoment> split_weight;
};

// The last piece's split B begins with the head (docs/formulas.md, "Transformers: what B
// keeps for W"): dlogits (lambda bytes; the log-probabilities and total_weight then freed),
// the final norm's gradient (a), its dx (a, the top block's dy) beside the norm's scratch
// (`norm_scratch` bytes). Pushes those instants onto `m`, sets `act` and `temp` to where
// the blocks' walk starts.
inline void push_head_split_backward(std::vector<PieceMoment>& m, std::int64_t lambda, std::int64_t a,
                                     std::int64_t norm_scratch, std::int64_t& act, std::int64_t& temp) {
  m.push_back({0, lambda, true});
  act = -lambda - 4;
  m.push_back({act, lambda + a, true});
  m.push_back({act, lambda + 2 * a + norm_scratch, true});
  temp = lambda + 2 * a;
}

}  // namespace shardscope
