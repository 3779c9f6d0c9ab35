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
  // F's instants above its end (--sp; every fp32 instant of an F lies below it otherwise):
  // the top block's (forward_attention, from S = its input's place; every lower block's
  // hold K less), its output temp when the final block does not save it; the last
  // piece's gathered norm output beside the logits (head_gather).
  const i64 in = place.first ? z.base : place.recv_act ? a : 0;
  if (z.forward_attention) {
    std::vector<WalkInstant> fwd;
    PeakWalk walk;
    walk.record(&fwd);
    z.forward_attention(walk, in + (n - 1) * z.K, 0, 0, "");
    const i64 unsaved = place.last ? 0 : a;
    for (const WalkInstant& w : fwd) p.forward.push_back({w.act - unsaved, w.temp - X + unsaved, false});
  }
  if (place.last && z.head_gather > 0) p.forward.push_back({p.held_act - lambda - 4, lambda + z.head_gather, false});
  // B. The last piece: the loss's dlogits, the head's d norm, the norm's dx (dlogits and
  // the norm's output freed); its top block then starts with the final block's saves
  // released and its own output freed, dy the final block's dx (temp). Any other piece's
  // top block frees its output (held as temp on one stage, already sent on more) and
  // reads the gradient of it: the walk's dy, alive until the family's block adds it in.
  std::vector<PieceMoment>& m = p.backward;
  i64 y = 0;
  if (place.last) {
    m.push_back({0, lambda, false});
    if (z.final_backward) {  // --sp's: sequence_parallel_final
      std::vector<WalkInstant> fin;
      PeakWalk walk;
      walk.record(&fin);
      z.final_backward(walk, -lambda - 4, 0, 0, "");
      for (const WalkInstant& w : fin) m.push_back({w.act, w.temp - X, false});
    } else {
      m.push_back({-lambda - 4, lambda + a, false});
      m.push_back({-lambda - 4 - a, 2 * a, false});
    }
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
