// Closed forms for what a run should measure, all in one place (docs/design.md §3, §4).
// docs/formulas.md writes out the same expressions.
#pragma once

#include <array>
#include <optional>
#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/category.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"
#include "shardscope/mesh.hpp"

namespace shardscope {

struct Prediction {
  CategoryBytes resting;  // per category, bytes
  // False while a model's peak has no closed form in this build (a transformer's needs
  // its activation forms): the peak figures below are then zero and not a prediction.
  bool peak_known = true;
  std::int64_t peak_total = 0;
  CategoryBytes peak_by_category;  // what is live at the peak, per category
  Phase peak_phase = Phase::setup;
  std::string peak_where;
  std::array<std::int64_t, kCollKindCount> comm_bytes{};  // per step, nccl-tests' sizes
  // Under --mesh: comm_bytes's total split by the group that carries it (dp, tp, pp).
  std::array<std::int64_t, kMeshAxes> axis_comm_bytes{};
  // --engine deepspeed: the rank's model states as the ZeRO paper counts them (Figure 1):
  // parameters, the gradients the stage keeps during a step, master weights and AdamW's
  // state (docs/formulas.md, "DeepSpeed"); none for the other engines.
  std::optional<std::int64_t> model_states;
  // Under HSDP: the replicate group's part of comm_bytes (its all-reduce of the gradient
  // shards); the rest is the shard group's.
  std::int64_t replicate_comm_bytes = 0;
  // What the saved-tensor instrument holds when the forward, loss included, has ended:
  // distinct saved storages holding bytes (parameters excluded) and their bytes.
  std::int64_t saved_after_forward_bytes = 0;
  int saved_after_forward_tensors = 0;
  std::int64_t comm_total() const {
    std::int64_t t = 0;
    for (auto b : comm_bytes) t += b;
    return t;
  }
};

// Every rank of a data-parallel job of `world` ranks running cfg.strategy, in rank
// order (under --mesh, world is the mesh's: each rank as its data-parallel group's rank,
// its model its tensor-parallel slice; under --strategy hsdp, each rank as its shard
// group's rank, with the replicas' all-reduce of its gradient shard); linear in layers, units and ranks (zero1's partition: T log W), so a world of
// 65,536 ranks or a model of 100,000 one-layer units is predicted at once.
std::vector<Prediction> predict_data_parallel_ranks(const RunConfig& cfg, int world);

// Rank `rank` of the above.
Prediction predict_data_parallel(const RunConfig& cfg, int world, int rank);

}  // namespace shardscope
