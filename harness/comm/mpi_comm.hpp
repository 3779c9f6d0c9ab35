// `--comm mpi`: collectives and p2p over a duplicate of MPI_COMM_WORLD (docs/design.md §5).
#pragma once

#include <cstddef>
#include <memory>

#include "shardscope/comm.hpp"

namespace shardscope {

// Most floats one MPI call carries: MPI counts are int.
inline constexpr std::size_t kMpiMaxCount = 1u << 30;

// Needs MPI initialised (MpiSession); throws UsageError naming `--comm mpi` otherwise.
// Host buffers (backend null or named "cpu") go to MPI directly; any other backend's
// buffers are staged through host vectors with backend->download/upload. Counts above
// `max_count` floats are split into several MPI calls (tests lower it to exercise that).
// Defined only when built with MPI (SHARDSCOPE_WITH_MPI).
std::unique_ptr<Communicator> make_mpi_communicator(Backend* backend,
                                                    std::size_t max_count = kMpiMaxCount);

}  // namespace shardscope
