// One block of a model: the unit strategies shard (FSDP units are K blocks), pipelines
// place (a stage holds a contiguous range of blocks) and the engine runs forward and
// backward through. A model is an ordered sequence of blocks plus its loss (model.hpp).
//
// A block says which parameter tensors it has (names and torch shapes, in torch's
// order), and runs its forward and backward on any Backend: it allocates what it makes
// with the category docs/design.md §1 gives it, and records in the SavedTensors instrument what
// torch's autograd would save for backward, releasing it as backward consumes it.
// Activations are (rows, features) fp32, row-major.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/model/saved_tensors.hpp"
#include "shardscope/backend.hpp"
#include "shardscope/comm.hpp"

namespace shardscope {

// One parameter tensor of a block.
struct ParamSpec {
  std::string name;                 // torch's name: "weight", "bias" (the MLP); "transformer.h.0.ln_1.weight"
  std::vector<std::int64_t> shape;  // torch's shape: a Linear weight is (out, in)
  float init_bound = 0.0f;          // initialised init_center + uniform in [-init_bound, init_bound)
  float init_center = 0.0f;         // 1 for a LayerNorm's weight (torch's ones)
  // A tensor-parallel shard (docs/design.md, "Tensor parallelism"): `shape` is the
  // shard's, and its element k is element shard_first + (k / shard_cols) * full_cols +
  // k % shard_cols of the whole tensor (rows of full_cols elements), so a shard starts
  // as the same elements of the one-rank model. full_cols 0: the whole tensor.
  std::int64_t full_cols = 0;
  std::int64_t shard_first = 0;
  std::int64_t shard_cols = 0;

