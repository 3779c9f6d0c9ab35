// A model: an ordered sequence of blocks (block.hpp) and the loss after the last one,
// built from the config by the registry (harness/model/registry.cpp: --model mlp).
//
// Parameters are numbered in torch's order: the blocks' tensors one after the other
// (block 0's in its params() order, then block 1's, ...); the model's flat parameter
// vector concatenates them in that order. Strategies partition that (zero1: whole
// tensors; FSDP: units of K blocks, each a flat parameter), pipeline stages hold
// contiguous ranges of blocks.
//
// The engine runs a contiguous range of blocks [first, last) forward and backward and
// keeps what backward needs in a Tape; strategies reach parameters through a
// BlockAccess and see each block's hooks around it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness/model/block.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// What one forward over blocks [first, last) keeps for its backward.
struct Tape {
  int first = 0;
  int last = 0;
  int rows = 0;
  bool input_requires_grad = false;
  const float* input = nullptr;  // owned by the caller, kept alive by it
  std::vector<Buffer> outputs;   // outputs[j]: output of block first + j
  std::vector<BlockTape> blocks; // blocks[j]: what block first + j keeps besides those
  bool has_loss = false;
  float loss_scale = 1.0f;
  const float* target = nullptr;  // the loss's target, owned by the caller

  const float* output() const { return outputs.back().data(); }
};

// The loss after the model's last block: a scalar from its output and the target.
class ModelLoss {
 public:
  virtual ~ModelLoss() = default;
  // Whether the loss saves its input (the last block's output) for backward.
  virtual bool saves_input() const = 0;
  // Whether it is a mean over rows: micro-batch losses are then scaled by rows / B to
  // sum to the batch's (a sum is scaled by 1).
  virtual bool is_mean() const = 0;
  // Elements of the target for `rows` rows (0: the loss takes none), and its values.
  virtual std::int64_t target_elems(int rows) const = 0;
  // The target of the slice's rows (target_elems(at.rows) elements on the backend).
  virtual void fill_target(Backend& backend, float* target, const DataSlice& at) const = 0;
  // Records its saves and writes the loss of `output` (rows of the last block's
  // output), scaled by `scale`, to `value` (one float on the backend).
  virtual void forward(Backend& backend, SavedTensors& saved, const float* output, const float* target,
                       int rows, float scale, float* value) = 0;
  // The gradient of the scaled loss at `output` (nullptr when not saved), (temp);
  // releases the loss's saves.
  virtual Buffer backward(Backend& backend, SavedTensors& saved, const float* output, const float* target,
                          int rows, float scale) = 0;
  // The tensor-parallel group a vocabulary-parallel loss reduces over (null: none); the
  // model hands it over before each forward and backward.
  virtual void bind_tensor_parallel(Communicator* /*group*/) {}
  // Under autocast: the region a forward ran in has ended without this loss (a pipeline
  // stage's forward that does not end the model): autocast's cast cache lets go of what it
  // holds. The loss's own forward ends the region otherwise. Nothing in fp32.
  virtual void end_autocast_region() {}
};

// What the engine runs with: the backend, the saved-tensor instrument and the access
// to parameters (with the strategy's hooks).
struct ModelContext {
  Backend& backend;
  SavedTensors& saved;
  BlockAccess& access;
  Communicator* tp = nullptr;  // the tensor-parallel group's, when the model is split (make_model's tp)
};

class Model {
 public:
  Model(std::vector<std::unique_ptr<Block>> blocks, std::unique_ptr<ModelLoss> loss);

  // ---- shape ----
  int blocks() const { return static_cast<int>(blocks_.size()); }
  const Block& block(int b) const { return *blocks_[b]; }
  // Parameter tensors of the whole model, in torch order.
  int param_tensors() const { return static_cast<int>(tensors_.size()); }
  std::int64_t params() const { return tensor_offset_.back(); }
  const ParamSpec& tensor(int t) const { return *tensors_[t]; }
  std::int64_t tensor_elems(int t) const { return tensors_[t]->elems(); }
  std::int64_t tensor_offset(int t) const { return tensor_offset_[t]; }  // in the flat vector
  // Block b's tensors are [first_tensor(b), first_tensor(b + 1)); first_tensor(blocks()) = T.
  int first_tensor(int b) const { return first_tensor_[b]; }
  // Block b's parameters are [block_offset(b), block_offset(b + 1)) of the flat vector.
  std::int64_t block_offset(int b) const { return tensor_offset_[first_tensor_[b]]; }
  std::int64_t block_elems(int b) const { return block_offset(b + 1) - block_offset(b); }
  // Elements of every tensor, every block: what the partitions (partition.hpp) take.
  std::vector<std::int64_t> tensor_sizes() const;
  std::vector<std::int64_t> block_sizes() const;

  // Elements [begin, begin + count) of the flat parameter vector at initialisation
  // (each tensor uniform in +-init_bound, streams by tensor index); positions past the
  // end (FSDP padding) are zero.
  std::vector<float> init_flat_slice(std::uint64_t seed, std::int64_t begin, std::int64_t count) const;

