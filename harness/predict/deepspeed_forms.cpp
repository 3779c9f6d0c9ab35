// Closed forms of DeepSpeed's ZeRO stages (deepspeed_forms.hpp; docs/formulas.md, "DeepSpeed").
#include "harness/predict/deepspeed_forms.hpp"

#include <algorithm>
#include <string>

#include "harness/predict/gpt2_forms.hpp"
#include "harness/predict/llama_forms.hpp"
#include "harness/predict/param_bf16_forms.hpp"
#include "harness/predict/transformer_step.hpp"
#include "harness/strategies/deepspeed_layout.hpp"
#include "harness/strategies/partition.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

// DeepSpeed's default: stage 3's optimizer groups hold this many elements (sub_group_size).
constexpr i64 kSubGroupSize = 1'000'000'000;

using Best = DeepSpeedPeak;

CategoryBytes bytes_of(i64 temp, i64 act, i64 grad_unsharded, i64 comm, i64 grad) {
  CategoryBytes b;
  b[Category::temp] = temp;
  b[Category::activation] = act;
  b[Category::grad_unsharded] = grad_unsharded;
  b[Category::comm] = comm;
  b[Category::grad] = grad;
  return b;
}

CategoryBytes operator+(CategoryBytes a, const CategoryBytes& b) {
  for (int c = 0; c < kCategoryCount; ++c) a.bytes[c] += b.bytes[c];
  return a;
}

// The MLP's forward and backward (data_parallel_forms.cpp's walk, no gathered units): `held`
// beside every instant (what a micro-step after the first holds from its start: stage 1's
// autograd 4P and bucket, stage 2's accumulated gradient); from the backward's first block
// on the bucket Bk and stage 2's G, and stage 1's autograd 4P (unless held already), stage
// 2's each layer's own gradients during its backward.
// --checkpoint (torch's non-reentrant checkpoint per layer, as the torch engine's walk): a
// wrapped layer's forward is the same but for the last layer's own save of its ReLU output
// (k); its backward frees its forward's output, so it holds j outputs when its gradients
// are made (the engine's hook, before the re-run), then the re-run output a ('recompute of
// block j': activation under ReLU, which saves it, else temp, freed at once), then dx.
void mlp_walk(const ModelConfig& m, int stage, i64 Bk, i64 G, const CategoryBytes& held, Best& best) {
  const int L = m.layers;
  const CheckpointPolicy& ck = m.checkpoint;
  const bool relu = m.activation == Activation::relu;
  const i64 a = m.activation_bytes(m.batch), X = a, t = m.loss == Loss::mse ? a : 0;
  const i64 k = ((relu && !ck.wraps(L - 1)) || m.loss == Loss::mse) ? 1 : 0;
  auto where = [&](int layer) { return "unit " + std::to_string(stage == 1 ? 0 : layer); };
  auto consider = [&](const CategoryBytes& b, Phase ph, const std::string& at) { best.consider(b + held, ph, at); };
  for (int i = 0; i < L; ++i) {
    const i64 unsaved = (i == L - 1 && k == 0) ? a : 0;
    consider(bytes_of(X + t + unsaved, (i + 1) * a - unsaved, 0, 0, 0), Phase::forward, where(i));
  }
  const i64 last_unsaved = k == 0 ? a : 0;
  consider(bytes_of(X + t + last_unsaved + 4, (L - 1 + k) * a, 0, 0, 0), Phase::forward, where(L - 1));
  consider(bytes_of(X + t + a, (L - 1 + k) * a, 0, 0, 0), Phase::backward, where(L - 1));
  const bool stage1_held = stage == 1 && held[Category::grad_unsharded] > 0;
  const i64 grads = stage1_held ? 0 : stage == 1 ? 4 * m.params() : 4 * m.layer_elems();
  const i64 bucket = stage1_held ? 0 : Bk;
  for (int j = L - 1; j >= 0; --j) {
    const bool wrapped = ck.wraps(j);
    const i64 outs = wrapped ? j : j == L - 1 ? L - 1 + k : j + 1;
    consider(bytes_of(X + t + a, outs * a, grads, bucket, G), Phase::backward, where(j));
    // The re-run output: saved by ReLU (activation), else freed at once (temp).
    const i64 rerun_act = wrapped && relu ? a : 0;
    if (wrapped)
      consider(bytes_of(X + t + a + (relu ? 0 : a), outs * a + rerun_act, grads, bucket, G), Phase::backward,
               "recompute of block " + std::to_string(j));
    if (j > 0) consider(bytes_of(X + t + 2 * a, outs * a + rerun_act, grads, bucket, G), Phase::backward, where(j));  // dx
  }
}

