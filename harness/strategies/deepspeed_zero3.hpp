// zero3 under --engine deepspeed: DeepSpeed's ZeRO stage 3 (DeepSpeedZeroOptimizer_Stage3,
// its parameter coordinator and partition_parameters.py), fp32 or bf16: the MLP
// (each Linear one module, a block) and GPT-2 and Llama (each nn.Module with parameters of its own one
// module: an embedding, a block's every Linear and norm, the final norm, the head; the
// blocks name them through BlockAccess's module hooks). docs/design.md, "DeepSpeed"; the layout: deepspeed_layout.hpp (Ds3Layout).
// DeepSpeed's configuration as taken here: stage3_prefetch_bucket_size 0 (no prefetch),
// stage3_max_reuse_distance 0 (a module's parameters are released after each use; at its
// default of 10^9 elements DeepSpeed keeps them from the forward to the backward once its
// trace is complete), stage3_param_persistence_threshold RunConfig::param_persistence
// (DeepSpeed's default 100,000), contiguous_gradients on, reduce_scatter off (each bucket
// all-reduced, as stages 1 and 2 here), overlap_comm off.
//
// At rest, per rank:
//   param  the flat partition (C elements; every tensor's ds_tensor a view of it), the
//          optimizer's copy of it (C), and the persistent tensors gathered: several by one
//          coalesced gather, each then a tensor of n_t; a lone one keeps its gather buffer
//          of W·c_t;
//   grad   the gradient partitions (C: grad_partitions_flat_buffer, made at init, kept);
//   optim  exp_avg and exp_avg_sq of the copy (2C) and one step (one sub-group);
//   comm   the ipg bucket (--bucket-mb; DeepSpeed makes it at init and keeps it).
// A step (each micro-step under --accumulate; stage 3 reduces in every one):
//   forward   a block gathers its tensors that are not persistent before it runs
//             (param_unsharded): one into a buffer of W·c_t it then views; several into a
//             flat comm buffer of W·Σc_t, each then copied into a tensor of n_t and the
//             flat buffer freed (one rank gathers nothing: a tensor views its partition,
//             as _no_gather_coalesced makes it); they are released after the block;
//   backward  when a block's backward begins its tensors are gathered again, then its
//             gradients made (grad_unsharded, Σ n_t); when it ends they are copied into the
//             bucket, last tensor first (the bucket reduced first when the next would not
//             fit), freed, and the gathered tensors released;
//   a bucket  is divided by W and all-reduced; each tensor's slice of the rank's partition
//             (c_t elements; where fewer are parameters, a zero tensor of c_t holds it,
//             category grad, every one of the bucket's kept until its end) is copied into
//             (the first micro-step) or added onto its gradient partition;
//   after backward  the last bucket is reduced;
//   --checkpoint a wrapped layer's re-run fires the Linear's forward hooks again (torch's
//             non-reentrant checkpoint; DeepSpeed's pre- and post-forward hooks): under
//             ReLU the block's output is the ReLU's, whose backward unpacks first, so the
//             re-run comes before the Linear's pre-backward hook: it gathers the layer,
//             runs, releases it, and the pre-backward hook gathers it again (then the
//             gradients); without ReLU the pre-backward hook (on the Linear's output) has
//             gathered it already, the re-run gathers nothing and its release partitions
//             it before the backward. Either way the re-run's saves keep the layer's
//             gathered storages (torch's recompute saves a detached view of each parameter
//             its op saves; LinearFunctionForZeroStage3, DeepSpeed's F.linear under stage
//             3, saves weight and bias in every layer) until the layer's backward has run:
//             its gathered buffers are held from the re-run's release to the backward's end;
// A transformer's modules (the blocks' module hooks, parameter_offload.py's hooks):
//   forward   a module's tensors that are not persistent are gathered before it makes its
//             output and released after it (the tied head gathers the embedding's table);
//   backward  gathered again when its backward begins, and each tensor's gradient made
//             (grad_unsharded, n_t, as autograd makes each parameter's .grad); when it is
//             done each gradient whose tensor has no use left in this backward is copied
//             into the bucket (last tensor first: the tied table's after the embedding's
//             backward, the head's part written into it before), freed, and the module
//             released, but for a module whose input takes no gradient (the embeddings: their
//             post-backward hook never fires), kept gathered until after the last bucket's
//             reduction (release_backward_leftovers);
//   --precision bf16 (DeepSpeed's bf16: the module cast to bf16, the MLP's bf16 Linears or
//             a transformer's bf16 module (gpt2_param_bf16.cpp), whose blocks call the same
//             module hooks; communication_data_type and grad_accum_dtype default to it):
//             the partitions, every gather, the gradients (a module's, as autograd makes
//             them in the parameter's dtype), the bucket (divided and all-reduced in
//             bf16), its zero tensors and the gradient partitions (added in bf16 under
//             --accumulate) are bf16, 2 B an element; the optimizer's copy is the fp32
//             master weights (category master), AdamW fp32; the step flattens the gradient
//             partitions in bf16, casts them to a new fp32 buffer (`.to(fp32)`) and frees
//             the bf16 one, and rounds the updated master weights into the partitions;
//   --checkpoint (GPT-2, Llama: torch's non-reentrant checkpoint per block) a wrapped
//             block's backward begins with its first-backward module's pre-backward hook
//             (mlp.c_proj, down_proj: gathered), then its re-run, every module's hooks
//             firing again: each gathered, run, released, but that module (the re-run stops
//             at its last save, inside it: no post-forward hook) and the storages its op's
//             saves keep (LinearFunctionForZeroStage3 saves weight and bias, a norm its
//             weight and bias; the re-run's saves are detached views), held to the module's
//             backward, whose pre-backward hook gathers it again beside them;
//   optimizer every gathered tensor is released (the persistent ones too), the gradient
//             partitions flattened into a new buffer (grad, C), AdamW on the copy, the
//             gradient freed, the copy written into the flat partition; then the
//             persistent tensors are gathered again.
#pragma once

