// `--comm self`: the communicator of a world of one (docs/design.md §5).
#pragma once

#include <memory>

#include "shardscope/comm.hpp"

namespace shardscope {

// Rank 0 of world 1. Collectives are identities (reduce-scatter and all-gather copy
// through backend->copy when send and recv differ; plain memcpy without a backend);
// p2p throws RunError, since there is no peer.
std::unique_ptr<Communicator> make_self_communicator(Backend* backend);

}  // namespace shardscope
