// Closed forms of zero1, zero2 and zero3 under --engine deepspeed (DeepSpeed's ZeRO stages;
// docs/formulas.md, "DeepSpeed"). fp32; P parameters, T tensors, W ranks, Ppad = P rounded
// up to a multiple of 2W, s = Ppad / W; for rank r (deepspeed_layout.hpp): G_r = 4 × the
// elements of every tensor touching its partition, pad_r = 4 × its partition's elements past
// P; c = the ipg bucket's elements (--bucket-mb), Bk = 4c.
//   stages 1, 2 at rest   param 4 Ppad + 4 s (the flat group and the optimizer's copy of
//                         the partition), grad 0, optim 8 s + 4
//   stage 3 at rest       per tensor t its partition c_t = ceil(n_t / W), C = Σ c_t:
//                         param 4 C + 4 C (the partitions and the optimizer's copy) plus
//                         4 n_t of every persistent tensor (n_t ≤ 100,000, kept gathered),
//                         grad 4 C, optim 8 C + 4 per sub-group (of 10^9 elements)
//   traffic (1, 2)        all-reduce 4P a reduction (the buckets: stage 1 reduces once a
//                         step, at the accumulation boundary; stage 2 every micro-step, 4PK
//                         under --accumulate K), all-gather 4 Ppad (the group after the
//                         step, once)
// The peak of stages 1 and 2: the torch engine's walk of the forward and backward (one root
// unit holding autograd's 4P and the bucket from the backward's start for stage 1; one
// unit a block, each its gradients during its backward, the root unit also the bucket and
// stage 2's grads_in_partition), then the reduction's instant (stage 1: 4P + Bk + G_r +
// pad_r; stage 2: Bk + G_r + pad_r) and the optimizer's (G_r + pad_r + 4 s). Stage 3 is
// predicted through its step (the MLP's in fp32 and bf16: deepspeed_stage3_forms.cpp, GPT-2's
// and Llama's in fp32 and GPT-2's in bf16, each module gathered on its own:
// deepspeed_stage3_transformer_forms.cpp; resting adds the kept bucket Bk, and a lone
// persistent tensor holds its W·c_t gather buffer); Llama's bf16 stages (its ddp the ZeRO
// paper's baseline) and GPT-2's bf16 stage 3 under --checkpoint by their model states
// (peak_known false). ddp under bf16 is DeepSpeed's stage 0 (deepspeed_stage0.hpp), run and
// predicted for the MLP and GPT-2: the stage-1 walk without the ipg bucket, then its
// buckets' flat copies and FP16_Optimizer's fp32 casts (deepspeed_forms.cpp, bf16_tail).
// --accumulate K > 1: the first micro-step's walk, then a later one's: stage 1's with
// autograd's 4P and Bk held from its start (reduced at the boundary alone), stage 2's with
// the accumulated G_r beside every instant (its backward makes a new G_r); stage 2's
// boundary reduction holds both (Bk + 2 G_r + pad_r).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/config.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

struct Ds3Layout;

// A forms walk's instants over the resting bytes, the first of the largest kept (as the
// tracker keeps it): stages 1-2's and stage 3's walks.
struct DeepSpeedPeak {
  CategoryBytes bytes;
  std::int64_t total = -1;
  Phase phase = Phase::setup;
  std::string where;
  void consider(const CategoryBytes& b, Phase ph, const std::string& at) {
    if (b.total() <= total) return;
    bytes = b;
    total = b.total();
    phase = ph;
    where = at;
  }
};

std::vector<Prediction> predict_deepspeed_ranks(const RunConfig& cfg, int world);

// Stage 3's run of the MLP, fp32 or bf16 (harness/strategies/deepspeed_zero3.hpp), every rank:
// deepspeed_stage3_forms.cpp.
std::vector<Prediction> predict_deepspeed_stage3_mlp(const RunConfig& cfg, int world);
// Of GPT-2 and Llama in fp32 and GPT-2 in bf16, each module gathered on its own:
// deepspeed_stage3_transformer_forms.cpp.
std::vector<Prediction> predict_deepspeed_stage3_transformer(const RunConfig& cfg, int world);

// Stage 3's gather of a set of tensors (deepspeed_layout.hpp's Ds3Layout), e bytes an
// element (4 fp32, 2 bf16): the bytes it leaves gathered (one tensor: its buffer of W·c_t; several: n_t each), the flat comm
// buffer beside them at its instant (several: W·Σc_t), and the bytes its all-gather moves
// (the whole output, as the ledger counts it); nothing at all on one rank.
struct Ds3Gather {
  std::int64_t held = 0, flat = 0, moved = 0;
};
Ds3Gather ds3_gather(const Ds3Layout& l, const std::vector<int>& tensors, int world, std::int64_t e = 4);

}  // namespace shardscope
