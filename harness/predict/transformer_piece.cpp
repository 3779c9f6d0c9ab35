// A transformer's pipeline piece from its family's blocks (transformer_piece.hpp).
#include "harness/predict/transformer_piece.hpp"

#include <vector>

namespace shardscope {

PieceForms transformer_piece(const StepBlocks& z, const PieceSaves& saves, const PiecePlace& place) {
  using i64 = std::int64_t;
  const i64 a = z.a, lambda = z.lambda, N = z.N, n = place.blocks;
  const i64 X = 16 * N;  // the ids and the target in the walk's temp: the step's base here
  PieceForms p;
  p.boundary = a;
  p.input = a;
  // The blocks' K counts each one's saves less its input, with its output: the chain's
  // input comes from the embeddings (base: x0, and GPT-2's arange), a received buffer, or
  // the previous chunk on this stage (its temp); the last output is held only when the
  // final block saves it.
  p.held_act = n * z.K - a + (place.first ? z.base : place.recv_act ? a : 0) +
               (place.last ? a + z.final_held + lambda + 4 : 0);
  p.saved_bytes = p.held_act + (place.first ? 8 * N : 0) + (place.last ? 8 * N : 0) +
                  (!place.first && !place.recv_act ? a : 0);
  p.saves = n * saves.block + (place.first ? saves.embeddings : 0) + (place.last ? saves.final_block + 3 : 0);
  p.held_temp = !place.last && !place.send_act ? a : 0;
  // Under tensor parallelism the loss's statistics (vocab_parallel_cross_entropy's max and
  // sum) join the logits and the loss scalar at the loss's highest instant.
  p.forward_temp = place.last ? lambda + 4 + z.loss_stats : a;
  // B. The last piece: the loss's dlogits, the head's d norm, the norm's dx (dlogits and
  // the norm's output freed); its top block then starts with the final block's saves
  // released and its own output freed, dy the final block's dx (temp). Any other piece's
  // top block frees its output (held as temp on one stage, already sent on more) and
  // reads the gradient of it: the walk's dy, alive until the family's block adds it in.
  std::vector<PieceMoment>& m = p.backward;
  i64 y = 0;
  if (place.last) {
    m.push_back({0, lambda, false});
    m.push_back({-lambda - 4, lambda + a, false});
    m.push_back({-lambda - 4 - a, 2 * a, false});
    y = -(lambda + 4 + z.final_held + a);
  }
  std::vector<WalkInstant> top;
  PeakWalk walk;
  walk.record(&top);
  z.backward(walk, y, 0, 0, "");
  const bool outer = !place.last;
  for (const WalkInstant& w : top) {
    const bool live = outer && w.dy_live;
    m.push_back({w.act, w.temp - X - (live ? a : 0) - (outer ? p.held_temp : 0), live});
  }
  return p;
}

}  // namespace shardscope
