// Closed forms for one pipeline stage (docs/formulas.md writes them out).
//
// Symbols. S stages, stage s; v chunks; V = S·v virtual stages, k = c·S + s for chunk c;
// n_k layers in virtual stage k, its first layer f_k; M micro-batches of r_m rows
// (q = B / M, e = B % M, r_m = q + 1 for m < e, else q; R(h) = Σ_{m<h} r_m = h·q +
// min(h, e)); a_m = 4·width·r_m bytes, one (r_m, width) fp32 activation.
//
// The executor (harness/pipeline/pipeline_stage.cpp) is not read here: these forms
// follow the schedules' definitions (harness/pipeline/gpipe.cpp ...) and the Mlp's
// allocation order, and the tests hold them equal to what the executor measures.
#include "harness/predict/pipeline_forms.hpp"

#include <algorithm>
#include <set>
#include <utility>

#include "harness/predict/autocast_piece.hpp"
#include "harness/predict/gpt2_forms.hpp"
#include "harness/predict/interleaved_timing.hpp"
#include "harness/predict/llama_forms.hpp"
#include "harness/predict/piece_forms.hpp"
#include "harness/predict/transformer_forms.hpp"
#include "harness/predict/zbv_timing.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

// Rows of torch.tensor_split(B, M): sizes differ by at most one, larger first.
struct Rows {
  i64 M = 1, q = 0, e = 0, row_bytes = 0;  // row_bytes = 4·width
  i64 rows(i64 m) const { return q + (m < e ? 1 : 0); }
  // R(h) = Σ_{m<h} r_m, h clamped to [0, M]
  i64 before(i64 h) const {
    h = std::clamp<i64>(h, 0, M);
    return h * q + std::min(h, e);
  }
  i64 a(i64 m) const { return m < 0 || m >= M ? 0 : row_bytes * rows(m); }        // a_m
  i64 sum(i64 lo, i64 hi) const { return lo >= hi ? 0 : row_bytes * (before(hi) - before(lo)); }  // Σ_{lo<=m<hi} a_m
};

// One virtual stage as this stage runs it.
struct Piece {
  PieceForms big, small;  // one micro-batch of q+1 rows, of q rows (piece_forms.hpp)
  int k = 0;           // virtual stage
  i64 n = 0;           // layers
  bool first = false;  // k == 0: its input is the batch, which needs no gradient
  bool last = false;   // k == V-1: it computes the loss
  bool ls = false;     // its last output is saved (relu, or the model's last layer under mse)
  bool recv_act = false, send_act = false;    // activation in from k-1 / out to k+1 on another stage
  bool recv_grad = false, send_grad = false;  // gradient in from k+1 / out to k-1 on another stage
  bool mse = false;    // the MLP's loss is mse
  // Saves of one F (docs/design.md §2): every layer's Linear input and, when the input
  // needs a gradient, its weight (0 bytes); relu: every output; the loss under mse: its
  // input and target (their distinct bytes: mlp_piece's saved_bytes).
  i64 saves = 0;
};

struct Ctx {
  const PipelineShape& sh;
  int s, S, M, v, V;
  bool relu, mse;
  Rows rows;
  std::vector<Piece> pieces;  // by chunk
  bool transformer = false;
  int tp = 1;  // --mesh tp=T: the blocks are a tensor-parallel rank's
  bool sp = false;  // --sp: a transformer's stages sequence-parallel (their boundaries the rank's seq/T tokens)
  bool step = false;  // --autocast-region step: each piece's casts made by its chunk's first F, held to the step's end
  i64 batch_bytes = 0, target_bytes = 0;  // the whole batch's input and the loss's target (0: none)
};

// A figure of one piece for micro-batch m (0 outside [0, M)), and its sum over [lo, hi).
i64 at(const Rows& r, const Piece& p, i64 PieceForms::*f, i64 m) {
  if (m < 0 || m >= r.M) return 0;
  return (m < r.e ? p.big : p.small).*f;
}
i64 sum(const Rows& r, const Piece& p, i64 PieceForms::*f, i64 lo, i64 hi) {
  lo = std::clamp<i64>(lo, 0, r.M);
  hi = std::clamp<i64>(hi, 0, r.M);
  if (lo >= hi) return 0;
  const i64 bigs = std::max<i64>(0, std::min(hi, r.e) - lo);
  return bigs * (p.big.*f) + (hi - lo - bigs) * (p.small.*f);
}
const std::vector<PieceMoment>& moments(const Rows& r, const Piece& p, i64 m) {
  return (m < r.e ? p.big : p.small).backward;
}
const std::vector<PieceMoment>& forward_moments(const Rows& r, const Piece& p, i64 m) {
  return (m < r.e ? p.big : p.small).forward;
}

// The MLP's piece (piece_forms.hpp) for r rows, a = 4·width·r. Layer j of the piece
// makes o_j: a, or under --mesh tp=T > 1 a/T for a column Linear (even j: a piece holds
// column-row pairs, check_pipeline_tensor_parallel) and a for a row Linear; its input and
// its last output are whole (a). U = o_0 + ... + o_{n-2}, the outputs below the top.
// Held from F to B [received]·a + U + [ls]·a (its input when received, the outputs its
// layers saved), the end of F adds its unsaved last output and the loss scalar (4, last
// piece), and B's highest instant is its first: dy (received, comm; or the loss
// gradient, temp) with the top layer's dx, o_{n-2} (a when n = 1; none when n = 1 on
// virtual stage 0). (Under tp the next layer's instant, its dy o_{n-2} and dx a, the top
// output freed when held, totals no more and comes later.)
PieceForms mlp_piece(const Piece& p, const PiecePlace& place, bool relu, i64 row_bytes, i64 r, int tp) {
  const i64 a = row_bytes * r;
  auto o = [&](i64 j) { return tp > 1 && j % 2 == 0 ? a / tp : a; };
  i64 below_top = 0;  // U
  for (i64 j = 0; j + 1 < p.n; ++j) below_top += o(j);
  PieceForms f;
  f.boundary = f.input = a;
  f.held_act = (p.recv_act ? a : 0) + below_top + (p.ls ? a : 0);
  f.held_temp = !p.ls && !p.last && !p.send_act ? a : 0;
  f.forward_temp = (p.ls ? 0 : a) + (p.last ? 4 : 0);
  f.output_saved = p.ls;
  // The Linears' inputs (its input and U), relu's or mse's last output, mse's target.
  f.saved_bytes = a + below_top + (p.ls ? a : 0) + (p.last && p.mse ? a : 0);
  // --checkpoint: a wrapped layer's forward records one save (its input, the checkpoint's:
  // the bytes its Linear would save), its re-run in B the layer's own again: its input, its
  // weight's reference when the input needs a gradient (a layer past virtual stage 0's
  // first), relu's output. Its output stays the next layer's saved input, so what a pair
  // holds differs only where the top layer is wrapped: relu's save of the last output is
  // dropped (p.ls).
  // Layer j's own saves: 2 + [relu], less the weight's on virtual stage 0's first layer.
  auto layer_saves = [&](i64 j) { return 2 + (relu ? 1 : 0) - (j == 0 && p.first ? 1 : 0); };
  // Saves of layers [0, j) in forward: each wrapped one 1 (closed form: W of them wrapped).
  auto forward_saves = [&](i64 j) {
    const i64 W = place.wrapped_in(0, static_cast<int>(j));
    const bool plain0 = j > 0 && p.first && !place.wraps(0);  // an unwrapped layer 0 saves no weight
    return W + (j - W) * (2 + (relu ? 1 : 0)) - (plain0 ? 1 : 0);
  };
  f.saves = forward_saves(p.n) + (p.last && p.mse ? 2 : 0);
  const i64 W = place.wrapped_in(0, static_cast<int>(p.n));
  f.recompute_saves = W * (2 + (relu ? 1 : 0)) - (p.first && place.wraps(0) ? 1 : 0);
  if (const i64 top = place.top_wrapped(); top >= 0) {
    // The topmost wrapped layer's re-run ends holding the saves of the layers below it, its
    // checkpoint's and its own again, everything above it (and the loss's) released: its
    // inputs' bytes, (j + 1)·a, and a new relu output.
    const i64 live = forward_saves(top) + 1 + layer_saves(top);
    f.recompute_live = std::max<i64>(0, live - f.saves);
    f.recompute_live_bytes = std::max<i64>(0, (top + 1 + (relu ? 1 : 0)) * a - f.saved_bytes);
    f.recompute_live_bytes_shared = f.recompute_live_bytes;
  }
  const i64 dx = p.n > 1 ? o(p.n - 2) : p.first ? 0 : a;
  const i64 dy_temp = p.last ? a : 0;  // the loss gradient; a received dy is comm
  if (place.wraps(static_cast<int>(p.n - 1))) {
    // A wrapped top layer frees its forward's output (held: mse's save; or the next chunk's
    // temp input here), re-runs (its output activation with relu, else temp freed at once),
    // then makes dx.
    // The loss gradient comes first, beside the output still held.
    const i64 act = (relu ? a : 0) - (p.ls ? a : 0), temp = dy_temp - f.held_temp;
    f.backward = {{0, dy_temp, true}, {act, temp + (relu ? 0 : a), true}, {act, temp + dx, true}};
  } else {
    f.backward = {{0, dy_temp + dx, true}};
  }
  // zb-h1, B done and W not: its input (received) and the n-1 outputs W still reads,
  // and the n dz (U + a), the first the received dy (comm) or the loss gradient; the n
  // Linear inputs stay saved.
  f.half_act = (p.recv_act ? a : 0) + below_top;
  f.half_comm = p.recv_grad ? a : 0;
  f.half_temp = below_top + a - f.half_comm;
  f.half_saves = p.n;
  f.half_saved_bytes = a + below_top;
  // Its split B: dy (the loss gradient, temp, on the last piece), then, its last output
  // freed (saved, or kept in the tape for the next chunk here), the input gradients kept
  // to its end: layer j's o_{j-1} for j >= 1 (U) and, when k > 0, layer 0's a.
  f.split_backward = {{0, dy_temp, true},
                      {p.ls ? -a : 0, dy_temp - f.held_temp + below_top + (p.first ? 0 : a), true, true}};
  return f;
}

