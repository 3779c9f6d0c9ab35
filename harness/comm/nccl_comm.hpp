// The NCCL communicator (docs/design.md §5): device buffers, collectives on the CUDA backend's
// stream, one GPU per rank by local rank. Rank 0's ncclUniqueId is broadcast over
// MPI_COMM_WORLD; a build without MPI (or a run without a launcher) is world 1.
//
// Compiled only in CUDA builds (the file name says nccl); callers guard the call with
// SHARDSCOPE_WITH_CUDA. A CUDA build without NCCL throws UsageError.
#pragma once

#include <memory>
#include <string>

#include "shardscope/comm.hpp"

namespace shardscope {

class Backend;

// Needs `backend` to be the CUDA backend (UsageError "--comm nccl needs --backend cuda"),
// and at most one rank per visible GPU on each node (UsageError naming both counts).
// With MPI initialised this is collective over MPI_COMM_WORLD: every rank must call it.
// `timeout_s` (--comm-timeout) bounds the broadcast of NCCL's id and every later wait.
std::unique_ptr<Communicator> make_nccl_communicator(Backend* backend,
                                                     double timeout_s = kDefaultCommTimeoutSeconds);

// "2.28.9" (ncclGetVersion), for provenance; empty when it fails.
std::string nccl_version_text();

}  // namespace shardscope