// A transformer's: the torch engine's walk (transformer_step.hpp) over units holding nothing
// gathered; the root unit's full gradient carries the bucket (and stage 2's G), moved to
// their categories after. `later`: a micro-step after the first, whose instants are the
// first's with stage 1's root gradient (autograd's 4P and the bucket) held from its start,
// or stage 2's accumulated gradient G beside each (the walk's first maximum moves by a
// constant: the same instant).
void transformer_walk(const RunConfig& cfg, int world, int stage, i64 Bk, i64 G, bool later, Best& best) {
  const ModelConfig& m = cfg.model;
  const std::vector<Unit> units = fsdp_units(m, stage == 1 ? 0 : 1, world);
  StepUnits su;
  for (const Unit& u : units) {
    su.bytes.push_back(0);
    su.grad_bytes.push_back(4 * u.elems);
    su.top_block.push_back(u.last_block - 1);
  }
  su.grad_bytes[0] += Bk + G;
  if (later && stage == 1) su.micro = {MicroStep{true, false}};
  const TransformerShape& t = m.transformer;
  StepTransient step = m.name == "gpt2" ? gpt2_step_transient(t, m.batch, su, m.checkpoint)
                                        : llama_step_transient(t, m.batch, su, m.checkpoint);
  if (step.bytes[Category::grad_unsharded] > 0) {
    step.bytes[Category::grad_unsharded] -= Bk + G;
    step.bytes[Category::comm] += Bk;
    step.bytes[Category::grad] += G;
  }
  if (later && stage == 2) step.bytes[Category::grad] += G;
  best.consider(step.bytes, step.phase, step.where);
}

// DeepSpeed's bf16 after the backward and at rest, stages 0, 1 and 2 (the forward and backward
// are each model's walk). Stages 1 and 2: the reduction's instants (stage 1 makes G2 at its
// first copy; the padding beside the bucket, autograd's 2P for stage 1 and, after a first
// micro-step, stage 2's accumulated G2) and the optimizer's (the bf16 flattened partition 2s
// and its fp32 cast 4s beside G2 and pad2); resting the bf16 group 2·Ppad, the master 4s,
// AdamW 8s + 4; 2P all-reduced (stage 1 once, stage 2 every micro-step), 2·Ppad all-gathered.
// Stage 0 (deepspeed_stage0.hpp, FP16_Optimizer in bf16), beside autograd's 2P: each
// bucket's flat bf16 copy 2·n_b (comm; the largest is the instant), the overflow check's fp32
// copy of one gradient 4·n_t (temp; below the next instant), every gradient's fp32 cast 4P
// (temp) beside the master's new gradient 4P (grad); resting the bf16 group 2P, the master
// 4P, AdamW 8P + 4 (the ZeRO paper's baseline: 16P + 4 with the gradients); 2P all-reduced
// once, nothing all-gathered.
void bf16_tail(const RunConfig& cfg, int stage, const DsPartition& part, Best& best, Prediction& p) {
  const i64 P = part.elems, Ppad = part.padded, s = part.size;
  const std::vector<i64> tensors = model_tensor_elems(cfg.model);
  if (stage == 0) {
    i64 bucket = 0, largest = 0;
    for (const DsStage0Bucket& b : ds_stage0_buckets(tensors, cfg.bucket_mb)) bucket = std::max(bucket, b.elems);
    for (i64 n : tensors) largest = std::max(largest, n);
    best.consider(bytes_of(0, 0, 2 * P, 2 * bucket, 0), Phase::communication, "-");
    best.consider(bytes_of(4 * largest, 0, 2 * P, 0, 0), Phase::optimizer, "-");
    best.consider(bytes_of(4 * P, 0, 2 * P, 0, 4 * P), Phase::optimizer, "-");
    p.resting[Category::param] = 2 * P;
    p.resting[Category::master] = 4 * P;
    p.resting[Category::optim] = 8 * P + 4;
    p.model_states = p.resting.total() + 2 * P;
    p.comm_bytes[static_cast<int>(CollKind::all_reduce)] = 2 * P;
    return;
  }
  const i64 Bk2 = 2 * ds_bucket_elems(cfg.bucket_mb, tensors);
  const i64 G2 = 2 * part.touching, pad2 = 2 * part.pad();
  const i64 autograd = stage == 1 ? 2 * P : 0;
  const i64 G_acc = stage == 2 && cfg.accumulate > 1 ? G2 : 0;
  if (stage == 1 && G2 > 0) best.consider(bytes_of(0, 0, autograd, Bk2, G2), Phase::communication, "-");
  if (pad2 > 0) best.consider(bytes_of(0, 0, autograd, Bk2, G_acc + G2 + pad2), Phase::communication, "-");
  best.consider(bytes_of(0, 0, 0, 0, G2 + pad2 + 2 * s + 4 * s), Phase::optimizer, "-");
  p.resting[Category::param] = 2 * Ppad;
  p.resting[Category::master] = 4 * s;
  p.resting[Category::optim] = 8 * s + 4;
  p.model_states = p.resting.total() + (stage == 1 ? 2 * P : 2 * s);
  p.comm_bytes[static_cast<int>(CollKind::all_reduce)] = 2 * P * (stage == 1 ? 1 : cfg.accumulate);
  p.comm_bytes[static_cast<int>(CollKind::all_gather)] = 2 * Ppad;
}