  std::int64_t elems() const;
  // The whole tensor's element that the shard's element k is.
  std::int64_t full_index(std::int64_t k) const {
    return full_cols == 0 ? k : shard_first + (k / shard_cols) * full_cols + k % shard_cols;
  }
};

// A rank's place in its tensor-parallel group: `size` ranks split each parallel Linear,
// this one holds slice `rank` (size 1: the whole model).
struct TensorParallel {
  int size = 1;
  int rank = 0;
  // Sequence parallelism (--sp, size > 1): outside the parallel Linears a block's input and
  // output are the rank's N/T tokens (transformer_parts.hpp, "Sequence parallelism").
  bool sequence = false;
};

// A parameter tensor named by its block and its index in that block's params().
struct TensorRef {
  int block = -1;  // -1: none
  int tensor = -1;
};

// How a block reaches its parameters and gradient slots: tensor t of block b, in the
// block's params() order. Strategies that gather parameters (ZeRO-2/3) do it in the
// hooks, which the model calls around each block, before the pointers are asked for.
class BlockAccess {
 public:
  virtual ~BlockAccess() = default;
  virtual const float* param(int block, int tensor) = 0;
  virtual float* grad(int block, int tensor) = 0;
  virtual void before_forward(int /*block*/) {}
  virtual void after_forward(int /*block*/) {}
  virtual void before_backward(int /*block*/) {}
  virtual void after_backward(int /*block*/) {}
  // Around a checkpointed block's re-run in its backward (after before_backward): its
  // module hooks fire again, as DeepSpeed's stage 3 gathers and releases on them.
  virtual void before_recompute(int /*block*/) {}
  virtual void after_recompute(int /*block*/) {}
  // A module's use: DeepSpeed's stage 3 gathers each nn.Module with parameters of its own
  // on its own (a transformer block's every Linear and norm, an embedding, the head), in
  // its pre-forward hook and again in its pre-backward hook, and releases it after. A
  // transformer's blocks name the module's tensors (a tied head names the embedding's)
  // around each use: forward's begin before the module allocates its output, end after
  // it; backward's begin before its input gradient is allocated, end once its backward
  // is done (its saves released), the gradients of its tensors written in between.
  // `input_requires_grad` false (an embedding's token ids): DeepSpeed's post-backward hook
  // never fires, so the module stays gathered until the backward ends. No-ops elsewhere.
  virtual void module_forward_begin(const std::vector<TensorRef>& /*tensors*/) {}
  virtual void module_forward_end(const std::vector<TensorRef>& /*tensors*/) {}
  virtual void module_backward_begin(const std::vector<TensorRef>& /*tensors*/) {}
  virtual void module_backward_end(const std::vector<TensorRef>& /*tensors*/, bool /*input_requires_grad*/) {}
  // Whether the floating input is cast to bf16 before the model's first module runs, as
  // FSDP's root does under MixedPrecision (cast_root_forward_inputs): a checkpoint around the
  // first block then saves that cast (BlockTape::saved_input). Elsewhere a bf16 first layer
  // casts the batch inside itself (DeepSpeed's bf16: a checkpoint saves the fp32 batch).
  virtual bool casts_input_at_root() const { return false; }
};

// Block `block`'s tensors `tensors` (indices in its params(); a negative one, a bias the
// shape lacks, is left out): the module a BlockAccess hook names.
std::vector<TensorRef> module_tensors(int block, std::initializer_list<int> tensors);

// Which rows of which batch: rows [row_begin, row_begin + rows) of the batch that
// `rank` draws at `step` (seeded by `seed`). The same rows are the same values
// whichever slice asks for them (a pipeline's micro-batches, a test's reference).
struct DataSlice {
  std::uint64_t seed = 0;
  int step = 0;
  int rank = 0;
  int row_begin = 0;
  int rows = 0;
};

// What a block's forward and backward run with: the backend, the instrument, the
// parameters, and which block of the model it is.
struct BlockCall {
  Backend& backend;
  SavedTensors& saved;
  BlockAccess& access;
  int index = 0;  // the block's position in the model
  int rows = 0;
  Communicator* tp = nullptr;  // the tensor-parallel group (null: none, a world of one)
};

// What one block keeps from its forward for its backward, besides its input and its
// output (the model's tape holds those): buffers it allocated and saved, and, between
// the zero-bubble halves, what the weight half needs (the gradients at its weights).
struct BlockTape {
  std::vector<Buffer> held;
  // The block's input as made for it before it runs, when the model does not hold it: under
  // FSDP's bf16 the MLP's first layer casts the fp32 batch as FSDP's root does
  // (BlockAccess::casts_input_at_root), which a checkpoint around the layer saves and its
  // re-run reads (empty: the input the model passed is the one saved).
  Buffer saved_input;
};

// --autocast-region step: one autocast region around a pipeline stage's whole schedule
// step, so autocast's cast cache makes each parameter's bf16 cast once, in the first
// forward that reads it, and every later forward reuses it; the cache holds it through
// every backward (autograd's saved references end with each micro-batch's B, the cache's
// do not) until the region exits when the stage's actions end (clear()).
class StepCasts {
 public:
  // fp32 `param`'s bf16 cast (`elems`, param_cast): made on the step's first call, the
  // same storage after. The Buffer returned borrows it (its reset frees nothing).
  Buffer cast(Backend& backend, const float* param, std::int64_t elems);
  void clear() { casts_.clear(); }

 private:
  std::unordered_map<const float*, Buffer> casts_;
};

class Block {
 public:
  virtual ~Block() = default;
  // --autocast-region step: the stage's cast cache, which a block that casts its
  // parameters under autocast takes its casts from (null, the default: each micro-batch's
  // forward its own region, its own casts).
  virtual void use_step_casts(std::shared_ptr<StepCasts> /*casts*/) {}

