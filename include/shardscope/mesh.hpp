// A device mesh (--mesh dp=D,tp=T,pp=S; docs/design.md, "Meshes"): a world of D·T·S
// ranks ordered as Megatron orders them, tensor-parallel fastest, then data-parallel,
// then pipeline: rank = tp + T·(dp + D·pp). Each axis's group (the ranks that differ in
// that coordinate only) has its own communicator (Communicator::split).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/comm.hpp"

namespace shardscope {

enum class MeshAxis : int { dp = 0, tp = 1, pp = 2 };
inline constexpr int kMeshAxes = 3;
inline constexpr std::array<std::string_view, kMeshAxes> kMeshAxisNames = {"dp", "tp", "pp"};

// One rank's place in the mesh: its index along each axis.
struct MeshCoord {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  int at(MeshAxis a) const { return a == MeshAxis::dp ? dp : a == MeshAxis::tp ? tp : pp; }
};

struct MeshShape {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  bool given = false;  // --mesh was given (a run without it is data- or pipeline-parallel alone)

  int size(MeshAxis a) const { return a == MeshAxis::dp ? dp : a == MeshAxis::tp ? tp : pp; }
  int world() const { return dp * tp * pp; }
  MeshCoord coord(int rank) const { return {rank / tp % dp, rank % tp, rank / (tp * dp)}; }
  int rank_of(const MeshCoord& c) const { return c.tp + tp * (c.dp + dp * c.pp); }
  // The world ranks of `rank`'s group along `axis`, in the group's rank order (its
  // index along the axis); `rank` is one of them.
  std::vector<int> group(int rank, MeshAxis axis) const;
  // "dp=2,tp=2,pp=1": every axis, for labels and records.
  std::string text() const;
};

// --mesh's value: comma-separated axis=size pairs, any subset of dp, tp, pp, each at most
// once, each size a positive integer (an axis left out has size 1). UsageError naming
// --mesh and what is allowed for an unknown axis, a repeated one, a size of zero or one
// that is not a number.
MeshShape parse_mesh(const std::string& text);

// UsageError naming --mesh when its product is not the job's world (`world_source` says
// where the world came from: "mpirun's 4 ranks", "--emulate 8:3").
void check_mesh_world(const MeshShape& mesh, int world, const std::string& world_source);

// HSDP's groups (--strategy hsdp --shard-group G): `rank`'s shard group, the G consecutive
// ranks it shards the model with, or its replicate group, the ranks G apart that hold the
// same shards; members in the group's rank order.
std::vector<int> hsdp_group(int rank, int world, int shard_group, bool shard);

// One rank's communicators of a mesh: the world's and one per axis (split from the
// world's; an axis of size 1 is a group of one). The comm ledger is per group.
struct MeshComms {
  MeshShape shape;
  MeshCoord coord;
  std::array<std::unique_ptr<Communicator>, kMeshAxes> groups;
  Communicator& group(MeshAxis a) { return *groups[static_cast<int>(a)]; }
};

// Collective over `world` (every rank calls it, in the same order of axes).
MeshComms make_mesh_comms(Communicator& world, const MeshShape& shape);

}  // namespace shardscope