// Stages 1 and 2 of the MLP under --precision bf16 (deepspeed.hpp): the bf16 Linears'
// activations (mlp_fsdp_bf16_forms.hpp's: a2 = 2Bw a bf16 activation, a4 = 4Bw the fp32
// batch X, mse's fp32 target t and its fp32 temporaries; the batch's bf16 cast a2 made by
// layer 0), beside DeepSpeed's bf16 buffers: Bk2 = 2c the bucket, G2 = 2 × the tensors
// touching the partition, pad2 its bf16 padding; stage 1's autograd gradients 2P from the
// backward's first block, stage 2's each layer's 2(w² + w) during its backward (with Bk2 and
// G2 from the first). After the backward the reduction's instants (as fp32's, in bf16
// bytes); the optimizer's: the bf16 flattened partition (2s) and its fp32 cast (4s) beside
// G2 and pad2. Resting: the bf16 group 2·Ppad (param), the master weights 4s (master),
// AdamW 8s + 4; traffic 2P all-reduced (stage 1 once, stage 2 every micro-step) and 2·Ppad
// all-gathered, in bf16.
// --checkpoint: a wrapped layer holds j outputs when its backward starts, its re-run's
// output a2 ('recompute of block j', activation under ReLU, else temp freed at once); a
// wrapped layer 0 drops the batch's cast after its forward (its checkpoint saves the fp32
// batch, a4) and its re-run makes it again, held to its backward.
// --accumulate K (grad_accum_dtype the parameters' bf16): a later micro-step holds stage
// 1's autograd 2P and Bk2 from its start (its Linears add onto them: the weight's in its
// GEMM, the bias's made in a temp of 2w and added), or stage 2's accumulated G2 beside
// every instant; the boundary's padding instant holds stage 2's two G2.
std::vector<Prediction> bf16_mlp_ranks(const RunConfig& cfg, int world, int stage,
                                       const std::vector<DsPartition>& parts) {
  const ModelConfig& m = cfg.model;
  const int L = m.layers, K = cfg.accumulate;
  const CheckpointPolicy& ck = m.checkpoint;
  const bool relu = m.activation == Activation::relu;
  const i64 P = parts[0].elems;
  const i64 a2 = 2 * static_cast<i64>(m.batch) * m.width, a4 = 2 * a2;
  const i64 mse = m.loss == Loss::mse ? 1 : 0;
  const i64 k = ((relu && !ck.wraps(L - 1)) || mse == 1) ? 1 : 0;
  const i64 X = a4, t = mse * a4;
  // The ipg bucket from the backward's first block (stage 0 has none: it flattens its buckets
  // after the backward).
  const i64 Bk2 = stage == 0 ? 0 : 2 * ds_bucket_elems(cfg.bucket_mb, model_tensor_elems(cfg.model));
  const i64 bias_temp = 2 * static_cast<i64>(m.width);
  // The batch's cast while no re-run of layer 0 has made it again: 0 when layer 0 is wrapped.
  const i64 cast = ck.wraps(0) ? 0 : a2;
  auto outputs = [&](int j) { return static_cast<i64>(ck.wraps(j) ? j : j == L - 1 ? L - 1 + k : j + 1); };
  auto unit = [&](int layer) { return "unit " + std::to_string(stage <= 1 ? 0 : layer); };
  std::vector<Prediction> ranks(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const i64 G2 = stage == 0 ? 0 : 2 * parts[r].touching;
    Best best;
    for (int micro = 0; micro < (K > 1 ? 2 : 1); ++micro) {
      const bool later = micro > 0;
      const CategoryBytes held = !later ? CategoryBytes{} : stage <= 1 ? bytes_of(0, 0, 2 * P, Bk2, 0)
                                                                        : bytes_of(0, 0, 0, 0, G2);
      auto at = [&](i64 temp, i64 act, i64 gu, i64 comm, i64 grad, Phase ph, const std::string& where) {
        best.consider(bytes_of(temp, act, gu, comm, grad) + held, ph, where);
      };
      for (int i = 0; i < L; ++i) {
        const bool saved = i < L - 1 || k == 1;
        at(X + t + (saved ? 0 : a2), (i == 0 ? a2 : cast) + i * a2 + (saved ? a2 : 0), 0, 0, 0, Phase::forward,
           unit(i));
      }
      const i64 saved_outputs = cast + (L - 1 + k) * a2;
      at(X + t + 4 + (mse ? a4 : (k ? 0 : a2)), saved_outputs, 0, 0, 0, Phase::forward, unit(L - 1));
      at(X + t + (mse ? 2 * a4 : a2), saved_outputs, 0, 0, 0, Phase::backward, "layer " + std::to_string(L - 1));
      const i64 dy = X + t + a2;
      // What this micro-step's backward makes: stages 0 and 1's autograd gradients and stage
      // 1's bucket (the first micro-step's), stage 2's layer gradients, bucket and
      // grads_in_partition.
      const i64 grads = stage <= 1 ? (later ? 0 : 2 * P) : 2 * m.layer_elems();
      const i64 bucket = stage <= 1 && later ? 0 : Bk2;
      const i64 G_new = stage == 2 ? G2 : 0;
      for (int j = L - 1; j >= 0; --j) {
        const bool wrapped = ck.wraps(j);
        const i64 acts = cast + outputs(j) * a2;
        if (stage == 2 || j == L - 1) at(dy, acts, grads, bucket, G_new, Phase::backward, unit(j));
        // The re-run: layer 0 casts the batch again (held to its backward), then its output.
        const i64 rerun_cast = wrapped && j == 0 ? a2 : 0;
        const i64 rerun_kept = wrapped && relu ? a2 : 0;
        if (wrapped)
          at(dy + (relu ? 0 : a2), acts + rerun_cast + rerun_kept, grads, bucket, G_new, Phase::backward,
             "recompute of block " + std::to_string(j));
        const i64 after = acts + rerun_cast + rerun_kept;
        if (stage <= 1 && later) at(dy + bias_temp, after, grads, bucket, G_new, Phase::backward, unit(j));
        if (j > 0) at(dy + a2, after, grads, bucket, G_new, Phase::backward, unit(j));
      }
    }
    Prediction& p = ranks[r];
    bf16_tail(cfg, stage, parts[r], best, p);
    p.peak_known = true;
    p.peak_by_category = p.resting;
    for (int c = 0; c < kCategoryCount; ++c) p.peak_by_category.bytes[c] += best.bytes.bytes[c];
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = best.phase;
    p.peak_where = best.where;
    p.saved_after_forward_tensors = static_cast<int>(L + k + mse);
    // Layer 0's save: the bf16 cast of the batch, or under its checkpoint the fp32 batch.
    p.saved_after_forward_bytes = (ck.wraps(0) ? a4 : a2) + (L - 1 + k) * a2 + mse * a4;
  }
  return ranks;
}

