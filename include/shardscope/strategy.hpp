// Data-parallel strategies behind one small interface (docs/design.md §3). A new strategy is
// one file in harness/strategies/ plus one line in registry.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardscope/backend.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// The full model's training state in torch's parameter order, on the host (for tests).
struct HostState {
  std::vector<float> params;
  std::vector<float> grads;
  std::vector<float> exp_avg;
  std::vector<float> exp_avg_sq;
};

// What the saved-tensor instrument held when the last step's forward, loss included,
// ended: distinct saved storages holding bytes (parameters excluded) and their bytes.
struct SavedAfterForward {
  std::int64_t bytes = 0;
  int tensors = 0;
};

struct StrategyContext {
  const RunConfig& cfg;
  Backend& backend;
  Communicator& comm;  // the data-parallel group's (the world's without --mesh)
  // --mesh's tensor-parallel group (null: none): the model is this rank's slice of it.
  Communicator* tp = nullptr;
  // HSDP (--strategy hsdp): `comm` is the rank's shard group, and this the replicate group
  // across which the reduced gradient shards are all-reduced (null: none).
  Communicator* replicate = nullptr;
  // The rank whose batch this rank draws (-1: comm's rank). HSDP's is the world rank.
  int data_rank = -1;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // Allocates persistent state (parameters, gradients, optimizer state) and initialises it.
  virtual void setup() = 0;
  // Draws the batch of step `index` on the host (outside the timed region).
  virtual void prepare_batch(int index) = 0;
  // One training step: forward, backward, communication, optimizer. Returns the rank's loss.
  virtual float step() = 0;
  // Gathers parameters, gradients and AdamW state onto every rank (collective).
  virtual HostState gather_state() = 0;
  // U: how many units parameters are gathered in (1 for ddp and zero1).
  virtual int units() const { return 1; }
  // The saves held at the end of the last step's forward.
  virtual SavedAfterForward saved_after_forward() const = 0;
};

// The strategy cfg.strategy names (harness/strategies/registry.cpp).
std::unique_ptr<Strategy> make_strategy(const StrategyContext& ctx);

}  // namespace shardscope
