// Interleaved 1F1B (Narayanan et al. 2021; Megatron-LM's
// forward_backward_pipelining_with_interleaving).
//
// Each stage holds v chunks; the model is V = S*v pieces and piece k is chunk k / S of
// stage k % S. A stage runs v*M chunk-forwards and v*M chunk-backwards. The k-th forward
// it runs takes micro-batches in groups of S per chunk: within a round of S*v forwards,
// chunk (k % (S*v)) / S, micro-batch (k / (S*v)) * S + k % S. Backwards go through the
// same sequence with the chunk reversed (v-1 - ...), since gradients enter at the last
// piece. Why groups of S: a micro-batch's output of chunk c on stage S-1 comes back to
// stage 0 (chunk c+1) exactly S forwards later, so a group of S keeps stage 0 busy
// meanwhile. Hence M must be a multiple of S (checked by make_schedule).
//
// Warm-up: (v-1)*S chunk-forwards fill the other chunks, plus 2 per stage between s and
// the last stage (the first gradient's way down and back), capped at v*M: Megatron's
// count. Then alternate F, B; then drain the B's. Live chunk-micro-batches peak at
// min(warm-up + 1, v*M) = min(2(S-s-1) + (v-1)S + 1, vM). The bubble shrinks to
// (S-1)/(vM+S-1) because each chunk action is 1/v of a stage's work.
//
// Unlike old Megatron, M == S gets no all-forwards-first special case: the generic
// warm-up is valid there too (the validator proves it) and keeps the memory formula.
#include <algorithm>

#include "harness/pipeline/generators.hpp"

namespace shardscope::schedules {

namespace {

// k-th forward (or backward) a stage runs -> (micro-batch, chunk).
Action nth(ActionKind kind, int k, int stages, int chunks) {
  const int round = stages * chunks;
  int chunk = (k % round) / stages;
  if (kind == ActionKind::B) chunk = chunks - 1 - chunk;
  const int microbatch = (k / round) * stages + k % stages;
  return {kind, microbatch, chunk};
}

}  // namespace

StageActions interleaved_1f1b(int stages, int microbatches, int chunks) {
  const int total = chunks * microbatches;  // chunk-forwards per stage
  StageActions out(stages);
  for (int s = 0; s < stages; ++s) {
    const int warmup = std::min((stages - s - 1) * 2 + (chunks - 1) * stages, total);
    auto& list = out[s];
    int next_f = 0;
    int next_b = 0;
    for (; next_f < warmup; ++next_f) list.push_back(nth(ActionKind::F, next_f, stages, chunks));
    for (; next_f < total; ++next_f) {  // steady state
      list.push_back(nth(ActionKind::F, next_f, stages, chunks));
      list.push_back(nth(ActionKind::B, next_b++, stages, chunks));
    }
    for (; next_b < total; ++next_b) list.push_back(nth(ActionKind::B, next_b, stages, chunks));
  }
  return out;
}

}  // namespace shardscope::schedules