Ctx make_ctx(const PipelineShape& sh, int s) {
  Ctx c{sh, s, sh.stages, sh.microbatches, sh.chunks, sh.stages * sh.chunks,
        sh.model.activation == Activation::relu, sh.model.loss == Loss::mse, {}, {}};
  SHARDSCOPE_REQUIRE(static_cast<int>(sh.split.size()) == c.V && s >= 0 && s < c.S && c.M >= 1 &&
                         c.M <= sh.model.batch,
                     "pipeline forms: an unchecked shape");
  c.rows.M = c.M;
  c.rows.q = sh.model.batch / c.M;
  c.rows.e = sh.model.batch % c.M;
  c.rows.row_bytes = 4 * static_cast<i64>(sh.model.width);
  c.transformer = sh.model.is_transformer();
  c.tp = sh.tp;
  c.sp = c.tp > 1 && sh.model.is_transformer() && sh.model.sequence_parallel;
  c.step = sh.model.autocast && sh.model.autocast_step;
  const TransformerShape& ts = sh.model.transformer;
  if (c.transformer) {
    SHARDSCOPE_REQUIRE(sh.model.name == "gpt2" || sh.model.name == "llama",
                       "pipeline forms: no piece forms for --model " + sh.model.name);
    c.relu = c.mse = false;
    c.batch_bytes = c.target_bytes = 8 * static_cast<i64>(sh.model.batch) * ts.seq;  // int64 token ids
  } else {
    c.batch_bytes = c.rows.row_bytes * sh.model.batch;
    c.target_bytes = c.mse ? c.batch_bytes : 0;
    // Under autocast a micro-batch's boundary tensor is bf16 (the batch and target stay fp32).
    if (sh.model.autocast) c.rows.row_bytes = 2 * static_cast<i64>(sh.model.width);
  }
  auto stage_of = [&](int k) { return placed_stage(sh.schedule, c.S, k); };
  c.pieces.reserve(static_cast<std::size_t>(c.v));
  const CheckpointPolicy& ck = sh.model.checkpoint;
  std::vector<int> first_blocks(1, 0);  // each virtual stage's first layer (transformer block)
  for (int n : sh.split) first_blocks.push_back(first_blocks.back() + n);
  for (int ch = 0; ch < c.v; ++ch) {
    Piece p;
    p.k = placed_vstage(sh.schedule, c.S, s, ch);
    p.n = sh.split[p.k];
    const int first_block = first_blocks[static_cast<std::size_t>(p.k)];
    p.first = p.k == 0;
    p.last = p.k == c.V - 1;
    // A wrapped top layer's relu save is dropped (--checkpoint).
    p.ls = (c.relu && !ck.wraps(first_block + static_cast<int>(p.n) - 1)) || (p.last && c.mse);
    p.recv_act = !p.first && stage_of(p.k - 1) != s;
    p.send_act = !p.last && stage_of(p.k + 1) != s;
    p.recv_grad = p.send_act;
    p.send_grad = p.recv_act;
    p.mse = c.mse;
    const bool loss_saves = p.last && c.mse;
    p.saves = p.n + (p.n - (p.first ? 1 : 0)) + (c.relu ? p.n : 0) + (loss_saves ? 2 : 0);
    for (PieceForms* f : {&p.big, &p.small}) {
      const i64 r = c.rows.q + (f == &p.big ? 1 : 0);
      const PiecePlace place{static_cast<int>(p.n), p.first, p.last, p.recv_act, p.send_act, ck, first_block};
      if (c.transformer && sh.model.autocast)  // --precision bf16: autocast_piece.hpp
        *f = sh.model.name == "gpt2" ? gpt2_autocast_piece(ts, static_cast<int>(r), place, c.tp)
                                     : llama_autocast_piece(ts, static_cast<int>(r), place, c.tp);
      else if (c.transformer)
        *f = sh.model.name == "gpt2" ? gpt2_piece(ts, static_cast<int>(r), place, c.tp, c.sp)
                                     : llama_piece(ts, static_cast<int>(r), place, c.tp, c.sp);
      else if (sh.model.autocast)  // --precision bf16: autocast_piece.hpp
        *f = mlp_autocast_piece(place, sh.model.width, static_cast<int>(r), c.relu, c.mse);
      else
        *f = mlp_piece(p, place, c.relu, c.rows.row_bytes, r, c.tp);
    }
    p.saves = p.big.saves;
    c.pieces.push_back(std::move(p));
  }
  return c;
}

// ---- resting and p2p ------------------------------------------------------------------

// The stages of the first virtual stage (the batch, the embeddings) and of the last
// (the loss, the head): stage 0 and S-1, or both stage 0 in zbv's V.
int first_stage(const Ctx& c) { return placed_stage(c.sh.schedule, c.S, 0); }
int last_stage(const Ctx& c) { return placed_stage(c.sh.schedule, c.S, c.V - 1); }

// A transformer's tied embedding (the head reads wte; gpt2 always ties it) held on two
// stages: the first's (the embeddings) and the last's (the head), when they differ.
bool tied_split(const Ctx& c) {
  const TransformerShape& ts = c.sh.model.transformer;
  return c.transformer && (c.sh.model.name == "gpt2" || ts.tied_embeddings) && first_stage(c) != last_stage(c);
}
// Its elements on a rank: V·h, or under tensor parallelism the rank's V/T rows.
i64 tied_elems(const Ctx& c) {
  return static_cast<i64>(c.sh.model.transformer.vocab) / c.tp * c.sh.model.transformer.hidden;
}
bool holds_tied(const Ctx& c) { return tied_split(c) && (c.s == first_stage(c) || c.s == last_stage(c)); }

