// `--comm self`: world 1. A sum over one rank is the rank's own data, a shard is the
// whole buffer, and there is nobody to send to.
#include "harness/comm/self_comm.hpp"

#include <cstring>
#include <string>

#include "shardscope/backend.hpp"
#include "shardscope/check.hpp"

namespace shardscope {

namespace {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(Backend* backend) : Communicator(0, 1, backend) {}
  std::string name() const override { return "self"; }

 protected:
  void do_all_reduce_sum(float*, std::size_t) override {}
  void do_all_reduce_max(float*, std::size_t) override {}
  void do_reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count) override {
    copy(recv, send, recv_count);
  }
  void do_all_gather(const float* send, float* recv, std::size_t send_count) override {
    copy(recv, send, send_count);
  }
  // bf16 host buffers (the bf16 MLP runs on the cpu backend): a byte copy.
  void do_all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t send_count) override {
    SHARDSCOPE_REQUIRE(backend() == nullptr || backend()->name() == "cpu",
                       "--comm self: a bf16 all-gather of device buffers is not built (host buffers only)");
    if (send != recv && send_count > 0) std::memcpy(recv, send, send_count * sizeof(Bf16));
  }
  void do_all_reduce_sum_bf16(Bf16*, std::size_t) override {}  // a world of 1: the sum is the buffer
  void do_broadcast(float*, std::size_t, int) override {}
  void do_p2p(const std::vector<P2pOp>& ops) override {
    throw RunError(std::string("--comm self: ") + (ops[0].is_send ? "send to" : "recv from") +
                   " rank " + std::to_string(ops[0].peer) +
                   ": a world of 1 has no peers for point-to-point");
  }
  void do_barrier() override {}
  std::unique_ptr<Communicator> do_split(int, int, int) override {
    return std::make_unique<SelfCommunicator>(backend());
  }

 private:
  void copy(float* dst, const float* src, std::size_t n) {
    if (dst == src || n == 0) return;
    if (backend() != nullptr)
      backend()->copy(dst, src, n);
    else
      std::memcpy(dst, src, n * sizeof(float));
  }
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator(Backend* backend) {
  return std::make_unique<SelfCommunicator>(backend);
}

}  // namespace shardscope