  // Elements of the model's input (what block 0 takes), of block b's output and of the
  // loss's target (0: none) for `rows` rows; each is rows times a row's.
  std::int64_t input_elems(int rows) const { return blocks_.front()->input_elems(rows); }
  std::int64_t output_elems(int b, int rows) const { return blocks_[b]->output_elems(rows); }
  DType output_dtype(int b) const { return blocks_[b]->output_dtype(); }
  std::int64_t target_elems(int rows) const { return loss_->target_elems(rows); }
  bool loss_is_mean() const { return loss_->is_mean(); }
  // The input of the slice's rows on the host (input_elems(at.rows) values: block 0's
  // host_input), and their target on the backend (temp; empty when the loss takes none).
  std::vector<float> host_input(const DataSlice& at) const { return blocks_.front()->host_input(at); }
  Buffer make_target(Backend& backend, const DataSlice& at) const;

  // Whether block b's output is saved for backward when the segment ends at `last`:
  // by the block itself (unless it is checkpointed: its saves are dropped), by the next
  // block of the segment (a checkpointed one saves its input), or by the loss.
  bool output_saved(int b, int last) const;

  // ---- activation checkpointing (--checkpoint) ----
  // Wraps the checkpointable blocks the policy names (CheckpointPolicy in config.hpp).
  void set_checkpoint(const CheckpointPolicy& policy);
  bool checkpointed(int b) const { return checkpointed_[b]; }
  bool any_checkpointed() const;
  // Block b's place among the checkpointable blocks (-1 when it is not one): the c of
  // every:K, and the N of the place "recompute of block N".
  int checkpoint_ordinal(int b) const { return ordinal_[b]; }

  // ---- engine ----
  // Forward through blocks [first, last) of `rows` rows.
  // A checkpointed block runs with its saves dropped (what it kept is freed once it
  // returns) and saves only its input, as torch's non-reentrant checkpoint does. A block's
  // input that another block of the segment made and nobody saves is freed once the
  // block's forward ends (Llama's bf16 module's stream).
  Tape forward(ModelContext& ctx, int first, int last, const float* input, int rows, bool input_requires_grad);
  // The loss of the model's output (the tape must end at the last block); returns its
  // value scaled by `scale`.
  float loss_forward(ModelContext& ctx, Tape& tape, const float* target, float scale);
  // A forward that does not end the model ends its autocast region (a pipeline stage's
  // micro-batch whose loss is on another stage): ModelLoss::end_autocast_region, and the
  // cast cache lets go of what the tape's wrapped blocks kept past their forward (their
  // weights' casts, as loss_forward does; nothing in fp32).
  void end_autocast_region(Tape& tape);
  // --autocast-region step: one region around the stage's schedule step; every block takes
  // its casts from one cache (StepCasts), emptied by end_autocast_step when the step's
  // actions end.
  void use_step_casts();
  void end_autocast_step() {
    if (step_casts_) step_casts_->clear();
  }
  // Whole backward of the tape. `dy` is the gradient of the segment's output (empty
  // when the tape ends with the loss). Gradients are written with `beta` (0 overwrite,
  // 1 accumulate). Returns dx (temp) when the input requires grad. A checkpointed
  // block frees its forward's output, and once the strategy's before_backward hook has
  // run, re-runs its forward (place "recompute of block N"), recording its saves again;
  // the re-run output is kept only when the block saves it; then the usual backward.
  Buffer backward(ModelContext& ctx, Tape& tape, Buffer dy, float beta);
  // Zero-bubble halves: B computes the input gradient, keeping in each block's tape
  // what W needs; W computes the parameter gradients and frees what is left. B frees the
  // segment's last output once its block is done, unless `keep_output` (another segment
  // on this stage still reads it: zbv's V bottom, whose W of the next chunk can come
  // later): then it stays in tape.outputs.back() for the caller to hand on.
  Buffer backward_input(ModelContext& ctx, Tape& tape, Buffer dy, bool keep_output = false);
  void backward_weight(ModelContext& ctx, Tape& tape, float beta);

 private:
  Buffer loss_gradient(ModelContext& ctx, Tape& tape);
  const float* block_input(const Tape& tape, int b) const;
  BlockCall call(ModelContext& ctx, int b, int rows) const {
    return {ctx.backend, ctx.saved, ctx.access, b, rows, ctx.tp};
  }
  std::int64_t input_bytes(int b, int rows) const { return blocks_[b]->input_bytes(rows); }

  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<ModelLoss> loss_;
  std::vector<const ParamSpec*> tensors_;
  std::vector<std::int64_t> tensor_offset_;  // T + 1 entries
  std::vector<int> first_tensor_;            // blocks() + 1 entries
  std::vector<bool> checkpointed_;           // blocks() entries
  std::vector<int> ordinal_;                 // blocks() entries
  std::shared_ptr<StepCasts> step_casts_;    // --autocast-region step (null: per micro-batch)
};

// The model cfg.model.name names (harness/model/registry.cpp); UsageError naming
// --model for an unknown name, or for a family whose model this build has not registered.
// With tp.size > 1, rank tp.rank's slice of the tensor-parallel model (the MLP's).
std::unique_ptr<Model> make_model(const ModelConfig& config, const TensorParallel& tp = {});
// UsageError naming --model and the families unless `name` is one of them.
void check_model_name(const std::string& name);
// The same, and UsageError naming --model for a family this build cannot run (no model
// registered for it): what a run checks before anything else.
void check_model_runnable(const std::string& name);
// The families --model takes, for its help and errors: "mlp, gpt2, llama".
std::string model_names_text();

}  // namespace shardscope