// A transformer stage: its pieces' blocks (the embeddings with virtual stage 0, the final
// block with V-1), 16 B a parameter and 4 B a tensor (AdamW's step); the last stage adds
// its copy of the tied embedding (16·V·h + 4). Under tensor parallelism each block's
// parameters are a rank's (transformer_block_sizes at tp), its tensors as many.
CategoryBytes transformer_resting(const Ctx& c) {
  const TransformerShape& ts = c.sh.model.transformer;
  const int L = ts.layers;
  std::vector<i64> tensors(static_cast<std::size_t>(L) + 2, 0);
  for (const TransformerTensor& t : transformer_tensors(ts)) ++tensors[static_cast<std::size_t>(t.block)];
  const std::vector<i64> sizes = transformer_block_sizes(ts, c.tp);
  i64 P = 0, T = 0;
  for (const Piece& p : c.pieces) {
    P += p.n * sizes[1];
    T += p.n * tensors[1];
    if (p.first) P += sizes.front(), T += tensors[0];
    if (p.last) P += sizes.back(), T += tensors[static_cast<std::size_t>(L) + 1];
  }
  if (tied_split(c) && c.s == last_stage(c)) P += tied_elems(c), T += 1;
  CategoryBytes b;
  b[Category::param] = 4 * P;
  b[Category::grad] = 4 * P;
  b[Category::optim] = 8 * P + 4 * T;
  return b;
}

CategoryBytes resting(const Ctx& c) {
  if (c.transformer) return transformer_resting(c);
  i64 layers = 0;
  for (const Piece& p : c.pieces) layers += p.n;
  // A layer's w² + w; under tp a column-row pair's 2w²/T + w/T + w (the column Linear's
  // rows and bias slice, the row Linear's columns and whole bias).
  const i64 w = c.sh.model.width, T = c.tp;
  const i64 elems = T == 1 ? layers * c.sh.model.layer_elems() : layers / 2 * (2 * w * w / T + w / T + w);
  CategoryBytes b;
  b[Category::param] = 4 * elems;
  b[Category::grad] = 4 * elems;
  // exp_avg + exp_avg_sq, and a 4-byte step for each of a layer's 2 tensors
  b[Category::optim] = 8 * elems + 8 * layers;
  return b;
}

// Each micro-batch's activation goes to the next virtual stage and its input gradient
// to the previous one, when those live on another stage: over the M micro-batches,
// B·width·4 bytes per neighbour and direction.
i64 p2p_sent(const Ctx& c) {
  i64 bytes = 0;
  for (const Piece& p : c.pieces)
    bytes += (p.send_act ? sum(c.rows, p, &PieceForms::boundary, 0, c.M) : 0) +
             (p.send_grad ? sum(c.rows, p, &PieceForms::input, 0, c.M) : 0);
  return bytes;
}

// Under --mesh tp=T > 1, the all-reduces of the stage's blocks over its tensor-parallel
// group, each in place, per micro-batch of r rows (a = its (rows, hidden) activation,
// N its tokens) and summed over the M micro-batches (Σ r = B):
//   a transformer piece: the embedding's output (a, first), each block's two
//     row-parallel outputs and two column-parallel input gradients (4a; 3a under
//     --precision bf16, whose row-parallel outputs are bf16), the loss's row max and sum
//     of exp (8N) and its value (4) and the head's input gradient (a, last);
//   an MLP piece: each row Linear's output and each column Linear's input gradient but
//     virtual stage 0's first (whose input is the batch): (n - [first])·a.
// Under --sp (docs/formulas.md, "Sequence parallelism"; a the whole (N, h)) all-gathers,
// reduce-scatters and all-reduces:
//   each block all-gathers 2a in forward and 4a in backward, reduce-scatters 2a in each,
//     and all-reduces its two norms' parts of their gradients (2g a micro-batch, g:
//     LayerNorm's 8h bytes, RMSNorm's 4h): 10a + 2g·M over the micro-batches;
//   the embeddings (first) reduce-scatter (Llama) or all-reduce (GPT-2) their output and
//     gather its gradient: 2a;
//   the final block (last) gathers its norm's output twice and reduce-scatters the head's
//     input gradient (3a), all-reduces its norm's part (g a micro-batch), and the loss as
//     without --sp (8N, 4 a micro-batch).
// Replicated kv heads (K < T) add each layer's copies' all-reduce a micro-batch.
i64 tp_all_reduce(const Ctx& c) {
  if (c.tp == 1) return 0;
  const i64 B = c.sh.model.batch;
  i64 bytes = 0;
  for (const Piece& p : c.pieces) {
    if (!c.transformer) {
      bytes += (p.n - (p.first ? 1 : 0)) * c.rows.row_bytes * B;
      continue;
    }
    const TransformerShape& ts = c.sh.model.transformer;
    const i64 N = B * ts.seq, a = 4 * N * ts.hidden;
    const i64 kv = p.n * c.M * kv_replica_all_reduce_bytes(ts, c.tp);
    if (c.sp) {
      const i64 g = (c.sh.model.name == "gpt2" ? 8 : 4) * static_cast<i64>(ts.hidden);
      bytes += p.n * (10 * a + 2 * g * c.M) + (p.first ? 2 * a : 0) + (p.last ? 3 * a + g * c.M + 8 * N + 4 * c.M : 0) +
               kv;
      continue;
    }
    const i64 block = c.sh.model.autocast ? 3 * a : 4 * a;  // bf16: the row-parallel outputs' a/2 each
    bytes += p.n * block + (p.first ? a : 0) + (p.last ? 8 * N + 4 * c.M + a : 0) + kv;
  }
  return bytes;
}

// ---- saved tensors --------------------------------------------------------------------
//
// Saves only grow during an F and only shrink during a B or W, so both peaks are at the
// end of some F: the pairs (micro-batch, chunk) whose F has run and whose B has not
// hold all their saves; with a split backward (zb-h1) a pair between B and W still
// holds the saves W reads (the piece's half_saves and half_saved_bytes: the MLP's n
// Linear inputs, n·a_m bytes; a transformer's per piece_forms.hpp).

// --autocast-region step: the saved casts of `live` micro-batches of a piece are one
// storage (the cache's), counted once: what the sum of their saved bytes counts more.
i64 step_shared_casts(const Ctx& c, const Piece& p, i64 live) {
  return c.step && live > 1 ? (live - 1) * p.big.held_cast : 0;
}

// The saves' rise at a re-run (--checkpoint) when `live` pairs of its chunk are in flight:
// under --autocast-region step another pair's saves keep the cached casts its B releases.
using Figure = i64 PieceForms::*;
Figure rise(const Ctx& c, i64 live) {
  return c.step && live > 1 ? &PieceForms::recompute_live_bytes_shared : &PieceForms::recompute_live_bytes;
}

