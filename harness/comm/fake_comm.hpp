// `--comm fake` (`--emulate W:r`): one process plays rank r of a world of W (docs/design.md §5).
#pragma once

#include <memory>

#include "shardscope/comm.hpp"

namespace shardscope {

// Collectives and p2p move no data and touch no buffer, but the ledger records the same
// calls and payload bytes as rank r of a real world of W would. emulated() is true.
// Expects 1 <= world and 0 <= rank < world (make_communicator checks and names the flag).
std::unique_ptr<Communicator> make_fake_communicator(int world, int rank, Backend* backend);

}  // namespace shardscope
