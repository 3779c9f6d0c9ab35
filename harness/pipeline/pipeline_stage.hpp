// One pipeline stage (docs/design.md §4): the blocks of its virtual stages with their
// parameters, gradients and AdamW state, and the executor that runs its lowered
// program (p2p groups + F/B/W actions) for one step.
//
// Layout. S stages, v chunks per stage, V = S*v virtual stages; virtual stage k holds
// the model's blocks [bounds[k], bounds[k+1]) (the MLP's blocks are its layers) and lives on stage k % S as its chunk k / S. The
// global batch of B rows is cut into M micro-batches like torch.tensor_split (sizes
// differ by at most one, larger first). Micro-batch losses are scaled so that they
// sum to the full-batch loss (mse: rows/B; sum: 1), so gradients equal the batch's.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness/model/adam_state.hpp"
#include "harness/model/model.hpp"
#include "harness/model/saved_tensors.hpp"
#include "harness/predict/pipeline_forms.hpp"
#include "shardscope/backend.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {

// n items cut into `parts` contiguous pieces like torch.tensor_split: the first n % parts
// pieces take one more.
std::vector<int> tensor_split_sizes(int n, int parts);

struct PipelineLayout {
  Schedule schedule;
  std::vector<int> bounds;      // V + 1 block boundaries
  std::vector<int> rows;        // per micro-batch
  std::vector<int> row_offset;  // per micro-batch, first row in the batch

  int stages() const { return schedule.stages; }
  int microbatches() const { return schedule.microbatches; }
  int chunks() const { return schedule.chunks; }
  int vstages() const { return virtual_stages(schedule); }
  int first_layer(int vstage) const { return bounds[vstage]; }
  int end_layer(int vstage) const { return bounds[vstage + 1]; }  // exclusive
};

// What --split and the default split count: the MLP's layers, a transformer's
// transformer blocks.
int pipeline_layers(const ModelConfig& model);
// The V + 1 model-block boundaries of the virtual stages holding `split` (layers or
// transformer blocks each): a transformer's embedding block joins the first, its final
// block the last.
std::vector<int> block_bounds(const ModelConfig& model, const std::vector<int>& split);

// What --mesh tp=T > 1 asks of a pipeline's stages (UsageError naming the flags): the
// model splits into T (check_tensor_parallel), and each of the MLP's virtual stages holds
// column- and row-parallel pairs.
void check_pipeline_tensor_parallel(const ModelConfig& model, ScheduleKind schedule, const std::vector<int>& split,
                                    int tp);

// M = cfg.microbatches, or S when 0.
int pipeline_microbatches(const RunConfig& cfg, int stages);

// What the closed forms read, after every check a pipeline run makes of its flags
// (UsageError naming the flag), without building the schedule's lists: linear in the
// virtual stages.
PipelineShape pipeline_shape(const RunConfig& cfg, int stages);

// The schedule's lists of a checked shape, validated (RunError when they fail their own
// validator: a bug).
PipelineLayout make_pipeline_layout(const PipelineShape& shape);

// pipeline_shape's checks, then make_pipeline_layout of the shape.
PipelineLayout make_pipeline_layout(const RunConfig& cfg, int stages);

// One action's measured compute time.
struct ActionTiming {
  Action action;
  double ms = 0.0;
};

// "F(m=3)" or, with chunks, "F(m=3, chunk 1)".
std::string describe_action(const Action& a, int chunks);

class PipelineStage {
 public:
  // This process is stage comm.rank() of comm.world() stages, laid out as `layout`
  // (make_pipeline_layout of cfg and comm.world() stages). Under --mesh dp=D,pp=S, `comm`
  // is the rank's pipeline group and `dp` its data-parallel group: the stage is
  // replicated over the D ranks of `dp`, each running the schedule on its own batch (the
  // batch data-parallel rank dp->rank() draws), and after the schedule their gradients
  // are averaged in place (all_reduce_data_parallel). Under --mesh tp=T > 1 `tp` is its
  // tensor-parallel group: the stage's blocks are rank tp->rank()'s slice of the model
  // (the same T-th of each block on every stage of its pipeline group) and their
  // all-reduces run over `tp`; what crosses a stage boundary is the whole activation.
  PipelineStage(const RunConfig& cfg, Backend& backend, Communicator& comm, PipelineLayout layout,
                Communicator* dp = nullptr, Communicator* tp = nullptr);
  PipelineStage(const RunConfig& cfg, Backend& backend, Communicator& comm);
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  // Allocates and initialises parameters, gradients and AdamW state of its blocks.
  void setup();
  // Draws the global batch of step `index` on the host (outside the timed region).
  void prepare_batch(int index);
  // One training step: the stage's program, then AdamW. Returns the sum of the
  // micro-batch losses on the stage holding the last virtual stage, else 0.
  float step();

  const PipelineLayout& layout() const { return layout_; }
  int stage() const { return stage_; }
  bool holds_loss() const;  // the last virtual stage is here
  int vstage(int chunk) const { return vstage_of(layout_.schedule, stage_, chunk); }
  const StageProgram& program() const { return program_; }

  // Measurements of the last step.
  const SavedTensors& saved() const { return saved_; }
  const std::vector<ActionTiming>& action_ms() const { return action_ms_; }
  // From the step's start to the end of this stage's last action (0 before any): the
  // stage's share of the pipeline's wall-clock makespan, the optimizer left out.
  double actions_end_ms() const { return actions_end_ms_; }
  std::int64_t peak_comm_bytes() const { return peak_comm_bytes_; }
  // The dtype of what it sends and receives (its first chunk's output: every boundary of a
  // model has one dtype).
  DType p2p_dtype() const { return boundary_dtype(vstage(0)); }
  const std::string& peak_where() const { return peak_where_; }