#include <vector>

#include "harness/model/adam_state.hpp"
#include "harness/strategies/data_parallel.hpp"
#include "harness/strategies/deepspeed_layout.hpp"

namespace shardscope {

class DeepSpeedZero3 : public DataParallelStrategy, private BlockAccess {
 public:
  explicit DeepSpeedZero3(const StrategyContext& ctx);
  void setup() override;
  HostState gather_state() override;

 protected:
  BlockAccess& access() override { return *this; }
  void reduce_gradients() override;  // the epilogue: the last bucket
  void optimizer_step(int step) override;
  // Fresh gradients every micro-step: each reduction copies or adds them into the partitions.
  float backward_beta(int) const override { return 0.0f; }

 private:
  // BlockAccess
  const float* param(int block, int tensor) override;
  float* grad(int block, int tensor) override;
  void before_forward(int block) override;
  void after_forward(int block) override;
  void before_backward(int block) override;
  void after_backward(int block) override;
  void before_recompute(int block) override;
  void after_recompute(int block) override;
  // A wrapped block whose re-run comes before its Linear's pre-backward hook (its output
  // is its ReLU's).
  bool recompute_first(int block) const;
  void gather_for_backward(int block);
  void module_forward_begin(const std::vector<TensorRef>& tensors) override;
  void module_forward_end(const std::vector<TensorRef>& tensors) override;
  void module_backward_begin(const std::vector<TensorRef>& tensors) override;
  void module_backward_end(const std::vector<TensorRef>& tensors, bool input_requires_grad) override;

  // The model's tensor index of block b's tensor i; block b's tensors that are not persistent.
  int tensor_of(int block, int tensor) const { return model_->first_tensor(block) + tensor; }
  std::vector<int> gathered_tensors(int block) const;
  // A module's tensors (model indices) that are not persistent and not gathered now.
  std::vector<int> to_gather(const std::vector<TensorRef>& tensors) const;
  std::vector<int> not_persistent(const std::vector<TensorRef>& tensors) const;
  int tensor_of(const TensorRef& r) const { return tensor_of(r.block, r.tensor); }
  // Element `elem` of a buffer of the partitions' dtype (lp_), as the float* the model and
  // the copies pass around (a bf16 one read back with as_bf16); copies and sums of n.
  float* at(const Buffer& b, std::int64_t elem) const;
  void copy_lp(float* dst, const float* src, std::size_t n);
  void add_lp(float* dst, const float* src, std::size_t n);
  // Gathers `tensors` (their partitions) into gathered_, in category `c`; releases them.
  void gather(const std::vector<int>& tensors, Category c);
  void release(const std::vector<int>& tensors);
  void add_to_bucket(int tensor, const float* src);
  void reduce_bucket();

  Ds3Layout layout_;
  std::int64_t bucket_cap_ = 0;
  // The dtype of the partitions, gathers, gradients, bucket and gradient partitions: fp32,
  // or bf16 under --precision bf16 (the master weights and AdamW fp32).
  DType lp_ = DType::f32;
  std::vector<int> persistent_;  // the persistent tensors, in order

  Buffer flat_;       // (C) param: every tensor's partition
  Buffer master_;     // (C) param (bf16: master): the optimizer's fp32 copy
  AdamState adam_;    // (C) optim
  Buffer grad_parts_;  // (C) grad: the gradient partitions
  Buffer bucket_;     // (cap) comm
  std::vector<Buffer> gathered_;    // per tensor: its gathered values (n_t, or a gather buffer of W·c_t)
  std::vector<float*> view_;  // per tensor: where its values are while gathered (null: released)
  std::vector<Buffer> block_grad_;  // per block: its tensors' gradients during its backward
  std::vector<std::pair<int, std::int64_t>> in_bucket_;  // (tensor, offset in the bucket)
  std::int64_t bucket_used_ = 0;
  std::vector<float> last_grad_;  // the last step's averaged gradient partitions (host, untracked)
  // A transformer's modules (modules_): each tensor's gradient while its backward runs
  // (grad_unsharded, n_t), its uses in this micro-step's forward not yet met by a backward,
  // and the modules kept gathered to the backward's end.
  bool modules_ = false;
  std::vector<Buffer> tensor_grad_;
  std::vector<int> uses_;
  std::vector<int> leftovers_;
  // --checkpoint: a wrapped block's re-run under way (a transformer's), its first-backward
  // module (gathered before it), and per tensor the gathered storage a re-run's saves keep
  // to its module's (the MLP's: its layer's) backward.
  bool rerunning_ = false;
  std::vector<TensorRef> rerun_entry_;
  std::vector<Buffer> rerun_kept_;
};

}  // namespace shardscope