SavedForms saved_one_chunk(const Ctx& c, ScheduleKind kind) {
  const Piece& p = c.pieces[0];
  const i64 M = c.M, s = c.s;
  SavedForms f;
  f.total_tensors = M * (p.saves + p.big.recompute_saves);
  // F's before the first B: gpipe all M; 1f1b and zb-h1 the warm-up min(S-s-1, M) and one more.
  const i64 w = kind == ScheduleKind::gpipe ? M : std::min<i64>(c.S - s - 1, M);
  const i64 h = std::min(w + 1, M);
  f.before_first_backward = h * p.saves;
  if (kind != ScheduleKind::zb_h1 || w == M) {
    // A window of h consecutive micro-batches is live after each F; the first, 0..h-1,
    // holds the largest rows. --checkpoint: B(t) runs holding the window F(w+t) left and
    // its re-run adds recompute_live; the first B, B(0), holds the largest.
    f.peak_live_tensors = h * p.saves + p.big.recompute_live;
    f.peak_live_bytes = sum(c.rows, p, &PieceForms::saved_bytes, 0, h) - step_shared_casts(c, p, h) +
                        at(c.rows, p, rise(c, h), 0);
    return f;
  }
  // zb-h1: at the end of F(w+b), b = 0..M-1-w, pairs b..w+b are whole and pairs
  // max(0, b-s)..b-1 wait for their W (W(j) follows B(j+s)). The count grows with b up
  // to b = s; past it both windows slide towards smaller rows, so b <= min(s, M-1-w).
  const i64 top = std::min<i64>(s, M - 1 - w);
  f.peak_live_tensors = (w + 1) * p.saves + top * p.big.half_saves;
  for (i64 b = 0; b <= top; ++b)
    f.peak_live_bytes = std::max(f.peak_live_bytes, sum(c.rows, p, &PieceForms::saved_bytes, b, w + b + 1) +
                                                        sum(c.rows, p, &PieceForms::half_saved_bytes, 0, b));
  return f;
}

// Interleaved 1F1B: the stage's j-th forward is chunk (j mod S·v) / S of micro-batch
// (j / (S·v))·S + j mod S, its j-th backward the same with the chunk reversed; W_s =
// min(2(S-s-1) + (v-1)·S, v·M) forwards run before the first backward, then F and B
// alternate. So after forward j and the j - W_s backwards before it, chunk c holds
// micro-batches [b_c, a_c): a_c(j) = S·⌊(j+1)/(S·v)⌋ + clamp((j+1) mod S·v - c·S, 0, S),
// b_c the same of the backward count with v-1-c for c. One round (S·v forwards) later
// every window has moved S micro-batches on: the same count, rows no larger; before
// W_s the windows only grow. So the peaks are in j = W_s .. W_s + S·v - 1.
// On one stage (S = 1) with relu, chunk c's input is chunk c-1's saved output: one
// tensor, counted once while both hold it.
struct Windows {
  const Ctx& c;
  std::vector<i64> a, b;  // per chunk: forwards done / backwards done (micro-batches)
  i64 count = 0, bytes = 0;

  explicit Windows(const Ctx& ctx) : c(ctx), a(ctx.v, 0), b(ctx.v, 0) {}
  bool shared() const { return c.S == 1 && c.relu; }
  // Bytes of chunk ch's boundary tensors held twice (its input, chunk ch-1's output).
  i64 overlap(int ch) const {
    if (!shared() || ch < 1 || ch >= c.v || !c.pieces[ch - 1].ls) return 0;
    return c.rows.sum(std::max(b[ch], b[ch - 1]), std::min(a[ch], a[ch - 1]));
  }
  // --autocast-region step: chunk ch's saved casts, one storage however many hold them.
  i64 shared_casts(int ch) const { return step_shared_casts(c, c.pieces[ch], a[ch] - b[ch]); }
  void move(std::vector<i64>& end, int ch, i64 to, int sign) {
    const Piece& p = c.pieces[ch];
    bytes += overlap(ch) + overlap(ch + 1) + shared_casts(ch);
    count += sign * (to - end[ch]) * p.saves;
    bytes += sign * sum(c.rows, p, &PieceForms::saved_bytes, end[ch], to);
    end[ch] = to;
    bytes -= overlap(ch) + overlap(ch + 1) + shared_casts(ch);
  }
};

i64 round_count(i64 done, int ch, int S, int v) {  // how many of chunk ch's among `done`
  const i64 round = static_cast<i64>(S) * v;
  return S * (done / round) + std::clamp<i64>(done % round - static_cast<i64>(ch) * S, 0, S);
}

SavedForms saved_interleaved(const Ctx& c) {
  const i64 S = c.S, v = c.v, M = c.M, total = v * M;
  const i64 warm = std::min<i64>(2 * (S - c.s - 1) + (v - 1) * S, total);
  SavedForms f;
  for (const Piece& p : c.pieces) f.total_tensors += M * (p.saves + p.big.recompute_saves);
  Windows w(c);
  // The windows after forward j0 (j0+1 forwards, max(0, j0-warm) backwards), then one
  // forward (and past the warm-up one backward) at a time: O(v + S·v).
  const i64 round = S * v, j0 = std::min(warm, total - 1);
  for (int ch = 0; ch < c.v; ++ch) {
    w.move(w.a, ch, round_count(j0 + 1, ch, c.S, c.v), +1);
    w.move(w.b, ch, round_count(std::max<i64>(0, j0 - warm), c.v - 1 - ch, c.S, c.v), -1);
  }
  f.before_first_backward = w.count;
  f.peak_live_tensors = w.count;
  f.peak_live_bytes = w.bytes;
  // --checkpoint: backward i runs holding the windows before it, its pair's re-run adding
  // recompute_live (chunk bc's next micro-batch, w.b[bc]).
  auto backward = [&](Windows& win, i64 i) {
    const int bc = static_cast<int>(v - 1 - (i % round) / S);
    const Piece& p = c.pieces[static_cast<std::size_t>(bc)];
    f.peak_live_tensors = std::max(f.peak_live_tensors, win.count + p.big.recompute_live);
    f.peak_live_bytes =
        std::max(f.peak_live_bytes, win.bytes + at(c.rows, p, rise(c, win.a[bc] - win.b[bc]), win.b[bc]));
    win.move(win.b, bc, win.b[bc] + 1, -1);
  };
  // One round of forwards past the warm-up, and (--checkpoint) the round of backwards
  // among them: every chunk's B once with the windows at their widest.
  const i64 last_j = std::min(total - 1, warm + round);
  for (i64 j = j0 + 1; j <= last_j; ++j) {
    if (j > warm) backward(w, j - warm - 1);  // backward j - warm - 1 ran before forward j
    const int fc = static_cast<int>((j % round) / S);
    w.move(w.a, fc, w.a[fc] + 1, +1);
    f.peak_live_tensors = std::max(f.peak_live_tensors, w.count);
    f.peak_live_bytes = std::max(f.peak_live_bytes, w.bytes);
  }
  // The cool-down's backwards, after the last forward: only a re-run raises the saves there,
  // and a later pair's can pass an earlier one's (another chunk's), so each is visited:
  // O(S·v) of them, from the windows after the last forward.
  bool recomputes = false;
  for (const Piece& p : c.pieces) recomputes = recomputes || p.big.recompute_saves > 0;
  if (recomputes) {
    const i64 done = std::max<i64>(0, total - 1 - warm);
    Windows cool(c);
    for (int ch = 0; ch < c.v; ++ch) {
      cool.move(cool.a, ch, round_count(total, ch, c.S, c.v), +1);
      cool.move(cool.b, ch, round_count(done, c.v - 1 - ch, c.S, c.v), -1);
    }
    for (i64 i = done; i < total; ++i) backward(cool, i);
  }
  return f;
}

// ---- the peak -------------------------------------------------------------------------
//
// The tracker keeps the first instant of the step's maximum. Instants where bytes can
// be highest, in time order: a p2p group's receives (before the sends it completes are
// freed), and inside an action the last of its allocations before it frees. Each is a
// formula of the micro-batch index; between the indices where a window's end or a
// named micro-batch crosses e (rows drop from q+1 to q) it is linear, so its maximum
// over a phase is at a phase end or beside such a crossing: those indices are visited.

// Bytes above the step's base at one instant (cast: param_cast, the weights' bf16 casts
// under --precision bf16).
struct Moment {
  i64 activation = 0, temp = 0, comm = 0, cast = 0;
};

class Peak {
 public:
  explicit Peak(const CategoryBytes& base) : base_(base), best_(base) {}
  void visit(const Moment& m) {
    CategoryBytes b = base_;
    b[Category::activation] += m.activation;
    b[Category::temp] += m.temp;
    b[Category::comm] += m.comm;
    b[Category::param_cast] += m.cast;
    if (b.total() > best_.total()) best_ = b;
  }
  const CategoryBytes& best() const { return best_; }