  // Names the block in profiler ranges ("forward layer 3") and messages.
  virtual std::string name() const = 0;
  virtual const std::vector<ParamSpec>& params() const = 0;
  // Elements of the block's input and output for `rows` rows (rows times the
  // features of one row: what a pipeline stage sends and receives at a boundary).
  virtual std::int64_t input_elems(int rows) const = 0;
  virtual std::int64_t output_elems(int rows) const = 0;
  // The dtype of its output, and so of what a pipeline stage sends after it (and of the
  // gradient it receives back): bf16 for the MLP's Linear under autocast, whose GEMM and
  // ReLU give bf16; fp32 everywhere else (a transformer's residual stream stays fp32).
  virtual DType output_dtype() const { return DType::f32; }
  // Whether autograd saves the block's input (its first op does: a Linear does) and
  // its output (its last op does: ReLU does). The model decides from these whether
  // an output is an activation (someone saves it) or a temporary.
  virtual bool saves_input() const = 0;
  virtual bool saves_output() const = 0;
  // A parameter of another block that this block also reads and whose gradient it
  // writes (a tied head reads the token embedding's weight, and writes its gradient
  // first in backward, with beta; the embedding adds its part onto it). A pipeline that
  // places the two blocks on different stages holds the tensor on both and all-reduces
  // its gradient between them (docs/design.md, "Transformers").
  virtual TensorRef tied_param() const { return {}; }
  // Whether --checkpoint may wrap it (config.hpp: CheckpointPolicy): the MLP's layers
  // and a transformer's blocks; not a transformer's embedding or final block.
  virtual bool checkpointable() const { return true; }
  // The module (its tensors, model block `index`) whose backward comes first in this
  // block's: the one whose pre-backward hook fires before anything unpacks a save of the
  // block, so before a checkpoint's re-run (DeepSpeed's stage 3 gathers it then: GPT-2's
  // mlp.c_proj, Llama's down_proj). None elsewhere.
  virtual std::vector<TensorRef> first_backward_module(int /*index*/) const { return {}; }
  // --checkpoint attention: a transformer block's attention core recomputes what it
  // would save (config.hpp: CheckpointPolicy); nothing else has one.
  virtual void set_recompute_attention(bool /*on*/) {}
  // A wrapped block's forward has returned, its saves dropped: what it kept for backward
  // is freed, but for what outlives its saves (under autocast, its weights' bf16 casts,
  // which autocast's cast cache holds until the region ends: Model::loss_forward frees
  // them).
  virtual void drop_checkpointed(BlockTape& tape) { tape.held.clear(); }
  // A wrapped block's re-run in backward has returned: torch's checkpoint runs it in an
  // autocast region of its own, whose exit empties the cast cache (the MLP's: the casts
  // autograd did not save go). Nothing to do elsewhere.
  virtual void end_recompute(BlockTape& /*tape*/) {}
  // Bytes of the block's input for `rows` rows, as a checkpoint saves it: fp32 by default
  // (the MLP's layers past the first take a bf16 input under autocast).
  virtual std::int64_t input_bytes(int rows) const { return 4 * input_elems(rows); }
  // The model's input when this block is the first, on the host: the slice's rows of
  // input_elems(1) values each. By default hashed values in [-1, 1) (hashed_rows, the
  // MLP's batch); a token embedding draws token ids.
  virtual std::vector<float> host_input(const DataSlice& at) const;

  // Forward of call.rows rows: allocates and returns the output (category activation
  // when `output_saved`, else temp) and records its saves. `input` is owned by the
  // caller and lives until this block's backward has released it.
  virtual Buffer forward(const BlockCall& call, const float* input, bool input_requires_grad,
                         bool output_saved, BlockTape& tape) = 0;

  // Whole backward: consumes `dy` (the gradient of the output) and the output's saves,
  // writes the parameter gradients with `beta` (0 overwrite, 1 accumulate), releases
  // every save, frees `dy` and `output`, and returns dx (temp) when `needs_dx`.
  virtual Buffer backward(const BlockCall& call, const float* input, Buffer& output, Buffer dy,
                          bool needs_dx, float beta, BlockTape& tape) = 0;

  // Zero-bubble halves. B: returns the input gradient (when `needs_dx`) and keeps in
  // `tape` what W needs; frees `output` once it is done with it when `free_output` (no
  // later block of the segment takes it as input).
  virtual Buffer backward_input(const BlockCall& call, const float* input, Buffer& output, Buffer dy, bool needs_dx,
                                bool free_output, BlockTape& tape) = 0;
  // W: the parameter gradients from what B kept; releases the remaining saves and frees
  // what B kept.
  virtual void backward_weight(const BlockCall& call, const float* input, float beta, BlockTape& tape) = 0;
};

}  // namespace shardscope
