// A transformer's pipeline piece from its family's blocks (transformer_piece.hpp).
#include "harness/predict/transformer_piece.hpp"

#include <algorithm>
#include <vector>

namespace shardscope {

PieceForms transformer_piece(const StepBlocks& z, const PieceSaves& saves, const PiecePlace& place) {
  using i64 = std::int64_t;
  const i64 a = z.a, lambda = z.lambda, N = z.N, n = place.blocks;
  const i64 X = 16 * N;  // the ids and the target in the walk's temp: the step's base here
  PieceForms p;
  p.boundary = a;
  p.input = a;
  // --checkpoint full|every:K: a wrapped block holds only its output (a, the next block's
  // saved input) from its forward to its backward, an unwrapped one K (c_j below).
  auto c = [&](i64 j) { return place.wraps(static_cast<int>(j)) ? a : z.K; };
  // Σ_{j<i} c_j: w of them wrapped.
  auto held_below = [&](i64 i) {
    const i64 w = place.wrapped_in(0, static_cast<int>(i));
    return w * a + (i - w) * z.K;
  };
  const i64 wrapped = place.wrapped_in(0, static_cast<int>(n)), top_wrapped = place.top_wrapped();
  const i64 held_blocks = held_below(n);
  // The blocks' K counts each one's saves less its input, with its output: the chain's
  // input comes from the embeddings (base: x0, and GPT-2's arange), a received buffer, or
  // the previous chunk on this stage (its temp); the last output is held only when the
  // final block saves it.
  const i64 in = place.first ? z.base : place.recv_act ? a : 0;
  p.held_act = held_blocks - a + in + (place.last ? a + z.final_held + lambda + 4 : 0);
  p.saved_bytes = p.held_act + (place.first ? 8 * N : 0) + (place.last ? 8 * N : 0) +
                  (!place.first && !place.recv_act ? a : 0);
  // A wrapped block records one save in its forward (its input: the checkpoint's), and its
  // saves again when it re-runs in backward.
  p.saves = (n - wrapped) * saves.block + wrapped + (place.first ? saves.embeddings : 0) +
            (place.last ? saves.final_block + 3 : 0);
  p.recompute_saves = wrapped * saves.block;
  // The loss's saves (log-probabilities, target, total_weight) and the final block's (its
  // input, the norm's statistics and output), released before the blocks' backward.
  const i64 last_released = place.last ? saves.final_block + 3 : 0;
  const i64 last_released_bytes = place.last ? lambda + 8 * N + 4 + a + z.final_held : 0;
  if (saves.attention_resaves > 0) {
    // --checkpoint attention: each block's attention records its saves again; the top
    // block's rise above the pair's once its MLP half (and the last piece's loss and final
    // block) have released theirs. The count never rises (a block releases more saves
    // before its attention than it records again).
    p.recompute_saves = n * saves.attention_resaves;
    p.recompute_live_bytes =
        std::max<i64>(0, saves.attention_resave_bytes - saves.attention_released_bytes - last_released_bytes);
  }
  if (top_wrapped >= 0) {
    // The topmost wrapped block's re-run ends with its saves recorded again (K bytes less
    // its input, which the checkpoint still saves) once the blocks above it (unwrapped)
    // and, on the last piece, the loss (log-probabilities, target, total_weight: Λ + 8N + 4)
    // and the final block (its input, the norm's statistics and output) have released theirs.
    const i64 above = n - 1 - top_wrapped;
    const i64 released = above * saves.block + last_released;
    const i64 released_bytes = above * z.K + last_released_bytes;
    p.recompute_live = std::max<i64>(0, saves.block - released);
    p.recompute_live_bytes = std::max<i64>(0, z.K - a - released_bytes);
  }
  p.held_temp = !place.last && !place.send_act ? a : 0;
  // Under tensor parallelism the loss's statistics (vocab_parallel_cross_entropy's max and
  // sum) join the logits and the loss scalar at the loss's highest instant.
  p.forward_temp = place.last ? lambda + 4 + z.loss_stats : a;
  // F's instants above its end (--sp; every fp32 instant of an F lies below it otherwise):
  // the top block's (forward_attention, from S = its input's place; every lower block's
  // hold K less), its output temp when the final block does not save it; the last
  // piece's gathered norm output beside the logits (head_gather).
  // A wrapped block's forward: its saves and output made (the highest of its instants), then
  // all but the output freed; the topmost one's (every lower one holds less) when its
  // output is the piece's unsaved last (temp) or the next block's input (activation).
  if (top_wrapped >= 0) {
    const i64 below = in + held_below(top_wrapped);  // H: the activations below it, its input among them
    const bool saved = top_wrapped + 1 < n || place.last;
    p.forward.push_back({below + z.K - a + (saved ? a : 0), saved ? 0 : a, false});
  }
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
  // Then the top block from H (y + a − c_top) and, when it is another, the topmost wrapped
  // block from H_j = H − Σ_{j≤i<top} c_i: a wrapped block first frees its forward's output
  // and re-runs (the family's recompute instants from H_j, its output temp beside dy), then
  // each gradient buffer from A4 = H_j + K − a. The top block's dy is the received gradient
  // (comm) on a piece but the last; a lower block's the dx of the one above (temp). Every
  // other block's instants hold less than the same instants of one of these two (H falls by
  // c_i ≥ a a block; a re-run's highest instant, its output beside dy, X + 2a over
  // H_j + K − a, lies below the first gradient buffer of any block above it, X + a + F
  // over at least H_j + a + K − a).
  const bool outer = !place.last;
  const i64 H_top = y + a - c(n - 1);
  auto block = [&](i64 j, i64 H) {
    std::vector<WalkInstant> walked;
    PeakWalk walk;
    walk.record(&walked);
    if (place.wraps(static_cast<int>(j))) z.recompute(walk, H, 0, 0, "");
    z.backward(walk, H + z.K - a, 0, 0, "");
    for (const WalkInstant& w : walked) {
      const bool live = outer && j == n - 1 && w.dy_live;
      m.push_back({w.act, w.temp - X - (live ? a : 0) - (outer ? p.held_temp : 0), live});
    }
  };
  block(n - 1, H_top);
  if (top_wrapped >= 0 && top_wrapped < n - 1) block(top_wrapped, H_top - (held_below(n - 1) - held_below(top_wrapped)));
  p.recompute_live_bytes_shared = p.recompute_live_bytes;
  return p;
}

}  // namespace shardscope
