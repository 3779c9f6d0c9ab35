#include "harness/comm/mpi_env.hpp"

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardscope/check.hpp"

#ifdef SHARDSCOPE_WITH_MPI
#include <mpi.h>
#endif

namespace shardscope {

namespace {

// The variable's value as a non-negative int, or -1 when it is not set.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > INT_MAX)
    throw UsageError(std::string("environment variable ") + name + "=" + v +
                     ": expected a non-negative integer");
  return static_cast<int>(x);
}

// The first of `names` that is set, or -1.
int first_env_int(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    int v = env_int(n);
    if (v >= 0) return v;
  }
  return -1;
}

std::uint64_t fnv1a64(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

#ifdef SHARDSCOPE_WITH_MPI
int world_rank() {
  int r = 0;
  if (mpi_active()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  if (mpi_active()) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
// The rank among the ranks that share this node's memory, in world-rank order (a
// collective over MPI_COMM_WORLD).
int node_rank(int rank) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int local = 0;
  const int rc = MPI_Comm_rank(node, &local);
  MPI_CHECK(MPI_Comm_free(&node));
  MPI_CHECK(rc);
  return local;
}
#endif

}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo info{false, 1, 0};
  struct Family {
    std::initializer_list<const char*> size, rank;
  };
  // Open MPI, MPICH/Hydra, PMIx, Slurm: the first family whose rank variable is set
  // describes the launch. Slurm's SLURM_NTASKS is also set in a batch script that did
  // not go through srun; SLURM_STEP_NUM_TASKS, set per srun step, is preferred.
  const Family families[] = {
      {{"OMPI_COMM_WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK"}},
      {{"PMI_SIZE"}, {"PMI_RANK"}},
      {{}, {"PMIX_RANK"}},
      {{"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, {"SLURM_PROCID"}},
  };
  for (const Family& f : families) {
    int rank = first_env_int(f.rank);
    if (rank < 0) continue;
    int world = f.size.size() == 0 ? -1 : first_env_int(f.size);
    info.under_launcher = true;
    info.rank = rank;
    info.world = world < 0 ? 0 : world;
    if (info.world > 0 && info.rank >= info.world)
      throw UsageError("launcher environment: rank " + std::to_string(rank) +
                       " is not below the world size " + std::to_string(world));
    return info;
  }
  return info;
}

bool mpi_active() {
#ifdef SHARDSCOPE_WITH_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
#else
  return false;
#endif
}

void mpi_check(int rc, const char* call, const char* file, int line) {
#ifdef SHARDSCOPE_WITH_MPI
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    std::string code = "error code " + std::to_string(rc);
    text[code.copy(text, MPI_MAX_ERROR_STRING)] = '\0';
  }
  int rank = world_rank();
#else
  if (rc == 0) return;
  const char* text = "error";
  int rank = 0;
#endif
  std::string fn(call);
  fn = fn.substr(0, fn.find('('));
  throw RunError("rank " + std::to_string(rank) + ": " + fn + " failed: " + text + " (" +
                 file + ":" + std::to_string(line) + ")");
}

// ---- MpiSession ------------------------------------------------------------------------

MpiSession::MpiSession(int* argc, char*** argv, bool force) {
  launch_ = detect_launch();
  // world 0: the launcher gave a rank but not the size; assume several ranks.
  bool multi = launch_.under_launcher && (launch_.world != 1);
#ifdef SHARDSCOPE_WITH_MPI
  if (mpi_active()) {
    active_ = true;  // adopted: someone else initialised MPI and will finalise it
  } else if (multi || force) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    owns_ = true;
    active_ = true;
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  }
  if (active_) {
    rank_ = world_rank();
    world_ = world_size();
    local_rank_ = node_rank(rank_);
  }
#else
  (void)argc;
  (void)argv;
  (void)force;
  if (multi && (launch_.world > 1 || launch_.rank > 0)) {
    std::string n = launch_.world > 0 ? std::to_string(launch_.world) : std::string("several");
    throw UsageError("launched by mpirun with " + n + " ranks but this build has no MPI");
  }
#endif
}

MpiSession::~MpiSession() {
#ifdef SHARDSCOPE_WITH_MPI
  if (owns_ && mpi_active()) MPI_Finalize();
#endif
}

void MpiSession::abort(int code) const {
#ifdef SHARDSCOPE_WITH_MPI
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

// ---- helpers over MPI_COMM_WORLD -------------------------------------------------------

bool all_ranks_equal(const std::string& s) {
#ifdef SHARDSCOPE_WITH_MPI
  if (!mpi_active()) return true;
  // One MAX reduction gives both extremes: max(~x) == ~min(x).
  std::uint64_t h = fnv1a64(s), n = s.size();
  std::uint64_t v[4] = {h, n, ~h, ~n};
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
  return v[0] == ~v[2] && v[1] == ~v[3];
#else
  (void)fnv1a64;
  (void)s;
  return true;
#endif
}

std::vector<std::string> gather_strings_to_root(const std::string& s) {
#ifdef SHARDSCOPE_WITH_MPI
  if (!mpi_active()) return {s};
  int rank = world_rank(), world = world_size();
  if (s.size() > static_cast<std::size_t>(INT_MAX))
    throw RunError("rank " + std::to_string(rank) + ": gather_strings_to_root: string of " +
                   std::to_string(s.size()) + " bytes is over MPI's int count");
  int len = static_cast<int>(s.size());
  std::vector<int> lens(rank == 0 ? world : 0), displs;
  MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::string all;
  if (rank == 0) {
    displs.resize(world);
    std::int64_t total = 0;
    for (int r = 0; r < world; ++r) {
      displs[r] = static_cast<int>(total);
      total += lens[r];
      if (total > INT_MAX)
        throw RunError("rank 0: gather_strings_to_root: " + std::to_string(total) +
                       " bytes in all is over MPI's int displacement");
    }
    all.resize(static_cast<std::size_t>(total));
  }
  MPI_CHECK(MPI_Gatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                        MPI_CHAR, 0, MPI_COMM_WORLD));
  std::vector<std::string> out;
  if (rank == 0) {
    out.reserve(world);
    for (int r = 0; r < world; ++r) out.push_back(all.substr(displs[r], lens[r]));
  }
  return out;
#else
  return {s};
#endif
}

void broadcast_string(std::string& s, int root) {
#ifdef SHARDSCOPE_WITH_MPI
  if (!mpi_active()) return;
  int rank = world_rank();
  SHARDSCOPE_REQUIRE(root >= 0 && root < world_size(), "broadcast_string: root out of range");
  std::uint64_t n = s.size();
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_UINT64_T, root, MPI_COMM_WORLD));
  if (n > static_cast<std::uint64_t>(INT_MAX))
    throw RunError("rank " + std::to_string(rank) + ": broadcast_string: " + std::to_string(n) +
                   " bytes is over MPI's int count");
  if (rank != root) s.resize(n);
  MPI_CHECK(MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD));
#else
  (void)s;
  SHARDSCOPE_REQUIRE(root == 0, "broadcast_string: root out of range");
#endif
}

int all_reduce_max(int v) {
#ifdef SHARDSCOPE_WITH_MPI
  if (!mpi_active()) return v;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
#endif
  return v;
}

}  // namespace shardscope