 private:
  CategoryBytes base_, best_;
};

// Indices j in [lo, hi] where some r_{j+o} or R(j+o) changes slope, for each offset o,
// with the phase's ends, the indices `at` where its formula changes, and their
// neighbours.
std::vector<i64> breakpoints(i64 lo, i64 hi, i64 e, std::initializer_list<i64> offsets,
                             std::initializer_list<i64> at = {}) {
  std::set<i64> out;
  if (lo > hi) return {};
  auto add = [&](i64 j) {
    for (i64 d = -1; d <= 1; ++d)
      if (j + d >= lo && j + d <= hi) out.insert(j + d);
  };
  add(lo);
  add(hi);
  for (i64 j : at) add(j);
  for (i64 o : offsets) add(e - o);
  return {out.begin(), out.end()};
}

// GPipe and 1F1B on one chunk. Stage s runs w forwards (gpipe: all M; 1f1b: min(S-s-1,
// M)), then F(w+t), B(t) for t = 0..M-w-1, then the remaining B's. Each action's
// output is sent in the group before the stage's next action (the consumer runs it in
// the same unit-time round), so one pending send at most.
//   held by a pair between its F and its B: a_m·h, h = [received] + (n-1) + [ls]
//     (its received input, the outputs its layers saved), activation;
//   pending after F(m): a_m if the last output goes out unsaved (no relu), temp;
//   pending after B(m): a_m (its input gradient) unless k = 0, temp.
// Instants:
//   group before F(m): held + pending + a_m received (activation);
//   F(m): held + a_m·([received] + n) (its outputs; the unsaved last one temp) + 4 (the
//     loss scalar, last stage);
//   group before B(m): held (with m) + pending + a_m received gradient (comm);
//   B(m): held (with m) + dy (received, comm; or the loss gradient, temp) + the first dx
//     (temp, unless n = 1 on the first stage).
CategoryBytes peak_one_f_one_b(const Ctx& c, i64 w, const CategoryBytes& base) {
  const Piece& p = c.pieces[0];
  const Rows& r = c.rows;
  const i64 M = c.M;
  auto fig = [&](i64 PieceForms::*f, i64 m) { return at(r, p, f, m); };
  auto pending_f = [&](i64 m) { return p.send_act && !p.big.output_saved ? fig(&PieceForms::boundary, m) : 0; };
  auto pending_b = [&](i64 m) { return p.send_grad ? fig(&PieceForms::input, m) : 0; };
  Peak peak(base);
  // --autocast-region step: F(0) makes the piece's casts (its instants as per micro-batch),
  // held from then to the step's end: every later instant holds them all, none more.
  const i64 step_cast = p.big.step_cast;
  auto held_casts = [&](i64 lo, i64 hi) { return c.step ? (hi > 0 ? step_cast : 0) : sum(r, p, &PieceForms::held_cast, lo, hi); };
  auto forward = [&](i64 m, i64 lo, i64 hi, i64 pending) {
    const i64 held = sum(r, p, &PieceForms::held_act, lo, hi), casts = held_casts(lo, hi);
    peak.visit({held + (p.recv_act ? fig(&PieceForms::input, m) : 0), pending, 0, casts});
    for (const PieceMoment& d : forward_moments(r, p, m))
      peak.visit({held + d.activation, d.temp, 0, c.step && m > 0 ? step_cast : casts + d.cast});
    peak.visit({held + fig(&PieceForms::held_act, m), fig(&PieceForms::forward_temp, m), 0,
                c.step ? step_cast : casts + fig(&PieceForms::held_cast, m)});
  };
  auto backward = [&](i64 m, i64 lo, i64 hi, i64 pending) {
    const i64 held = sum(r, p, &PieceForms::held_act, lo, hi), casts = c.step ? step_cast : held_casts(lo, hi);
    const i64 dy_comm = p.recv_grad ? fig(&PieceForms::boundary, m) : 0;
    peak.visit({held, pending, dy_comm, casts});
    for (const PieceMoment& d : moments(r, p, m))
      peak.visit({held + d.activation, d.temp, d.dy_live ? dy_comm : 0, casts + (c.step ? 0 : d.cast)});
  };
  for (i64 j : breakpoints(0, w - 1, r.e, {0, -1})) forward(j, 0, j, j > 0 ? pending_f(j - 1) : 0);
  for (i64 t : breakpoints(0, M - w - 1, r.e, {0, -1, w, w + 1})) {
    forward(w + t, t, w + t, t > 0 ? pending_b(t - 1) : pending_f(w - 1));
    backward(t, t, w + t + 1, pending_f(w + t));
  }
  for (i64 j : breakpoints(M - w, M - 1, r.e, {0, -1}))
    backward(j, j, M, j > M - w || M - w > 0 ? pending_b(j - 1) : pending_f(M - 1));
  return peak.best();
}

// ZB-H1 on one chunk. Stage s runs w = min(S-s-1, M) forwards, then for b = 0..M-1:
// F(w+b) while any is left, B(b), and W(b-s) once b >= s; then the last W's. B computes
// only the input gradient and keeps for W what it reads (piece_forms.hpp's half figures).
//   whole pair (F done, B not): as 1F1B, held_act activation (held_temp temp);
//   half pair (B done, W not): half_act activation, half_temp temp, half_comm comm (the
//     received dy its top layer keeps). The MLP's: a_m·([received] + n-1) activation (its
//     input, the outputs W still reads) and n dz, the first the received dy or the loss
//     gradient; a transformer's: its blocks' saves W reads and kept output gradients;
//   pending: F's unsaved output until the next action's group; B's input gradient until
//     the next action's group, or past a W the next F's when F follows that W (its
//     consumer, stage s-1's B, runs in that F's round).
// Instants: groups and F(m) as in 1F1B; B(m): its group (with the received dy), then
// its split instants (split_backward), the dy alive throughout. A W passes the moment
// before it only at its split_weight instants (replicated kv heads' gradients): W(b-s)
// right after B(b), holding the whole pairs [b+1, ...) and the half pairs [b-s, b], with
// B(b)'s input gradient pending when an F follows the W (else the W's group sent it);
// the last W's, after every B, the half pairs [j, M). Any other allocation of a W (a
// transformer norm's scratch dx) follows frees of more.
CategoryBytes peak_zb_h1(const Ctx& c, const CategoryBytes& base) {
  const Piece& p = c.pieces[0];
  const Rows& r = c.rows;
  const i64 M = c.M, s = c.s, w = std::min<i64>(c.S - s - 1, M);
  auto fig = [&](i64 PieceForms::*f, i64 m) { return at(r, p, f, m); };
  auto pending_f = [&](i64 m) { return p.send_act && !p.big.output_saved ? fig(&PieceForms::boundary, m) : 0; };
  auto pending_b = [&](i64 m) { return p.send_grad ? fig(&PieceForms::input, m) : 0; };
  Peak peak(base);
  // Held by the whole pairs [lo, hi) and the half pairs [hlo, b).
  auto held = [&](i64 lo, i64 hi, i64 hlo, i64 b) {
    return Moment{sum(r, p, &PieceForms::held_act, lo, hi) + sum(r, p, &PieceForms::half_act, hlo, b),
                  sum(r, p, &PieceForms::held_temp, lo, hi) + sum(r, p, &PieceForms::half_temp, hlo, b),
                  sum(r, p, &PieceForms::half_comm, hlo, b)};
  };
  auto forward = [&](i64 m, Moment held_now, i64 pending) {
    peak.visit({held_now.activation + (p.recv_act ? fig(&PieceForms::input, m) : 0), held_now.temp + pending,
                held_now.comm});
    peak.visit({held_now.activation + fig(&PieceForms::held_act, m),
                held_now.temp + fig(&PieceForms::forward_temp, m), held_now.comm});
  };
  auto backward = [&](i64 m, Moment held_now, i64 pending) {
    const i64 dy_comm = p.recv_grad ? fig(&PieceForms::boundary, m) : 0;
    peak.visit({held_now.activation, held_now.temp + pending, held_now.comm + dy_comm});
    for (const PieceMoment& d : (m < r.e ? p.big : p.small).split_backward)
      peak.visit({held_now.activation + d.activation, held_now.temp + d.temp, held_now.comm + dy_comm});
  };
  auto weight = [&](i64 m, Moment held_now, i64 pending) {
    for (const PieceMoment& d : (m < r.e ? p.big : p.small).split_weight)
      peak.visit({held_now.activation + d.activation, held_now.temp + pending + d.temp,
                  held_now.comm - (d.dy_live ? 0 : fig(&PieceForms::half_comm, m))});
  };
  const bool weighs = !p.big.split_weight.empty();
  for (i64 j : breakpoints(0, w - 1, r.e, {0, -1})) forward(j, held(0, j, 0, 0), pending_f(j - 1));
  for (i64 b : breakpoints(0, M - 1, r.e, {0, -1, 1, w, w + 1, -s}, {s, M - w, M - w - 1})) {
    const i64 hlo = std::max<i64>(0, b - s);
    const bool f_runs = w + b < M;
    if (f_runs) forward(w + b, held(b, w + b, hlo, b), b == 0 ? pending_f(w - 1) : pending_b(b - 1));
    // Before B(b): F(w+b)'s output; else B(b-1)'s gradient unless a W came after it
    // (then that W's group sent it); B(0) of a stage with no steady state follows F(M-1).
    const i64 pending = f_runs ? pending_f(w + b) : b == 0 ? pending_f(M - 1) : b - 1 >= s ? 0 : pending_b(b - 1);
    backward(b, held(b, f_runs ? w + b + 1 : M, hlo, b), pending);
    if (weighs && b >= s)  // W(b-s); B(b)'s input gradient pending when F(w+b+1) follows
      weight(b - s, held(b + 1, f_runs ? w + b + 1 : M, b - s, b + 1), w + b + 1 < M ? pending_b(b) : 0);
  }
  if (weighs)
    for (i64 j = std::max<i64>(0, M - s); j < M; ++j) weight(j, held(M, M, j, M), 0);
  return peak.best();
}

