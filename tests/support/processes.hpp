// Finding the ranks of a job a test started, to stop or kill one: by a marker only that
// test's command line carries (its own folder), never by a flag another checkout's run
// of the same test would share.
#pragma once

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace shardscope::testing {

// A whole file ("" when it cannot be read); /proc files included.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Pid of the `shardscope run` process carrying `marker` whose MPI rank is `rank`, or -1.
inline int find_rank(const std::string& marker, int rank) {
  FILE* p = popen(("pgrep -f -- '" + marker + "'").c_str(), "r");
  if (!p) return -1;
  int pid = -1, found = -1;
  while (std::fscanf(p, "%d", &pid) == 1) {
    const std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
    const std::string cmd = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    if (cmd.find("mpirun") != std::string::npos) continue;
    if (env.find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos) found = pid;
  }
  pclose(p);
  return found;
}

}  // namespace shardscope::testing
