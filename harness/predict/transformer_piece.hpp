// A transformer's pipeline piece (piece_forms.hpp; docs/formulas.md, "Transformers: the
// pipeline"): what one micro-batch costs the run of blocks one virtual stage holds,
// from what its family says its blocks hold in a step (transformer_step.hpp's
// StepBlocks, for that micro-batch's sequences) and the saves each records. Written once
// for every family: GPT-2's and Llama's blocks come from gpt2_blocks and llama_blocks.
#pragma once

#include "harness/predict/piece_forms.hpp"
#include "harness/predict/transformer_step.hpp"

namespace shardscope {

// The saves a family's forward records: the embeddings', one transformer block's, the
// final block's (the loss's three beside them).
struct PieceSaves {
  int embeddings = 0;
  int block = 0;
  int final_block = 0;
  // --checkpoint attention: what a block's attention records again in its backward (flash:
  // the re-run's output and log-sum-exp, 2 saves; math: the probabilities, 1), their bytes,
  // and the bytes of the block's saves released before it (its MLP half's, the norm's, and
  // the attention output's unless the attention itself saves it).
  int attention_resaves = 0;
  std::int64_t attention_resave_bytes = 0, attention_released_bytes = 0;
};

// place.blocks transformer blocks, with the embeddings when place.first and the final
// block and the loss when place.last:
//   held from F to B   n·K − a (the piece's output is sent, or kept as temp on one stage)
//                      + base (first) or a (its received input)
//                      + a + final_held + Λ + 4 (last: ln_f's input, the norm's bytes, the
//                      log-probabilities and total_weight)
//   saved bytes        the held ones, the ids (8N, first) and target (8N, last), and an
//                      input the previous chunk on the same stage holds (a)
//   end of F           its output a, or on the last piece the logits Λ and the loss scalar 4
//                      (and under tensor parallelism the loss's statistics, 8N)
//   F's instants       under --sp: the top block's whole partial product beside its saves
//                      and output, and the last piece's gathered norm output beside Λ
//   B's instants       the last piece's dlogits, d norm and dx; then the top block's (the
//                      family's walk, its dy the received gradient unless last).
PieceForms transformer_piece(const StepBlocks& blocks, const PieceSaves& saves, const PiecePlace& place);

}  // namespace shardscope