// Interleaved 1F1B on v chunks. What a pair (micro-batch m, chunk c) holds between its F
// and its B is 1F1B's (a_m·h_c activation, h_c = [recv] + (n-1) + [ls]); on one stage
// (S = 1) the unsaved last output of a chunk other than the last stays, temp, as the
// next chunk's input. Pending buffers (temp): on S > 1 the unsaved output of an F (not
// the last virtual stage) and the input gradient of a B (k > 0) wait, owned, until the
// group that sends them: the first later step of this stage whose unit-time round
// reaches the consumer's (InterleavedTiming); on S = 1 a B's input gradient waits as the
// next backward's dy, which frees it. Instants per position p, in time order: its
// group (held + pending + the received input: activation for an F, comm for a B), then,
// with the group's sends freed, its action: F held + [recv]·a_m + n·a_m (the unsaved
// last one temp) + 4 (the loss scalar, last virtual stage); B held + dy (comm received,
// or temp) + the loss gradient (last virtual stage) + the first dx (unless n = 1 on
// virtual stage 0), all temp.
// The held pairs after p's forwards and backwards are chunk windows (saved_interleaved);
// the bytes move by one pair per action. In the steady state, from past every stage's
// stall to before any stage's cool-down (with the reach of a send, at most 4S steps,
// either side), position p + 2·S·v holds the same pairs and buffers as p with every
// micro-batch S on, rows no larger: it can never set a new maximum, and those
// positions are skipped. So O(S·v) positions are visited, each in O(1).
CategoryBytes peak_interleaved(const Ctx& c, const CategoryBytes& base) {
  const InterleavedTiming t(c.S, c.M, c.v);
  const Rows& r = c.rows;
  const i64 s = c.s, S = c.S, v = c.v, n = t.steps();
  auto fig = [&](const Piece& p, i64 PieceForms::*f, i64 m) { return at(r, p, f, m); };
  // The buffer position p leaves pending, and the step that frees it (0 bytes: none).
  struct Buffer {
    i64 step = 0, bytes = 0;
  };
  auto leaves = [&](i64 p) -> Buffer {
    const bool fwd = t.is_forward(s, p);
    const i64 k = t.index_at(s, p), m = t.microbatch(k);
    const int ch = static_cast<int>(fwd ? t.forward_chunk(k) : t.backward_chunk(k));
    const Piece& pc = c.pieces[ch];
    if (S == 1) {  // the input gradient stays as the previous chunk's dy
      if (fwd || pc.first) return {};
      return {t.backward_position(s, t.backward_index(m, ch - 1)) + 1, fig(pc, &PieceForms::input, m)};
    }
    if (fwd ? !pc.send_act || pc.big.output_saved : !pc.send_grad) return {};
    const InterleavedTiming::Consumer to = t.consumer(s, p);
    return {t.send_step(s, p, t.round(to.stage, to.position)),
            fig(pc, fwd ? &PieceForms::boundary : &PieceForms::input, m)};
  };
  i64 act = 0, temp = 0, cast = 0, pending_bytes = 0;
  std::vector<Buffer> pending;
  // The state before position p, from the windows and the buffers of the steps before.
  auto start_at = [&](i64 p) {
    act = temp = cast = pending_bytes = 0;
    pending.clear();
    const i64 fwds = t.forwards_before(s, p), bwds = t.backwards_before(s, p);
    for (int ch = 0; ch < c.v; ++ch) {
      const i64 hi = round_count(fwds, ch, c.S, c.v), lo = round_count(bwds, c.v - 1 - ch, c.S, c.v);
      act += sum(r, c.pieces[ch], &PieceForms::held_act, lo, hi);
      temp += sum(r, c.pieces[ch], &PieceForms::held_temp, lo, hi);
      cast += c.step ? (hi > 0 ? c.pieces[ch].big.step_cast : 0) : sum(r, c.pieces[ch], &PieceForms::held_cast, lo, hi);
    }
    for (i64 q = std::max<i64>(0, p - 4 * S); q < p; ++q) {
      const Buffer b = leaves(q);
      if (b.bytes > 0 && b.step >= p) pending.push_back(b), pending_bytes += b.bytes;
    }
  };
  Peak peak(base);
  auto visit = [&](i64 p) {
    const bool fwd = t.is_forward(s, p);
    const i64 k = t.index_at(s, p), m = t.microbatch(k);
    const int ch = static_cast<int>(fwd ? t.forward_chunk(k) : t.backward_chunk(k));
    const Piece& pc = c.pieces[ch];
    const i64 recv = fwd ? (pc.recv_act ? fig(pc, &PieceForms::input, m) : 0)
                         : (pc.recv_grad ? fig(pc, &PieceForms::boundary, m) : 0);
    peak.visit({act + (fwd ? recv : 0), temp + pending_bytes, fwd ? 0 : recv, cast});
    for (std::size_t i = 0; i < pending.size();) {
      if (pending[i].step > p) {
        ++i;
        continue;
      }
      pending_bytes -= pending[i].bytes;
      pending[i] = pending.back();
      pending.pop_back();
    }
    if (fwd) {
      // --autocast-region step: the chunk's F(0) makes its casts, held to the step's end.
      const bool made = c.step && m > 0;
      const i64 cast_after = cast + (c.step ? (made ? 0 : pc.big.step_cast) : fig(pc, &PieceForms::held_cast, m));
      for (const PieceMoment& d : forward_moments(r, pc, m))
        peak.visit({act + d.activation, temp + pending_bytes + d.temp, 0, made ? cast : cast + d.cast});
      peak.visit({act + fig(pc, &PieceForms::held_act, m),
                  temp + pending_bytes + fig(pc, &PieceForms::forward_temp, m), 0, cast_after});
      act += fig(pc, &PieceForms::held_act, m);
      temp += fig(pc, &PieceForms::held_temp, m);
      cast = cast_after;
    } else {
      // On one stage the dy of a chunk but the last is the next chunk's input gradient,
      // pending here until this B frees it.
      const i64 dy_local = S == 1 && !pc.last ? fig(pc, &PieceForms::boundary, m) : 0;
      for (const PieceMoment& d : moments(r, pc, m))
        peak.visit({act + d.activation, temp + pending_bytes + d.temp - (d.dy_live ? 0 : dy_local),
                    d.dy_live ? recv : 0, cast + (c.step ? 0 : d.cast)});
      act -= fig(pc, &PieceForms::held_act, m);
      temp -= fig(pc, &PieceForms::held_temp, m);
      if (!c.step) cast -= fig(pc, &PieceForms::held_cast, m);
    }
    const Buffer b = leaves(p);
    if (b.bytes > 0) pending.push_back(b), pending_bytes += b.bytes;
  };
  // Every stage's stall starts by v·S + 3S and its cool-down after 2vM - v·S - S; a
  // send reaches at most 4S steps.
  const i64 reach = 4 * S, period = 2 * S * v;
  const i64 regular_from = v * S + 3 * S + reach, regular_to = n - v * S - S - reach;
  const i64 skip_from = std::min(n, regular_from + period), skip_to = std::max(skip_from, regular_to);
  start_at(0);
  for (i64 p = 0; p < skip_from; ++p) visit(p);
  if (skip_to > skip_from) start_at(skip_to);
  for (i64 p = skip_to; p < n; ++p) visit(p);
  return peak.best();
}


