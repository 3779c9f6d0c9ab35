// The process's place in a job (docs/design.md §5, §6): what the launcher says, MPI's lifetime,
// and the few MPI helpers the run command needs to agree across ranks.
//
// Everything here compiles without MPI: a build without SHARDSCOPE_WITH_MPI gets
// single-process versions (one rank, world 1), and refuses a multi-rank launch.
// mpi.h stays out of this header so that callers need no MPI include path.
#pragma once

#include <string>
#include <vector>

namespace shardscope {

// What the launcher (mpirun, mpiexec, srun) put in the environment: enough to decide
// whether to start MPI. The rank on this node is not read here: launchers' variables
// for it mislead (under `srun --mpi=pmix` PMIX_RANK is set and SLURM_LOCALID is not
// read before it, so every rank would take GPU 0); MpiSession asks MPI instead.
struct LaunchInfo {
  bool under_launcher;  // a launcher's rank variable is set
  int world;            // ranks in the job: 1 when not launched; 0 when the launcher
                        // gives a rank but not the size (PMIx alone)
  int rank;             // 0 when not launched
};

// Reads, first found wins: Open MPI (OMPI_COMM_WORLD_SIZE / _RANK), MPICH/Hydra
// (PMI_SIZE / PMI_RANK), PMIx (PMIX_RANK), Slurm (SLURM_STEP_NUM_TASKS or SLURM_NTASKS /
// SLURM_PROCID). Throws UsageError when a variable is set but is not a non-negative
// integer.
LaunchInfo detect_launch();

// MPI for the lifetime of the object. The constructor initialises MPI
// (MPI_Init_thread, MPI_THREAD_FUNNELED) when the build has MPI and either a launcher
// started more than one rank or `force` is set; otherwise the session is inactive and
// the process is rank 0 of world 1. If MPI is already initialised (a test's main), the
// session adopts it and leaves finalising to its owner. A session that initialised MPI
// sets MPI_ERRORS_RETURN on MPI_COMM_WORLD, so failures come back as RunError.
// Throws UsageError("launched by mpirun with N ranks but this build has no MPI") when a
// launcher started several ranks and the build has no MPI.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv, bool force = false);
  ~MpiSession();  // MPI_Finalize when this session initialised MPI
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  bool active() const { return active_; }  // MPI is initialised and usable
  int rank() const { return rank_; }
  int world() const { return world_; }
  // This process's rank among the job's ranks on its node (shared memory), which
  // selects its GPU: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) ordered by world rank,
  // whatever the launcher's variables say; 0 without MPI.
  int local_rank() const { return local_rank_; }
  const LaunchInfo& launch() const { return launch_; }

  // Ends every rank of the job now (MPI_Abort); exits this process when inactive.
  [[noreturn]] void abort(int code) const;

 private:
  LaunchInfo launch_{false, 1, 0};
  bool active_ = false;
  bool owns_ = false;  // this session called MPI_Init_thread
  int rank_ = 0;
  int world_ = 1;
  int local_rank_ = 0;
};

// True when MPI is initialised and not yet finalised (so MPI_COMM_WORLD is usable).
bool mpi_active();

// Collectives over MPI_COMM_WORLD for the run command. Every rank must call them in the
// same order. Without active MPI they are the single-process versions.
//
// True when `s` is the same on every rank (compares a 64-bit FNV-1a hash and the length).
bool all_ranks_equal(const std::string& s);
// Rank 0 receives every rank's string, in rank order; the other ranks receive {}.
std::vector<std::string> gather_strings_to_root(const std::string& s);
// Every rank's `s` becomes root's.
void broadcast_string(std::string& s, int root);
// The maximum of `v` over ranks.
int all_reduce_max(int v);

// Throws RunError("rank N: MPI_Xxx failed: <MPI_Error_string> (file:line)") when
// `rc` is not MPI_SUCCESS; `call` is the call's text, `MPI_Xxx` its function name.
// Use through MPI_CHECK.
void mpi_check(int rc, const char* call, const char* file, int line);

}  // namespace shardscope

#ifndef MPI_CHECK
#define MPI_CHECK(call) ::shardscope::mpi_check((call), #call, __FILE__, __LINE__)
#endif
