// `--comm fake` (`--emulate W:r`): one process plays rank r of a world of W. The public
// calls (comm.cpp) record exactly what a real rank r records, since the ledger depends
// only on the counts and the world; memory is exact while numerics and times are not
// (docs/design.md §5). No data comes from the other ranks, which are taken to contribute zeros:
// a receive buffer gets this rank's own part (its slot of an all-gather, its slice of a
// reduce-scatter) and zeros elsewhere, so that the emulated rank computes on defined,
// finite values instead of whatever the allocator handed out.
#include "harness/comm/fake_comm.hpp"

#include <cstring>
#include <string>

#include "shardscope/backend.hpp"
#include "shardscope/check.hpp"

namespace shardscope {

namespace {

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(int world, int rank, Backend* backend) : Communicator(rank, world, backend) {}
  std::string name() const override { return "fake"; }
  bool emulated() const override { return true; }

 protected:
  // The buffer already holds this rank's own contribution; the others add zeros.
  void do_all_reduce_sum(float*, std::size_t) override {}
  void do_all_reduce_max(float*, std::size_t) override {}  // the others' are taken to be no larger
  void do_reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count) override {
    if (backend() == nullptr || recv_count == 0) return;
    const float* own = send + static_cast<std::size_t>(rank()) * recv_count;
    if (own != recv) backend()->copy(recv, own, recv_count);
  }
  void do_all_gather(const float* send, float* recv, std::size_t send_count) override {
    if (backend() == nullptr || send_count == 0) return;
    const std::size_t own = static_cast<std::size_t>(rank()) * send_count;
    const std::size_t total = static_cast<std::size_t>(world()) * send_count;
    // The own shard first (it may sit inside recv: in place, or elsewhere), then zeros.
    if (send != recv + own) backend()->copy(recv + own, send, send_count);
    if (own > 0) backend()->fill(recv, 0.0f, own);
    if (own + send_count < total) backend()->fill(recv + own + send_count, 0.0f, total - own - send_count);
  }
  // bf16 host buffers (the bf16 MLP runs on the cpu backend): the own slot, zeros elsewhere.
  void do_all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t send_count) override {
    if (backend() == nullptr || send_count == 0) return;
    SHARDSCOPE_REQUIRE(backend()->name() == "cpu",
                       "--comm fake: a bf16 all-gather of device buffers is not built (host buffers only)");
    const std::size_t own = static_cast<std::size_t>(rank()) * send_count;
    const std::size_t total = static_cast<std::size_t>(world()) * send_count;
    if (send != recv + own) std::memmove(recv + own, send, send_count * sizeof(Bf16));
    std::memset(static_cast<void*>(recv), 0, own * sizeof(Bf16));
    std::memset(static_cast<void*>(recv + own + send_count), 0, (total - own - send_count) * sizeof(Bf16));
  }
  void do_all_reduce_sum_bf16(Bf16*, std::size_t) override {}  // the others add zeros
  // Non-root ranks keep what they hold, which is defined (their own earlier values).
  void do_broadcast(float*, std::size_t, int) override {}
  void do_p2p(const std::vector<P2pOp>& ops) override {
    if (backend() == nullptr) return;
    for (const P2pOp& op : ops)
      if (!op.is_send && op.count > 0) {
        if (op.dtype == DType::bf16) backend()->fill_bf16(as_bf16(op.buf), 0.0f, op.count);
        else backend()->fill(op.buf, 0.0f, op.count);
      }
  }
  void do_barrier() override {}
  // The group's rank r of its size: what the real group's communicator would be.
  std::unique_ptr<Communicator> do_split(int, int key, int size) override {
    return std::make_unique<FakeCommunicator>(size, key, backend());
  }
};

}  // namespace

std::unique_ptr<Communicator> make_fake_communicator(int world, int rank, Backend* backend) {
  return std::make_unique<FakeCommunicator>(world, rank, backend);
}

}  // namespace shardscope
