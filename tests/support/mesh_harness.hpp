// Shared bench for meshes (--mesh): one rank of a mesh run in-process over its group
// communicators (split from any world communicator: mpi, or the fake one of --emulate),
// and the map from a tensor-parallel rank's slice to the one-rank model's elements.
#pragma once

#include <string>
#include <vector>

#include "shardscope/mesh.hpp"
#include "support/dp_harness.hpp"

namespace shardscope::testing {

struct MeshResult {
  DpResult dp;  // dp.ledger: the data-parallel group's
  CommLedger tp_ledger;
  MeshCoord coord;
};

inline MeshResult run_mesh(const RunConfig& cfg, Backend& backend, Communicator& world, bool gather) {
  MeshComms mesh = make_mesh_comms(world, cfg.mesh);
  Communicator& dp = mesh.group(MeshAxis::dp);
  Communicator& tp = mesh.group(MeshAxis::tp);
  StrategyContext ctx{cfg, backend, dp, &tp};
  auto strategy = make_strategy(ctx);
  strategy->setup();
  MeshResult r;
  r.coord = mesh.coord;
  for (int s = 0; s < cfg.steps; ++s) {
    strategy->prepare_batch(s);
    r.dp.losses.push_back(strategy->step());
  }
  r.dp.saved = strategy->saved_after_forward();
  r.dp.resting = backend.tracker().current();
  r.dp.peak = backend.tracker().peak();
  r.dp.where = describe_place(r.dp.peak.place);
  r.dp.ledger = dp.ledger();
  r.tp_ledger = tp.ledger();
  if (gather) r.dp.state = strategy->gather_state();
  return r;
}

// The one-rank model's flat index of each element of tensor-parallel rank `tp_rank`'s
// flat vector (the slice's elements in its own order).
inline std::vector<std::int64_t> full_indices(const ModelConfig& m, int tp, int tp_rank) {
  const auto slice = make_model(m, TensorParallel{tp, tp_rank});
  const auto whole = make_model(m);
  std::vector<std::int64_t> out;
  for (int t = 0; t < slice->param_tensors(); ++t)
    for (std::int64_t k = 0; k < slice->tensor_elems(t); ++k)
      out.push_back(whole->tensor_offset(t) + slice->tensor(t).full_index(k));
  return out;
}

inline std::vector<float> pick(const std::vector<float>& whole, const std::vector<std::int64_t>& at) {
  std::vector<float> out;
  for (std::int64_t i : at) out.push_back(whole[static_cast<std::size_t>(i)]);
  return out;
}

}  // namespace shardscope::testing

namespace shardscope::testing {

struct HsdpResult {
  DpResult dp;  // dp.ledger: the shard group's
  CommLedger replicate_ledger;
};

// One rank of --strategy hsdp (cfg.shard_group, cfg.strategy zero3) over the groups
// split from `world`, as run does: zero3 over the shard group, the replicas all-reducing
// the gradient shards, each rank drawing its world rank's rows.
inline HsdpResult run_hsdp(const RunConfig& cfg, Backend& backend, Communicator& world, bool gather) {
  auto shard = world.split(hsdp_group(world.rank(), world.world(), cfg.shard_group, true));
  auto replicate = world.split(hsdp_group(world.rank(), world.world(), cfg.shard_group, false));
  StrategyContext ctx{cfg, backend, *shard, nullptr, replicate.get(), world.rank()};
  auto strategy = make_strategy(ctx);
  strategy->setup();
  HsdpResult r;
  for (int s = 0; s < cfg.steps; ++s) {
    strategy->prepare_batch(s);
    r.dp.losses.push_back(strategy->step());
  }
  r.dp.saved = strategy->saved_after_forward();
  r.dp.resting = backend.tracker().current();
  r.dp.peak = backend.tracker().peak();
  r.dp.where = describe_place(r.dp.peak.place);
  r.dp.ledger = shard->ledger();
  r.replicate_ledger = replicate->ledger();
  if (gather) r.dp.state = strategy->gather_state();
  return r;
}

}  // namespace shardscope::testing