  // Whether this stage holds its own copy of a tied parameter whose owner block lives on
  // another stage (a GPT-2's last stage holds wte for its head), and that copy's state.
  bool holds_tied_copy() const { return tied_.copy; }
  std::vector<float> download_tied_params() const;
  std::vector<float> download_tied_grads() const;

  // Chunk state on the host, torch's flat order over the chunk's blocks.
  std::vector<float> download_params(int chunk) const;
  std::vector<float> download_grads(int chunk) const;
  std::vector<float> download_exp_avg(int chunk) const;
  std::vector<float> download_exp_avg_sq(int chunk) const;

 private:
  DataSlice batch_slice() const;  // the global batch prepare_batch drew (rank 0's stream)
  struct Chunk {
    int first = 0;  // blocks [first, last)
    int last = 0;
    Buffer params;  // flat over the chunk's blocks (the model's flat vector's slice), param
    Buffer grads;   // same layout, grad
    std::vector<AdamState> state;  // per parameter tensor, torch order
  };
  // A parameter two blocks read (block.hpp, tied_param) placed on two stages: the
  // owner's stage keeps it in its chunk; the reader's holds a copy here, with its
  // gradient and AdamW state (as Megatron keeps the embedding on its last stage). After
  // the step's backward the two all-reduce its gradient; both then step it alike.
  struct Tied {
    TensorRef ref;       // the owner block and the tensor
    int peer = -1;       // the other stage holding it (-1: not split across stages)
    bool copy = false;   // this stage is the reader's: it holds the copy below
    std::size_t elems = 0;
    Buffer params;       // param
    Buffer grads;        // grad
    AdamState state;
  };
  class Access : public BlockAccess {
   public:
    Access(const Model& model, std::vector<Chunk>& chunks, Tied& tied)
        : model_(model), chunks_(chunks), tied_(tied) {}
    const float* param(int block, int tensor) override { return at(block, tensor, false); }
    float* grad(int block, int tensor) override { return at(block, tensor, true); }

   private:
    float* at(int block, int tensor, bool grad);
    const Model& model_;
    std::vector<Chunk>& chunks_;
    Tied& tied_;
  };
  // What one (micro-batch, chunk) holds during a step.
  struct Slot {
    Tape tape;
    Buffer act_in;   // received activation (saved by the first block); on zbv's V bottom the
                     // previous chunk's output, handed on by its B until this pair's W
    Buffer grad_in;  // received (or, on one stage, local) gradient of the output
  };
  // An output held until the group that sends it has completed.
  struct Pending {
    const float* data = nullptr;
    std::size_t count = 0;
    DType dtype = DType::f32;
    Buffer owned;  // empty when the buffer is saved here and lives on in its tape
  };
  using Key = std::tuple<int, int, int>;  // (payload, micro-batch, producing vstage)

  Slot& slot(int microbatch, int chunk) { return slots_[static_cast<std::size_t>(chunk) * layout_.microbatches() + microbatch]; }
  void run_group(const ProgramStep& step);
  float run_action(const Action& a, const Buffer& x, const Buffer& target, std::vector<bool>& grads_written);
  void optimizer_step(int step);
  void setup_tied();
  // The tied gradient's all-reduce between its two stages (none when not split).
  void all_reduce_tied();
  // Along the mesh's dp axis: each chunk's flat gradient and the tied copy's all-reduced in
  // place over the data-parallel group and scaled by 1/D, as Megatron's DDP reduces its
  // contiguous gradient buffer (no bucket of its own; nothing when D = 1).
  void all_reduce_data_parallel();
  void note_peak(std::int64_t before, const std::string& what);
  std::vector<float> download(const float* p, std::size_t n) const;
  // One AdamW moment (&AdamState::exp_avg or exp_avg_sq) of every tensor of the chunk, in order.
  std::vector<float> download_state(int chunk, Buffer AdamState::*moment) const;
  // Elements of virtual stage `vstage`'s output for `rows` rows: what crosses the
  // boundary after it (its activation forward, its gradient backward).
  std::size_t boundary_elems(int vstage, int rows) const;
  // Its dtype: bf16 after the MLP's Linears under autocast, else fp32 (Block::output_dtype).
  DType boundary_dtype(int vstage) const;

  const RunConfig& cfg_;
  Backend& backend_;
  Communicator& comm_;
  Communicator* dp_;  // the data-parallel group under --mesh, else null
  Communicator* tp_;  // the tensor-parallel group under --mesh with tp > 1, else null
  PipelineLayout layout_;
  int stage_;
  StageProgram program_;
  SavedTensors saved_;
  std::unique_ptr<Model> model_;
  std::vector<Chunk> chunks_;
  Tied tied_;
  Access access_;
  AdamWHyper hyper_;
  int steps_done_ = 0;
  std::vector<float> host_batch_;
  int batch_index_ = 0;  // the step whose batch prepare_batch drew (the target's too)

  std::vector<Slot> slots_;
  std::map<Key, Pending> pending_;
  std::vector<ActionTiming> action_ms_;
  std::chrono::steady_clock::time_point step_start_;
  double actions_end_ms_ = 0.0;
  std::int64_t peak_comm_bytes_ = 0;
  std::string peak_where_;
};

}  // namespace shardscope