// zbv on its two chunks (zbv_timing.hpp: each position's action, each send's step). A
// pair (micro-batch m, chunk c) holds, from its F to its B, what 1F1B's does (held_act,
// held_temp); from its B to its W what zb-h1's half pair does (half_act, half_temp,
// half_comm). Pending buffers (temp): an F's unsaved output bound for another stage and
// a B's input gradient (k > 0) wait, owned, until the group of the step ZbvTiming::
// send_step names. The V's bottom (stage S-1: chunk 0 is virtual stage S-1, chunk 1 is
// S, passing to each other without a message) adds two:
//   local gradient: B1(m)'s input gradient (chunk 0's boundary bytes, temp) waits from
//     B1(m) as B0(m)'s dy, then joins chunk 0's half pair (half_temp counts it);
//   kept output: chunk 0's output is chunk 1's input, which W1(m) still reads; when
//     B0(m) runs before W1(m) (the cool-down) B0 does not free it, and it stays (in its
//     own category: activation when saved, else temp) until W1(m).
// Instants per position: F its group (held + pending + the received input, activation),
// then, the group's sends freed, its end (held_act(m) more, forward_temp(m) temp); B its
// group (the received dy, comm) then its split instants (split_backward; a kept output
// added back to those after the output's free); W its split_weight instants (replicated
// kv heads' gradients; none otherwise: a W never passes the moment before it). So the
// state after any position is a formula of the counts of each (kind, chunk) before it,
// and in the steady state position p + 6 holds the same pairs and buffers as p with
// every micro-batch one on, rows no larger: it can never set a new maximum. Positions
// are visited from 0 until a whole period past the start of every stage's steady state
// (and of every send's reach), and from a period before any stage's cool-down to the
// end: O(S) positions.
class ZbvWalk {
 public:
  using Kind = ZbvTiming::Kind;
  ZbvWalk(const Ctx& c, const CategoryBytes& base) : c_(c), t_(c.S, c.M), peak_(base) {
    const i64 S = c.S, s = c.s;
    const i64 d = 5 * S - 3 * s - 1, e = t_.position(s, Kind::B, 0, c.M - S);  // steady state [d, e)
    const i64 margin = 6 * (2 * S + 2) + reach();
    skip_from_ = std::min(t_.steps(), d + margin + 6);
    skip_to_ = std::max(skip_from_, e - margin);
    bottom_ = c.s == c.S - 1;
  }
  // Visits every position that can hold the peak; fills peak() and the saved figures.
  void run() {
    start_at(0);
    for (i64 p = 0; p < skip_from_; ++p) visit(p);
    if (skip_to_ > skip_from_) start_at(skip_to_);
    for (i64 p = skip_to_; p < t_.steps(); ++p) visit(p);
  }
  const CategoryBytes& peak() const { return peak_.best(); }
  const SavedForms& saved() const { return saved_; }

 private:
  i64 reach() const { return 6 * c_.S + 12; }  // the furthest a send waits (the tests hold it)
  const Piece& piece(int ch) const { return c_.pieces[static_cast<std::size_t>(ch)]; }
  i64 fig(int ch, i64 PieceForms::*f, i64 m) const { return at(c_.rows, piece(ch), f, m); }
  i64 range(int ch, i64 PieceForms::*f, i64 lo, i64 hi) const { return sum(c_.rows, piece(ch), f, lo, hi); }
  // The output chunk 0 keeps for chunk 1 on the V's bottom, in its category.
  bool kept_is_act() const { return piece(0).big.output_saved; }
  // With relu the bottom's chunk 0 saves its output, which chunk 1's first Linear saves
  // again: one tensor, counted once while both hold it (the MLP; a transformer's chunk 0
  // saves no output).
  bool shared_save() const { return bottom_ && !c_.transformer && c_.relu; }

  // The buffer position q leaves pending, and the step whose group sends it.
  struct Pending {
    i64 step = 0, bytes = 0;
  };
  Pending leaves(i64 q) const {
    const ZbvTiming::Op op = t_.at(c_.s, q);
    const Piece& p = piece(op.chunk);
    if (op.kind == Kind::W) return {};
    if (op.kind == Kind::F ? !p.send_act || p.big.output_saved : !p.send_grad) return {};
    const ZbvTiming::Consumer to = t_.consumer(c_.s, op.kind, op.chunk, op.microbatch);
    return {t_.send_step(c_.s, t_.round(to.stage, to.position)),
            fig(op.chunk, op.kind == Kind::F ? &PieceForms::boundary : &PieceForms::input, op.microbatch)};
  }

  void start_at(i64 p) {
    act_ = temp_ = comm_ = pending_bytes_ = 0;
    pending_.clear();
    saves_ = saved_bytes_ = 0;
    for (int ch = 0; ch < 2; ++ch) {
      f_[ch] = t_.count_before(c_.s, Kind::F, ch, p);
      b_[ch] = t_.count_before(c_.s, Kind::B, ch, p);
      w_[ch] = t_.count_before(c_.s, Kind::W, ch, p);
      act_ += range(ch, &PieceForms::held_act, b_[ch], f_[ch]) + range(ch, &PieceForms::half_act, w_[ch], b_[ch]);
      temp_ += range(ch, &PieceForms::held_temp, b_[ch], f_[ch]) + range(ch, &PieceForms::half_temp, w_[ch], b_[ch]);
      comm_ += range(ch, &PieceForms::half_comm, w_[ch], b_[ch]);
      saves_ += (f_[ch] - b_[ch]) * piece(ch).big.saves + (b_[ch] - w_[ch]) * piece(ch).big.half_saves;
      saved_bytes_ += range(ch, &PieceForms::saved_bytes, b_[ch], f_[ch]) +
                      range(ch, &PieceForms::half_saved_bytes, w_[ch], b_[ch]);
    }
    if (bottom_) {
      temp_ += range(0, &PieceForms::boundary, b_[0], b_[1]);  // local gradients
      (kept_is_act() ? act_ : temp_) += range(0, &PieceForms::boundary, w_[1], b_[0]);  // kept outputs
      if (shared_save()) saved_bytes_ -= range(0, &PieceForms::boundary, std::max(b_[0], w_[1]), std::min(f_[0], f_[1]));
    }
    for (i64 q = std::max<i64>(0, p - reach()); q < p; ++q) {
      const Pending b = leaves(q);
      if (b.bytes > 0 && b.step >= p) pending_.push_back(b), pending_bytes_ += b.bytes;
    }
  }

