// The NCCL communicator at world 1 (one process, no MPI): every collective and a grouped
// self send/recv on real device buffers. Multi-rank NCCL runs need mpirun and one GPU
// per rank. Skips without a device or without NCCL in the build.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "cuda_testbed.hpp"
#include "harness/comm/nccl_comm.hpp"
#include "shardscope/check.hpp"

namespace shardscope::testing {
namespace {

TEST(NcclComm, RefusesTheCpuBackend) {
#ifndef SHARDSCOPE_WITH_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  auto cpu = make_backend("cpu", 0);
  EXPECT_THROW(make_nccl_communicator(cpu.get()), UsageError);
#endif
}

TEST_F(CudaTest, NcclWorldOneCollectivesAndSelfP2p) {
#ifndef SHARDSCOPE_WITH_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  auto comm = make_nccl_communicator(backend_.get());
  ASSERT_EQ(comm->world(), 1);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->name(), "nccl");

  const std::size_t n = 1000;
  const auto x = random_floats(n, 81);
  ASSERT_TRUE(nonzero(x, "x"));
  Buffer buf = to_device(x, Category::grad);
  Buffer out = backend_->alloc(Category::comm, n);

  comm->all_reduce_sum(buf.data(), n);  // the sum over one rank
  EXPECT_TRUE(all_close(to_host(buf), x, 0.0, 0.0)) << "all_reduce";

  backend_->fill(out.data(), 0.0f, n);
  comm->reduce_scatter_sum(buf.data(), out.data(), n);
  EXPECT_TRUE(all_close(to_host(out), x, 0.0, 0.0)) << "reduce_scatter";

  backend_->fill(out.data(), 0.0f, n);
  comm->all_gather(buf.data(), out.data(), n);
  EXPECT_TRUE(all_close(to_host(out), x, 0.0, 0.0)) << "all_gather";

  comm->broadcast(buf.data(), n, 0);
  EXPECT_TRUE(all_close(to_host(buf), x, 0.0, 0.0)) << "broadcast";

  backend_->fill(out.data(), 0.0f, n);
  comm->p2p({P2pOp{true, buf.data(), n, 0}, P2pOp{false, out.data(), n, 0}});
  EXPECT_TRUE(all_close(to_host(out), x, 0.0, 0.0)) << "self send/recv";

  comm->barrier();
  const CommLedger& l = comm->ledger();
  EXPECT_EQ(l[CollKind::all_reduce].calls, 1);
  EXPECT_EQ(l[CollKind::all_reduce].bytes, static_cast<std::int64_t>(n * sizeof(float)));

  // The communicator's device memory, at init and after the first call of each kind.
  OutsidePoolBreakdown b;
  ASSERT_TRUE(backend_->outside_pool_breakdown(&b));
  ASSERT_EQ(b.nccl.size(), 1u);
  const NcclMemory& m = b.nccl[0];
  std::printf("[device] NCCL communicator %s (%d rank): %lld B at init (%s), %lld B after its first calls (%s)\n",
              m.communicator.c_str(), m.ranks, static_cast<long long>(m.init.bytes), m.init.source.c_str(),
              static_cast<long long>(m.total.bytes), m.total.source.c_str());
  EXPECT_EQ(m.communicator, "world");
  EXPECT_EQ(m.ranks, 1);
  EXPECT_GE(m.init.bytes, 0) << m.init.source;
  EXPECT_GE(m.total.bytes, m.init.bytes) << m.total.source;
#endif
}

// --overlap on's path: each collective posted on the communication stream behind an event
// of the compute stream, polled, waited for (the compute stream then waits for its done
// event), with the compute stream writing a buffer the posted call does not touch
// meanwhile; results as the blocking calls', exposed_ms within ms, nothing in flight after.
TEST_F(CudaTest, NcclWorldOnePostedCollectivesRunOnTheCommunicationStream) {
#ifndef SHARDSCOPE_WITH_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  auto comm = make_nccl_communicator(backend_.get());
  const std::size_t n = 1 << 20;
  const auto x = random_floats(n, 82);
  ASSERT_TRUE(nonzero(x, "x"));
  Buffer buf = to_device(x, Category::grad);
  Buffer rs = backend_->alloc(Category::comm, n);
  Buffer ag = backend_->alloc(Category::comm, n);
  Buffer other = backend_->alloc(Category::temp, n);
  backend_->fill(rs.data(), 0.0f, n);
  backend_->fill(ag.data(), 0.0f, n);

  CommTicket a = comm->start_all_reduce_sum(buf.data(), n);
  CommTicket r = comm->start_reduce_scatter_sum(buf.data(), rs.data(), n);
  CommTicket g = comm->start_all_gather(buf.data(), ag.data(), n);
  EXPECT_EQ(comm->in_flight(), 3);
  backend_->fill(other.data(), 1.0f, n);  // compute-stream work beside them
  comm->progress();
  comm->wait(g);
  comm->wait(r);
  comm->wait(a);
  EXPECT_EQ(comm->in_flight(), 0);
  EXPECT_TRUE(all_close(to_host(buf), x, 0.0, 0.0)) << "all_reduce";
  EXPECT_TRUE(all_close(to_host(rs), x, 0.0, 0.0)) << "reduce_scatter";
  EXPECT_TRUE(all_close(to_host(ag), x, 0.0, 0.0)) << "all_gather";
  EXPECT_TRUE(all_close(to_host(other), std::vector<float>(n, 1.0f), 0.0, 0.0)) << "the compute stream's fill";
  for (CollKind k : {CollKind::all_reduce, CollKind::reduce_scatter, CollKind::all_gather}) {
    const CollStats& st = comm->ledger()[k];
    EXPECT_EQ(st.calls, 1) << kCollKindNames[static_cast<int>(k)];
    EXPECT_EQ(st.bytes, static_cast<std::int64_t>(n * sizeof(float))) << kCollKindNames[static_cast<int>(k)];
    EXPECT_GE(st.exposed_ms, 0.0) << kCollKindNames[static_cast<int>(k)];
    EXPECT_LE(st.exposed_ms, st.ms) << kCollKindNames[static_cast<int>(k)];
  }
  std::printf("[device] NCCL posted (1 rank, %zu B each): all_reduce %.3f ms (exposed %.3f), reduce_scatter %.3f "
              "(%.3f), all_gather %.3f (%.3f)\n",
              n * sizeof(float), comm->ledger()[CollKind::all_reduce].ms,
              comm->ledger()[CollKind::all_reduce].exposed_ms, comm->ledger()[CollKind::reduce_scatter].ms,
              comm->ledger()[CollKind::reduce_scatter].exposed_ms, comm->ledger()[CollKind::all_gather].ms,
              comm->ledger()[CollKind::all_gather].exposed_ms);
  comm->reset_ledger();  // nothing left in flight
#endif
}

}  // namespace
}  // namespace shardscope::testing
