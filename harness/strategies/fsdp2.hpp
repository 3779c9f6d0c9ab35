// zero2 and zero3 under --engine fsdp2: torch's fully_shard (FSDP2) on the units the
// torch engine uses (--units; fsdp_units), reshard_after_forward false (zero2) or true
// (zero3; never for a root unit, as fully_shard leaves the root gathered after forward).
//
// Every parameter tensor is its own shard along dim 0 in torch.chunk sizes (Dim0Shard):
//   param  each tensor's padded shard, chunk_rows rows, allocated on its own;
//   grad   one flat buffer per unit, the tensors' padded shards one after another (the
//          reduce-scatter's output, which the gradients are views of);
//   optim  per tensor exp_avg and exp_avg_sq of the unpadded local rows, and one step.
// A gather (foreach_all_gather) copies the unit's padded shards into this rank's slot of
// a flat buffer of W x A_u elements (A_u: the unit's padded shards together; category
// comm), all-gathers in place, then copies each tensor out of it into the tensor's own
// gathered buffer of W x padded elements (param_unsharded; its first rows are the
// tensor), and frees the flat buffer.
// A unit's backward gives each tensor its own full gradient (grad_unsharded, unpadded).
// When the unit's backward ends (foreach_reduce) they are copied, chunk by chunk with zero
// padding, into a flat reduce-scatter input of W x A_u elements (comm) laid out as the
// gather's, freed, and the input is reduce-scattered into the unit's gradient and freed.
// --overlap on, as FSDP2 does on its all-gather stream: the --prefetch all-gather makes
// the flat buffer, copies this rank's shards in and is posted; the copy-out into the
// gathered tensors, and the flat buffer's free, wait until the unit's own backward begins
// (FSDP2's wait_for_unshard and foreach_all_gather_copy_out).
// --overlap on, as FSDP2 does on its reduce-scatter stream: the reduce-scatter is posted
// and backward goes on; its input (and, adding onto the shard, its output) stays held,
// as FSDP2's reduce_scatter_state holds them, until the next unit's reduce begins (its
// wait comes before that unit's input is made) or, for the last, after the backward.
// --precision bf16 (ModelConfig::param_bf16): MixedPrecisionPolicy(param_dtype=bf16,
// reduce_dtype=fp32), measured with torch 2.15 (bench/torch_fsdp_mp.py). Shards, gradients
// and AdamW state stay fp32. A gather casts each tensor's padded shard to bf16 (its
// all_gather_input: param_cast, all of the unit's live together), makes the flat buffer in
// bf16 (2 B an element), copies the casts in and frees them, all-gathers bf16, and copies
// out into bf16 gathered tensors. Each tensor's full gradient is bf16; foreach_reduce's
// copy-in casts them into the fp32 flat input (reduce_dtype), reduce-scattered in fp32.
// --accumulate K --no-sync under bf16: fully_shard keeps the unsharded gradients across the
// micro-steps in reduce_dtype (torch 2.15, bench/torch_fsdp_mp.py --no-sync: each tensor's
// .grad fp32, unpadded, from the first micro-step to the last one's reduce-scatter). Each
// micro-step's backward makes fresh bf16 gradients (beta 0); when the unit's backward ends
// (end_unit_gradient) they are folded into the fp32 ones tensor by tensor: the first
// micro-step casts each into a new fp32 gradient (grad_unsharded, 4 B an element) and frees
// the bf16 one, later ones add it in place and free it. The last micro-step's copy-in reads
// the fp32 gradients. (torch 2.15 casts or adds each tensor's bf16 gradient as autograd's
// AccumulateGrad makes it, param.grad_dtype = fp32; we fold when the unit ends, as torch up
// to 2.9 did in post_backward: a unit's bf16 gradients live together until then.)
#pragma once

#include <vector>

#include "harness/model/adam_state.hpp"
#include "harness/strategies/unit_sharded.hpp"

namespace shardscope {

class Fsdp2Strategy : public UnitShardedStrategy {
 public:
  Fsdp2Strategy(const StrategyContext& ctx, bool full_shard);
  void setup() override;
  HostState gather_state() override;

 protected:
  void optimizer_step(int step) override;
  void gather(int unit) override;
  void prefetch(int unit) override;
  void reshard(int unit) override;
  void begin_unit_gradient(int unit) override;
  void end_unit_gradient(int unit) override;
  void reduce_unit(int unit) override;
  void reduce_gradients() override { finish_reduce(); }
  // Under bf16 with --no-sync every micro-step's bf16 gradients are fresh (folded into the
  // fp32 ones when the unit ends).
  float backward_beta(int k) const override { return accumulates_fp32() ? 0.0f : UnitShardedStrategy::backward_beta(k); }

 private:
  // BlockAccess
  const float* param(int block, int tensor) override;
  float* grad(int block, int tensor) override;

  // Unit u's tensors, in the order its flat buffers lay them out.
  const std::vector<int>& tensors_of(int unit) const { return unit_tensors_[unit]; }

  std::vector<std::vector<int>> unit_tensors_;
  std::vector<std::int64_t> unit_flat_;  // A_u: the unit's padded shards together
  struct TensorState {
    Dim0Shard shard;
    int unit = 0;
    std::int64_t offset = 0;  // in its unit's flat buffers (per rank's slot)
    Buffer param;             // (padded shard) param
    AdamState adam;           // (local rows) optim
    Buffer full;              // (W x padded) param_unsharded while gathered (bf16 under bf16)
    Buffer full_grad;         // (elems) grad_unsharded during the unit's backward (bf16 under bf16)
    Buffer accumulated;       // (elems) grad_unsharded fp32: bf16 under --no-sync, kept across micro-steps
  };
  std::vector<TensorState> tensors_;
  std::vector<Buffer> unit_grad_;  // (A_u) grad
  std::vector<bool> gathered_;
  // Copies a unit's gathered flat buffer out into its tensors' gathered buffers.
  void copy_out(int unit, const Buffer& flat);
  // A prefetch in flight (--overlap on), per unit: the flat buffer (W x A_u, comm) its
  // all-gather fills, and its ticket.
  struct Prefetching {
    CommTicket ticket;
    Buffer flat;
  };
  std::vector<Prefetching> prefetching_;
  bool bf16_ = false;  // --precision bf16: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
  // bf16 with --accumulate K --no-sync: gradients kept in fp32 across micro-steps.
  bool accumulates_fp32() const { return bf16_ && cfg_.no_sync && cfg_.accumulate > 1; }
  // foreach_all_gather's copy-in: the flat buffer (W x A_u, comm; bf16 under bf16, through
  // the casts of each tensor's shard) with this rank's padded shards in its slot.
  Buffer flat_with_own_shards(int unit);
  // All-gathers unit u's flat buffer in place (fp32 or bf16), or posts it.
  void all_gather_flat(int unit, Buffer& flat);
  CommTicket start_all_gather_flat(int unit, Buffer& flat);

  // The reduce-scatter in flight (--overlap on): FSDP2's reduce_scatter_state.
  struct Reducing {
    int unit = -1;
    CommTicket ticket;
    Buffer input;  // (W x A_u) comm
    Buffer out;    // (A_u) comm: the output when it adds onto the shard, else empty
  };
  Reducing reducing_;
  // Waits for the reduce-scatter in flight, if any, averages it into the unit's gradient
  // and frees its input and output.
  void finish_reduce();
};

}  // namespace shardscope
