// zero1 and zero2 under --engine deepspeed: DeepSpeed's ZeRO stages 1 and 2
// (DeepSpeedZeroOptimizer, contiguous_gradients on, overlap_comm off, reduce_scatter off:
// each bucket all-reduced), fp32 or bf16. docs/design.md, "DeepSpeed"; the layout:
// deepspeed_layout.hpp.
//
// --precision bf16 (the MLP): DeepSpeed's bf16 regime under ZeRO 1 and 2 (the
// engine casts the module to bf16; the ZeRO optimizer takes its bf16 parameters): the flat
// group, autograd's gradients, the bucket (communication_data_type defaults to bf16 under
// bf16: divided and all-reduced in bf16), grads_in_partition and the padding are bf16, 2 B
// an element; the optimizer's copy of the partition is the fp32 master weights (category
// master), AdamW's state fp32. The step flattens the averaged partition in bf16 (2s), casts
// it to a new fp32 buffer (4s, `.to(fp32)`) and frees the bf16 one; after AdamW the master
// weights are rounded into the flat group's partition and the group all-gathered in bf16.
// The Linears run on bf16 views of the group and write bf16 gradients
// (ModelConfig::param_bf16, harness/model/mlp.cpp). --accumulate: grad_accum_dtype defaults
// to bf16, so stage 1's autograd gradients and stage 2's accumulated partition add up in
// bf16 (Backend::add_bf16, each sum rounded).
//
// At rest, per rank:
//   param  the flat group (Ppad elements; the model's parameters are views of it) and the
//          optimizer's own copy of the rank's partition (s elements, cloned from it:
//          single_partition_of_fp32_groups);
//   optim  exp_avg and exp_avg_sq of the partition and one `step` (the optimizer holds one
//          parameter, the flat partition);
//   grad   none: DeepSpeed frees every gradient buffer in its step.
// A step:
//   backward begins   the ipg bucket (comm, --bucket-mb) is made; stage 2 also makes
//                     grads_in_partition (grad: every tensor touching the partition, whole;
//                     DeepSpeed makes it at its first copy);
//   stage 1           autograd's gradients, one flat buffer of P (grad_unsharded), live
//                     until every bucket is reduced after the backward; the tensors go
//                     into the bucket in flat order, grads_in_partition made at the first
//                     copy;
//   stage 2           each block's gradients (grad_unsharded; the transformer's embeddings
//                     and final block together, as their tied head shares them) from its
//                     backward's start to its end, then copied into the bucket, last tensor
//                     first, and freed;
//   a full bucket     is averaged and all-reduced, and its tensors that touch the partition
//                     copied into grads_in_partition;
//   after backward    the last bucket is reduced; the partition's padding (a rank whose
//                     partition runs past P) is a zero tensor; the bucket (and stage 1's
//                     gradients) freed;
//   optimizer         the partition's averaged gradient flattened into a new buffer (grad,
//                     s), grads_in_partition and the padding freed, AdamW on the copy, the
//                     gradient freed, the copy written back into the flat group and the
//                     group all-gathered in place.
// --accumulate K (DeepSpeed's engine: allreduce_gradients after every backward):
//   stage 1           reduces only at the accumulation boundary (the last micro-step):
//                     autograd's gradients add up in their flat buffer, which with the
//                     bucket (made at the first backward's first hook, setup_buckets) stays
//                     from the first micro-step's backward to the boundary's reduction.
//                     --no-sync changes nothing: DeepSpeed's no_sync skips the reduction
//                     stage 1 skips anyway before the boundary;
//   stage 2           reduces in its hooks every micro-step (K all-reduces); the first
//                     micro-step's grads_in_partition becomes the accumulated gradient (its
//                     epilogue's all_grad_tensors, views of it) held to the optimizer; each
//                     later micro-step's backward makes a new one beside it, added onto it
//                     in the epilogue and freed there; the padding is made at the boundary
//                     alone. --no-sync is refused (DeepSpeed's no_sync asserts against
//                     ZeRO stage 2/3).
#pragma once

#include <vector>

#include "harness/model/adam_state.hpp"
#include "harness/strategies/deepspeed_layout.hpp"
#include "harness/strategies/unit_sharded.hpp"

namespace shardscope {

class DeepSpeedZero : public UnitShardedStrategy {
 public:
  DeepSpeedZero(const StrategyContext& ctx, int stage);
  void setup() override;
  HostState gather_state() override;
  int units() const override { return 1; }  // DeepSpeed has no units: one flat group

 protected:
  void reduce_gradients() override;
  void optimizer_step(int step) override;
  void gather(int) override {}   // every parameter is always there
  void reshard(int) override {}
  void begin_unit_gradient(int unit) override;
  void reduce_unit(int unit) override;
  // Stage 1 reduces at the accumulation boundary only; stage 2 every micro-step.
  bool syncs() const override { return stage_ == 2 || last_micro_step(); }
  // Stage 1's autograd gradients add up across micro-steps; stage 2's are fresh each one.
  float backward_beta(int k) const override { return stage_ == 1 && k > 0 ? 1.0f : 0.0f; }

 private:
  // BlockAccess
  const float* param(int block, int tensor) override;
  float* grad(int block, int tensor) override;

  std::int64_t tensor_offset(int block, int tensor) const;
  // Element `elem` of a buffer of the model's dtype (lp_), as the float* the model and the
  // copies pass around (a bf16 one is read back with as_bf16); a copy of n such elements.
  float* at(const Buffer& b, std::int64_t elem) const;
  void copy_lp(float* dst, const float* src, std::size_t n);
  // Tensor t's gradient (n elements at src) into the bucket, reducing the bucket first when
  // it would overflow.
  void add_to_bucket(int t, const float* src);
  void reduce_bucket();

  int stage_;
  DsPartition part_;
  std::int64_t bucket_cap_ = 0;
  // The dtype of the flat group, autograd's gradients, the bucket, grads_in_partition and
  // the padding: fp32, or bf16 under --precision bf16 (the optimizer's copy and AdamW fp32).
  DType lp_ = DType::f32;
  std::vector<std::int64_t> gip_offset_;          // each touching tensor's place in grads_in_partition
  std::vector<std::int64_t> block_offset_in_unit_;  // stage 2: where each block starts in its unit's buffer

  Buffer flat_;      // (Ppad) param: the model's parameters
  Buffer master_;    // (s) param: the optimizer's copy of the partition
  AdamState adam_;   // (s) optim
  Buffer bucket_;    // (cap) comm, during backward and its reduction
  Buffer autograd_;  // stage 1: (P) grad_unsharded
  std::vector<Buffer> unit_grad_;  // stage 2: each unit's (elems) grad_unsharded during its backward
  Buffer gip_;       // (touching) grad: this micro-step's grads_in_partition
  Buffer acc_;       // (touching) grad: the accumulated one (the first micro-step's), to the optimizer
  Buffer pad_;       // (pad) grad: the partition's padding
  std::vector<std::pair<int, std::int64_t>> in_bucket_;  // (tensor, offset in the bucket)
  std::int64_t bucket_used_ = 0;
  std::vector<float> last_grad_;  // the last step's averaged partition gradient (host, untracked)
};

}  // namespace shardscope
