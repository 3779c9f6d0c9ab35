// `--comm fake` (`--emulate W:r`): one process plays rank r of a world of W. The public
// calls (comm.cpp) record exactly what a real rank r records, since the ledger depends
// only on the counts and the world; the do_* move nothing, so every buffer keeps its
// contents and memory is exact while numerics and times are not (DESIGN §5).
#include "harness/comm/fake_comm.hpp"

#include <string>

namespace shardscope {

namespace {

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(int world, int rank, Backend* backend) : Communicator(rank, world, backend) {}
  std::string name() const override { return "fake"; }
  bool emulated() const override { return true; }

 protected:
  void do_all_reduce_sum(float*, std::size_t) override {}
  void do_reduce_scatter_sum(const float*, float*, std::size_t) override {}
  void do_all_gather(const float*, float*, std::size_t) override {}
  void do_broadcast(float*, std::size_t, int) override {}
  void do_p2p(const std::vector<P2pOp>&) override {}
  void do_barrier() override {}
};

}  // namespace

std::unique_ptr<Communicator> make_fake_communicator(int world, int rank, Backend* backend) {
  return std::make_unique<FakeCommunicator>(world, rank, backend);
}

}  // namespace shardscope
