// --mesh: its parsing, the ranks of each axis's group, and a rank's group communicators.
#include "shardscope/mesh.hpp"

#include <string>

#include "shardscope/check.hpp"

namespace shardscope {

std::vector<int> MeshShape::group(int rank, MeshAxis axis) const {
  std::vector<int> out;
  MeshCoord c = coord(rank);
  for (int i = 0; i < size(axis); ++i) {
    MeshCoord m = c;
    (axis == MeshAxis::dp ? m.dp : axis == MeshAxis::tp ? m.tp : m.pp) = i;
    out.push_back(rank_of(m));
  }
  return out;
}

std::string MeshShape::text() const {
  return "dp=" + std::to_string(dp) + ",tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp);
}

namespace {

constexpr const char* kMeshAllowed = "expected axis=size pairs of dp, tp, pp, e.g. --mesh dp=2,tp=2";

}  // namespace

MeshShape parse_mesh(const std::string& text) {
  MeshShape m;
  m.given = true;
  std::array<bool, kMeshAxes> seen{};
  std::size_t at = 0;
  if (text.empty()) throw UsageError(std::string("--mesh: empty; ") + kMeshAllowed);
  while (at <= text.size()) {
    const std::size_t comma = text.find(',', at);
    const std::string pair = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const std::size_t eq = pair.find('=');
    if (eq == std::string::npos)
      throw UsageError("--mesh: '" + pair + "' is not axis=size; " + kMeshAllowed);
    const std::string axis = pair.substr(0, eq);
    const std::string size = pair.substr(eq + 1);
    int a = -1;
    for (int i = 0; i < kMeshAxes; ++i)
      if (axis == kMeshAxisNames[i]) a = i;
    if (a < 0) throw UsageError("--mesh: unknown axis '" + axis + "'; allowed: dp, tp, pp");
    if (seen[a]) throw UsageError("--mesh: axis " + axis + " given twice; give each of dp, tp, pp at most once");
    seen[a] = true;
    const bool digits = !size.empty() && size.size() <= 6 && size.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(size) == 0)
      throw UsageError("--mesh: " + axis + "=" + size + ": the size must be a positive integer (at most 999999)");
    (a == 0 ? m.dp : a == 1 ? m.tp : m.pp) = std::stoi(size);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (static_cast<long long>(m.dp) * m.tp * m.pp > 1'000'000)
    throw UsageError("--mesh " + text + ": more than 1000000 ranks");
  return m;
}

void check_mesh_world(const MeshShape& mesh, int world, const std::string& world_source) {
  if (mesh.world() != world)
    throw UsageError("--mesh " + mesh.text() + ": dp·tp·pp = " + std::to_string(mesh.world()) + " ranks, but the world is " +
                     std::to_string(world) + " (" + world_source + "); the product must equal the world");
}

std::vector<int> hsdp_group(int rank, int world, int shard_group, bool shard) {
  std::vector<int> out;
  if (shard)
    for (int i = 0; i < shard_group; ++i) out.push_back(rank / shard_group * shard_group + i);
  else
    for (int i = rank % shard_group; i < world; i += shard_group) out.push_back(i);
  return out;
}

MeshComms make_mesh_comms(Communicator& world, const MeshShape& shape) {
  SHARDSCOPE_REQUIRE(shape.world() == world.world(), "make_mesh_comms: the mesh is not the world");
  MeshComms out;
  out.shape = shape;
  out.coord = shape.coord(world.rank());
  for (int a = 0; a < kMeshAxes; ++a) out.groups[a] = world.split(shape.group(world.rank(), static_cast<MeshAxis>(a)));
  return out;
}

}  // namespace shardscope