  void visit(i64 p) {
    const ZbvTiming::Op op = t_.at(c_.s, p);
    const int ch = op.chunk;
    const i64 m = op.microbatch;
    const Piece& pc = piece(ch);
    const PieceForms& f = m < c_.rows.e ? pc.big : pc.small;
    const i64 recv = op.kind == Kind::F ? (pc.recv_act ? fig(ch, &PieceForms::input, m) : 0)
                     : op.kind == Kind::B ? (pc.recv_grad ? fig(ch, &PieceForms::boundary, m) : 0)
                                          : 0;
    visit_at({act_ + (op.kind == Kind::F ? recv : 0), temp_ + pending_bytes_, comm_ + (op.kind == Kind::B ? recv : 0)});
    for (std::size_t i = 0; i < pending_.size();) {
      if (pending_[i].step > p) {
        ++i;
        continue;
      }
      pending_bytes_ -= pending_[i].bytes;
      pending_[i] = pending_.back();
      pending_.pop_back();
    }
    switch (op.kind) {
      case Kind::F:
        visit_at({act_ + f.held_act, temp_ + pending_bytes_ + f.forward_temp, comm_});
        act_ += f.held_act;
        temp_ += f.held_temp;
        saves_ += f.saves;
        saved_bytes_ += f.saved_bytes;
        if (shared_save() && ch == 1) saved_bytes_ -= fig(0, &PieceForms::boundary, m);  // both hold it now
        saved_.peak_live_tensors = std::max(saved_.peak_live_tensors, saves_);
        saved_.peak_live_bytes = std::max(saved_.peak_live_bytes, saved_bytes_);
        break;
      case Kind::B: {
        if (saved_.before_first_backward < 0) saved_.before_first_backward = saves_;
        // The bottom's chunk 0 keeps its output when chunk 1's W is still to come.
        const bool keep = bottom_ && ch == 0 && w_[1] <= m;
        const i64 out = keep ? fig(0, &PieceForms::boundary, m) : 0;
        for (const PieceMoment& d : f.split_backward) {
          const i64 back = d.output_freed ? out : 0;
          visit_at({act_ + d.activation + (kept_is_act() ? back : 0),
                    temp_ + pending_bytes_ + d.temp + (kept_is_act() ? 0 : back), comm_ + recv});
        }
        act_ += f.half_act - f.held_act + (kept_is_act() ? out : 0);
        temp_ += f.half_temp - f.held_temp + (kept_is_act() ? 0 : out);
        comm_ += f.half_comm;
        saves_ += f.half_saves - f.saves;
        saved_bytes_ += f.half_saved_bytes - f.saved_bytes;
        if (shared_save() && ch == 0 && w_[1] <= m) saved_bytes_ += fig(0, &PieceForms::boundary, m);  // chunk 1's now
        if (bottom_ && ch == 0) temp_ -= fig(0, &PieceForms::boundary, m);  // its dy joined the half pair
        if (bottom_ && ch == 1) temp_ += fig(0, &PieceForms::boundary, m);  // chunk 0's dy, here
        break;
      }
      case Kind::W:
        for (const PieceMoment& d : f.split_weight)  // replicated kv heads' gradients
          visit_at({act_ + d.activation, temp_ + pending_bytes_ + d.temp, comm_ - (d.dy_live ? 0 : f.half_comm)});
        act_ -= f.half_act;
        temp_ -= f.half_temp;
        comm_ -= f.half_comm;
        saves_ -= f.half_saves;
        saved_bytes_ -= f.half_saved_bytes;
        if (bottom_ && ch == 1 && b_[0] > m) {  // the kept output goes with the last reader
          (kept_is_act() ? act_ : temp_) -= fig(0, &PieceForms::boundary, m);
        } else if (shared_save() && ch == 1) {
          saved_bytes_ += fig(0, &PieceForms::boundary, m);  // chunk 0 still saves it
        }
        break;
    }
    (op.kind == Kind::F ? f_ : op.kind == Kind::B ? b_ : w_)[ch] += 1;
    const Pending b = leaves(p);
    if (b.bytes > 0) pending_.push_back(b), pending_bytes_ += b.bytes;
  }
  void visit_at(const Moment& m) { peak_.visit(m); }

  const Ctx& c_;
  ZbvTiming t_;
  Peak peak_;
  SavedForms saved_{0, 0, 0, -1};
  i64 skip_from_ = 0, skip_to_ = 0;
  bool bottom_ = false;
  i64 f_[2] = {0, 0}, b_[2] = {0, 0}, w_[2] = {0, 0};  // actions of each chunk before the position
  i64 act_ = 0, temp_ = 0, comm_ = 0, pending_bytes_ = 0, saves_ = 0, saved_bytes_ = 0;
  std::vector<Pending> pending_;
};

SavedForms saved_zbv(const Ctx& c) {
  ZbvWalk walk(c, CategoryBytes{});
  walk.run();
  SavedForms f = walk.saved();
  f.total_tensors = c.M * (c.pieces[0].big.saves + c.pieces[1].big.saves);
  return f;
}

CategoryBytes peak_zbv(const Ctx& c, const CategoryBytes& base) {
  ZbvWalk walk(c, base);
  walk.run();
  return walk.peak();
}

}  // namespace

StageForms predict_pipeline_stage(const PipelineShape& shape, int stage, int data_parallel) {
  const Ctx c = make_ctx(shape, stage);
  const ScheduleKind kind = shape.schedule;
  StageForms out;
  out.resting = resting(c);
  out.p2p_sent_bytes = p2p_sent(c);
  out.saved = kind == ScheduleKind::interleaved_1f1b ? saved_interleaved(c)
              : kind == ScheduleKind::zbv            ? saved_zbv(c)
                                                     : saved_one_chunk(c, kind);
  // The step's base: the batch (B, width) on the first virtual stage's stage, mse's
  // target (B, width) on the last's, both temp, held through the whole schedule.
  CategoryBytes base = out.resting;
  if (c.s == first_stage(c)) base[Category::temp] += c.batch_bytes;
  if (c.s == last_stage(c)) base[Category::temp] += c.target_bytes;
  switch (kind) {
    case ScheduleKind::gpipe: out.peak = peak_one_f_one_b(c, c.M, base); break;
    case ScheduleKind::one_f_one_b: out.peak = peak_one_f_one_b(c, std::min(c.S - c.s - 1, c.M), base); break;
    case ScheduleKind::zb_h1: out.peak = peak_zb_h1(c, base); break;
    case ScheduleKind::interleaved_1f1b: out.peak = peak_interleaved(c, base); break;
    case ScheduleKind::zbv: out.peak = peak_zbv(c, base); break;
  }
  // A tied embedding on two stages: after the program (the batch and target freed) the
  // two all-reduce its gradient through a received copy (comm, 4·V·h), a later instant.
  if (holds_tied(c)) {
    out.tied_all_reduce_bytes = 4 * tied_elems(c);
    CategoryBytes at_reduce = out.resting;
    at_reduce[Category::comm] += out.tied_all_reduce_bytes;
    if (at_reduce.total() > out.peak.total()) out.peak = at_reduce;
  }
  // Each parameter's gradient (4 B) once through the data-parallel group's all-reduce.
  if (data_parallel > 1) out.dp_all_reduce_bytes = out.resting[Category::grad];
  out.tp_all_reduce_bytes = tp_all_reduce(c);
  return out;
}

}  // namespace shardscope