// Stages 0, 1 and 2 of GPT-2 and Llama under --precision bf16: the family's bf16 module
// (param_bf16_forms.hpp) on the bf16 flat group's views, its activations the transformer walk's
// with the bf16 blocks over units holding nothing gathered, autograd's bf16 gradients 2·elems a
// unit (stages 0 and 1 one root unit of 2P, from the backward's first block; stage 2 each
// block's during its backward), the root's full gradient carrying stage 1's and 2's bf16 bucket
// Bk2 and stage 2's G2 (moved to their categories after, as fp32's transformer_walk); then the
// reduction's and the optimizer's instants (bf16_tail).
// --checkpoint full|every:K: the bf16 blocks' walk under the policy (a wrapped block saves its
// bf16 input alone and re-runs at the start of its backward: param_bf16_blocks).
// --accumulate K (grad_accum_dtype the parameters' bf16; the module adds each later
// micro-step's gradient onto the bf16 one in place, each sum rounded, no temporary): a later
// micro-step's walk holds stage 0's autograd 2P, stage 1's and Bk2 from its start (MicroStep's
// grads_held: reduced at the boundary alone), or stage 2's accumulated G2 beside every
// instant (its backward makes a new G2); the boundary's padding instant holds stage 2's two
// G2; stage 2 all-reduces 2P every micro-step.
std::vector<Prediction> bf16_transformer_ranks(const RunConfig& cfg, int world, int stage,
                                        const std::vector<DsPartition>& parts) {
  const ModelConfig& m = cfg.model;
  const int K = cfg.accumulate;
  // The ipg bucket from the backward's first block (stage 0 has none).
  const i64 Bk2 = stage == 0 ? 0 : 2 * ds_bucket_elems(cfg.bucket_mb, model_tensor_elems(cfg.model));
  const SavedForm saved = param_bf16_saved_after_forward(m, m.checkpoint);
  const StepBlocks blocks = param_bf16_blocks(m, m.checkpoint);
  const std::vector<Unit> units = fsdp_units(m, stage <= 1 ? 0 : 1, world);
  std::vector<Prediction> ranks(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const i64 G2 = 2 * parts[r].touching;
    const i64 G_early = stage == 2 ? G2 : 0;
    Best best;
    for (int micro = 0; micro < (K > 1 ? 2 : 1); ++micro) {
      const bool later = micro > 0;
      StepUnits su;
      for (const Unit& u : units) {
        su.bytes.push_back(0);
        su.grad_bytes.push_back(2 * u.elems);
        su.top_block.push_back(u.last_block - 1);
      }
      su.grad_bytes[0] += Bk2 + G_early;
      if (later && stage <= 1) su.micro = {MicroStep{true, false}};
      StepTransient step = transformer_step_transient(blocks, su);
      if (step.bytes[Category::grad_unsharded] > 0) {
        step.bytes[Category::grad_unsharded] -= Bk2 + G_early;
        step.bytes[Category::comm] += Bk2;
        step.bytes[Category::grad] += G_early;
      }
      if (later && stage == 2) step.bytes[Category::grad] += G2;
      best.consider(step.bytes, step.phase, step.where);
    }
    Prediction& p = ranks[r];
    bf16_tail(cfg, stage, parts[r], best, p);
    p.peak_known = true;
    p.peak_by_category = p.resting;
    for (int c = 0; c < kCategoryCount; ++c) p.peak_by_category.bytes[c] += best.bytes.bytes[c];
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = best.phase;
    p.peak_where = best.where;
    p.saved_after_forward_bytes = saved.bytes;
    p.saved_after_forward_tensors = saved.tensors;
  }
  return ranks;
}

}  // namespace

