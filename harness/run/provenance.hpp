// Where a result came from (docs/design.md §7 "provenance"): commit, command, machine, libraries.
#pragma once

#include <string>

#include "harness/records/result.hpp"

namespace shardscope {

// git, command, host, cpu, cores, gpu, blas, mpi, nccl, cuda (records/result.hpp); cores:
// the host's logical cores (none when unknown).
// git: the commit CMake saw at configure time. cpu: /proc/cpuinfo's model name and the
// logical core count. blas: openblas_get_config() when built with OpenBLAS, else
// "none (loops)". mpi: the first line of MPI_Get_library_version when built with MPI
// (callable before MPI_Init), else null. gpu, cuda and nccl come from the caller (the
// backend knows them) and are null when empty.
Provenance provenance(const std::string& command_line, const std::string& gpu, const std::string& cuda,
                      const std::string& nccl);

// The commit CMake saw at configure time ("unknown" outside a git checkout): what
// provenance's "git" holds and `shardscope --version` prints.
std::string build_commit();

// "AMD EPYC 7B13 (2 cores)": /proc/cpuinfo's model name and the logical core count.
std::string cpu_description();

// The command line as one string, each argument quoted for a POSIX shell when it
// needs to be ("shardscope run --layers 8 --json 'my results.json'").
std::string join_command_line(int argc, const char* const* argv);

}  // namespace shardscope
