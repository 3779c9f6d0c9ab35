// ddp under --engine deepspeed --precision bf16: DeepSpeed's ZeRO stage 0 in bf16, as its
// engine builds it (read at DeepSpeed commit edaa722): engine.py's
// `_do_optimizer_sanity_check` returns DDP_BFLOAT16 for bf16 without ZeRO when
// grad_accum_dtype is the model's bf16 (its default; stage 0 with fp32 accumulation raises
// NotImplementedError, BF16_Optimizer is taken only by stage 1 with fp32 accumulation and by
// pipelines), and `_configure_optimizer` wraps the basic optimizer in
// `_configure_fp16_optimizer(basic, bf16)`: the config's AdamW is DeepSpeed's FusedAdam, so
// FP16_Optimizer (runtime/fp16/fused_optimizer.py) in bf16, the ZeRO paper's baseline,
// 16 B a parameter on every rank. (A client's torch.optim.AdamW takes
// FP16_UnfusedOptimizer instead: not modelled.)
//
// At rest, per rank (P parameters, no padding: nothing is partitioned):
//   param   the bf16 flat group (fp16_groups_flat, P elements; the model's parameters are
//           views of it);
//   master  the fp32 copy of the whole group (fp32_groups_flat, 4P);
//   optim   AdamW's exp_avg and exp_avg_sq of it and one `step`;
//   grad    none: the step sets every gradient to None.
// Setup: FP16_Optimizer.initialize_optimizer_states gives the master a zero fp32 gradient
// and steps the optimizer once (FusedAdam steps a zero gradient: AdamW's step 1, its
// weight decay applied to the master alone), so the first training step is AdamW's step 2.
// A step:
//   backward       autograd's bf16 gradients, one flat buffer of P (grad_unsharded), from
//                  the backward's first block (as stage 1's; torch makes one per tensor);
//   --accumulate   the engine reduces only at the accumulation boundary
//                  (allreduce_gradients): the gradients add up in bf16 across micro-steps
//                  (each sum rounded; grad_accum_dtype bf16); --no-sync changes nothing;
//   boundary       buffered_allreduce_fallback: the gradients in parameter order, in buckets
//                  each closed once it holds more than elements_per_buffer elements
//                  (allreduce_no_retain; ds_stage0_buckets); each bucket flattened into a
//                  new bf16 buffer (comm), all-reduced in bf16 (communication_data_type),
//                  multiplied by 1/W (postscale_gradients, gradient_predivide_factor 1),
//                  copied back into the gradients and freed;
//   optimizer      FP16_Optimizer.step: the overflow check casts each gradient to fp32
//                  (temp, 4·n_t, one at a time); every gradient cast to fp32 (temp, 4P, all
//                  alive) and flattened into the master's gradient (grad, 4P), the casts
//                  and the bf16 gradients freed; AdamW on the master; its gradient freed;
//                  the master rounded into the bf16 group. No all-gather.
#pragma once

#include <vector>

#include "harness/model/adam_state.hpp"
#include "harness/strategies/deepspeed_layout.hpp"
#include "harness/strategies/unit_sharded.hpp"

namespace shardscope {

class DeepSpeedStage0 : public UnitShardedStrategy {
 public:
  explicit DeepSpeedStage0(const StrategyContext& ctx);
  void setup() override;
  HostState gather_state() override;
  int units() const override { return 1; }  // one flat group, autograd's gradients one root unit

 protected:
  void reduce_gradients() override;
  void optimizer_step(int step) override;
  void gather(int) override {}  // every parameter is always there
  void reshard(int) override {}
  void begin_unit_gradient(int unit) override;
  void reduce_unit(int) override {}  // the engine reduces after the backward
  // The engine reduces at the accumulation boundary alone; the gradients add up until then.
  bool syncs() const override { return last_micro_step(); }
  float backward_beta(int k) const override { return k > 0 ? 1.0f : 0.0f; }

 private:
  // BlockAccess: bf16 views of the flat group and of autograd's gradients.
  const float* param(int block, int tensor) override;
  float* grad(int block, int tensor) override;
  float* at(const Buffer& b, std::int64_t elem) const;  // element `elem` of a bf16 buffer

  std::vector<DsStage0Bucket> buckets_;
  Buffer flat_;      // (P) param, bf16
  Buffer master_;    // (P) master, fp32
  AdamState adam_;   // (P) optim
  Buffer autograd_;  // (P) grad_unsharded, bf16: from the first backward to the step
  std::vector<float> last_grad_;  // the last step's averaged gradient (host, untracked)
};

}  // namespace shardscope