std::vector<Prediction> predict_deepspeed_ranks(const RunConfig& cfg, int world) {
  const ModelConfig& m = cfg.model;
  const std::vector<i64> tensors = model_tensor_elems(m);
  // Bytes an element of the model's parameters and gradients: fp32's 4 or bf16's 2 (the
  // optimizer's copy of the partition and AdamW's state are fp32 under both).
  const i64 lp = cfg.precision == PrecisionKind::bf16 ? 2 : 4;
  refuse_deepspeed_no_sync(cfg);  // a plan's zero2/zero3 under --no-sync: skipped with the reason
  // Stage 3 runs the MLP, GPT-2 and Llama in fp32 and bf16, with every --checkpoint policy
  // (the bf16 modules' attention recompute too: the core has no module, no hook fires in it).
  if (cfg.strategy == StrategyKind::zero3)
    return m.is_transformer() ? predict_deepspeed_stage3_transformer(cfg, world) : predict_deepspeed_stage3_mlp(cfg, world);
  const std::vector<DsPartition> parts = ds_partitions(tensors, world);
  const i64 P = parts[0].elems, Ppad = parts[0].padded, s = parts[0].size;
  // ddp is the engine's stage 0 (bf16 only; the ZeRO paper's baseline), run for every model.
  if (cfg.strategy == StrategyKind::ddp)
    return m.is_transformer() ? bf16_transformer_ranks(cfg, world, 0, parts) : bf16_mlp_ranks(cfg, world, 0, parts);
  const int stage = cfg.strategy == StrategyKind::zero1 ? 1 : 2;
  // The ZeRO paper's accounting adds the gradients the stage keeps during a step: stage 1
  // autograd's full ones, stage 2 the partition's.
  const i64 kept_grads = stage == 1 ? lp * P : lp * s;
  // bf16 runs the MLP's stages 1 and 2 (--checkpoint and --accumulate too), GPT-2's and Llama's.
  if (lp != 4 && !m.is_transformer()) return bf16_mlp_ranks(cfg, world, stage, parts);
  if (lp != 4) return bf16_transformer_ranks(cfg, world, stage, parts);
  const i64 Bk = 4 * ds_bucket_elems(cfg.bucket_mb, model_tensor_elems(cfg.model));
  const i64 K = cfg.accumulate;
  SavedForm saved;
  if (m.is_transformer()) {
    saved = m.name == "gpt2" ? gpt2_saved_after_forward(m.transformer, m.batch, m.checkpoint)
                             : llama_saved_after_forward(m.transformer, m.batch, m.checkpoint);
  } else {
    // The last layer's ReLU output is saved unless that layer is wrapped (mse saves it too).
    const bool relu_saves = m.activation == Activation::relu && !m.checkpoint.wraps(m.layers - 1);
    const int k = (relu_saves || m.loss == Loss::mse) ? 1 : 0;
    saved.tensors = m.layers + k + (m.loss == Loss::mse ? 1 : 0);
    saved.bytes = saved.tensors * m.activation_bytes(m.batch);
  }
  std::vector<Prediction> ranks(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const DsPartition& part = parts[r];
    const i64 G = 4 * part.touching, pad = 4 * part.pad();
    Prediction& p = ranks[r];
    p.resting[Category::param] = 4 * Ppad + 4 * s;
    p.resting[Category::optim] = 8 * s + 4;
    p.model_states = p.resting.total() + kept_grads;
    // The buckets' all-reduce at every reduction (stage 1: the boundary's alone; stage 2:
    // every micro-step's), the group's all-gather after the optimizer (the step multiplies
    // nothing: deepspeed_forms.hpp).
    p.comm_bytes[static_cast<int>(CollKind::all_reduce)] = 4 * P * (stage == 1 ? 1 : K);
    p.comm_bytes[static_cast<int>(CollKind::all_gather)] = 4 * Ppad;
    // Forward and backward; stage 2 makes grads_in_partition with the bucket. A later
    // micro-step holds from its start stage 1's autograd gradients and bucket, or stage 2's
    // accumulated gradient (the first micro-step's grads_in_partition).
    Best best;
    const i64 G_early = stage == 2 ? G : 0;
    const i64 autograd = stage == 1 ? 4 * P : 0;
    for (int micro = 0; micro < (K > 1 ? 2 : 1); ++micro) {
      const bool later = micro > 0;
      if (m.is_transformer()) {
        transformer_walk(cfg, world, stage, Bk, G_early, later, best);
      } else {
        const CategoryBytes held = !later ? CategoryBytes{} : stage == 1 ? bytes_of(0, 0, autograd, Bk, 0)
                                                                          : bytes_of(0, 0, 0, 0, G);
        mlp_walk(m, stage, Bk, G_early, held, best);
      }
    }
    // The boundary's reduction after the backward: stage 1 makes grads_in_partition at its
    // first copy, then (both) the padding beside the bucket (and stage 1's gradients, and
    // after a first micro-step stage 2's accumulated gradient beside the new one).
    const i64 G_acc = stage == 2 && K > 1 ? G : 0;
    if (stage == 1 && G > 0) best.consider(bytes_of(0, 0, autograd, Bk, G), Phase::communication, "-");
    if (pad > 0) best.consider(bytes_of(0, 0, autograd, Bk, G_acc + G + pad), Phase::communication, "-");
    // The optimizer: the flattened partition gradient beside grads_in_partition and padding.
    best.consider(bytes_of(0, 0, 0, 0, G + pad + 4 * s), Phase::optimizer, "-");
    p.peak_known = true;
    p.peak_by_category = p.resting;
    for (int c = 0; c < kCategoryCount; ++c) p.peak_by_category.bytes[c] += best.bytes.bytes[c];
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = best.phase;
    p.peak_where = best.where;
    p.saved_after_forward_bytes = saved.bytes;
    p.saved_after_forward_tensors = saved.tensors;
  }
  return ranks;
}

}  // namespace shardscope
