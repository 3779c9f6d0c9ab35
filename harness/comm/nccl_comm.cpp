// `--comm nccl`: collectives and p2p by NCCL on the CUDA backend's stream (docs/design.md §5).
// The Communicator base class times each call (syncing the backend before and after)
// and keeps the ledger; this file only enqueues the NCCL operations.
#include "harness/comm/nccl_comm.hpp"

#include <cstring>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "harness/backends/cuda_backend.hpp"
#include "shardscope/check.hpp"
#include "shardscope/cuda_check.hpp"

#ifdef SHARDSCOPE_WITH_MPI
#include <mpi.h>

#include "harness/comm/mpi_env.hpp"
#endif

namespace shardscope {

#ifdef SHARDSCOPE_WITH_NCCL
namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world, CudaBackend* backend, ncclComm_t comm)
      : Communicator(rank, world, backend), cuda_(backend), comm_(comm) {
    CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(float)));  // untracked: 4 B for barrier()
  }

  ~NcclCommunicator() override {
    // If the stream (or NCCL) already failed, the error that caused it is being reported:
    // abort the communicator (it does not wait for peers) instead of destroying it.
    const cudaError_t e = cudaStreamSynchronize(cuda_->stream());
    if (e != cudaSuccess || std::uncaught_exceptions() > 0) {
      (void)ncclCommAbort(comm_);
      (void)cudaFree(barrier_scratch_);  // may fail on a broken context; nothing to add then
      (void)cudaGetLastError();
      return;
    }
    NCCL_CHECK_NOEXCEPT(ncclCommDestroy(comm_));
    CUDA_CHECK_NOEXCEPT(cudaFree(barrier_scratch_));
  }

  std::string name() const override { return "nccl"; }

 protected:
  // Counts are equal on every rank for a collective, and on both sides of a p2p pair, so
  // skipping empty operations keeps every rank in step.
  void do_all_reduce_sum(float* buf, std::size_t count) override {
    if (count == 0) return;
    NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm_, cuda_->stream()));
  }

  void do_reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count) override {
    if (recv_count == 0) return;
    NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, ncclFloat, ncclSum, comm_,
                                 cuda_->stream()));
  }

  void do_all_gather(const float* send, float* recv, std::size_t send_count) override {
    if (send_count == 0) return;
    NCCL_CHECK(ncclAllGather(send, recv, send_count, ncclFloat, comm_, cuda_->stream()));
  }

  void do_broadcast(float* buf, std::size_t count, int root) override {
    if (count == 0) return;
    NCCL_CHECK(ncclBroadcast(buf, buf, count, ncclFloat, root, comm_, cuda_->stream()));
  }

  void do_p2p(const std::vector<P2pOp>& ops) override {
    for (const P2pOp& op : ops) {
      SHARDSCOPE_REQUIRE(op.peer >= 0 && op.peer < world(),
                         "p2p: peer " + std::to_string(op.peer) + " is not a rank of world " +
                             std::to_string(world()));
    }
    // One group, so that NCCL posts every send and receive together (no deadlock between
    // a send and the next receive). The group is always closed, even after a failure.
    NCCL_CHECK(ncclGroupStart());
    ncclResult_t first_error = ncclSuccess;
    std::string failed_call;
    for (const P2pOp& op : ops) {
      if (op.count == 0) continue;
      const ncclResult_t r =
          op.is_send ? ncclSend(op.buf, op.count, ncclFloat, op.peer, comm_, cuda_->stream())
                     : ncclRecv(op.buf, op.count, ncclFloat, op.peer, comm_, cuda_->stream());
      if (r != ncclSuccess && first_error == ncclSuccess) {
        first_error = r;
        failed_call = std::string(op.is_send ? "ncclSend" : "ncclRecv") + " to/from rank " +
                      std::to_string(op.peer);
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    if (first_error != ncclSuccess) {
      detail::throw_call_failed(failed_call.c_str(), detail::nccl_error_text(first_error),
                                __FILE__, __LINE__);
    }
    NCCL_CHECK(end);
  }

  void do_barrier() override {
    NCCL_CHECK(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat, ncclSum, comm_,
                             cuda_->stream()));
    cuda_->synchronize();
  }

 private:
  CudaBackend* cuda_;
  ncclComm_t comm_;
  float* barrier_scratch_ = nullptr;
};

}  // namespace
#endif  // SHARDSCOPE_WITH_NCCL

std::unique_ptr<Communicator> make_nccl_communicator(Backend* backend) {
#ifndef SHARDSCOPE_WITH_NCCL
  (void)backend;
  throw UsageError("--comm nccl: this build has no NCCL (nccl.h and libnccl were not found "
                   "when it was configured); use --comm mpi, self or fake");
#else
  auto* cuda = dynamic_cast<CudaBackend*>(backend);
  if (cuda == nullptr) throw UsageError("--comm nccl needs --backend cuda");

  // One GPU per rank: the ranks on a node must sit on distinct devices. Devices are
  // told apart by PCI bus id, not by index, so that per-rank CUDA_VISIBLE_DEVICES (as
  // `srun --gpus-per-task=1` sets it: every rank sees one "device 0") counts right.
  constexpr int kBusIdChars = 32;
  char bus_id[kBusIdChars] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, kBusIdChars, cuda->device()));
  int rank = 0;
  int world = 1;
  int local_ranks = 1;  // ranks of this job on this node
  int devices = 1;      // distinct GPUs they sit on
#ifdef SHARDSCOPE_WITH_MPI
  const bool with_mpi = mpi_active();
  if (with_mpi) {
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    int rc = MPI_Comm_size(node, &local_ranks);
    std::vector<char> all(static_cast<std::size_t>(local_ranks) * kBusIdChars);
    if (rc == MPI_SUCCESS)
      rc = MPI_Allgather(bus_id, kBusIdChars, MPI_CHAR, all.data(), kBusIdChars, MPI_CHAR, node);
    MPI_CHECK(MPI_Comm_free(&node));
    MPI_CHECK(rc);
    std::set<std::string> distinct;
    for (int i = 0; i < local_ranks; ++i)
      distinct.emplace(all.data() + static_cast<std::size_t>(i) * kBusIdChars,
                       strnlen(all.data() + static_cast<std::size_t>(i) * kBusIdChars, kBusIdChars));
    devices = static_cast<int>(distinct.size());
  }
#endif

  // Every rank learns whether any node is oversubscribed before anyone starts NCCL, so
  // that all refuse together instead of some hanging in init.
  const int oversubscribed = local_ranks > devices ? 1 : 0;
#ifdef SHARDSCOPE_WITH_MPI
  const int any_oversubscribed = with_mpi ? all_reduce_max(oversubscribed) : oversubscribed;
#else
  const int any_oversubscribed = oversubscribed;
#endif
  if (any_oversubscribed != 0) {
    throw UsageError(
        "--comm nccl needs one GPU per rank, but " +
        (oversubscribed != 0 ? std::to_string(local_ranks) + " ranks on this node share " +
                                   std::to_string(devices) + " GPU(s)"
                             : std::string("another node has more ranks than GPUs")) +
        "; use --comm mpi to share GPUs, or --emulate W:r");
  }

  ncclUniqueId id{};
  if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
#ifdef SHARDSCOPE_WITH_MPI
  if (with_mpi) {
    MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, MPI_COMM_WORLD));
  }
#endif

  CUDA_CHECK(cudaSetDevice(cuda->device()));  // NCCL binds the communicator to this device
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, world, id, rank));
  try {
    return std::make_unique<NcclCommunicator>(rank, world, cuda, comm);
  } catch (...) {
    (void)ncclCommDestroy(comm);
    throw;
  }
#endif  // SHARDSCOPE_WITH_NCCL
}

std::string nccl_version_text() {
#ifdef SHARDSCOPE_WITH_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess || v <= 0) return {};
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
#else
  return {};
#endif
}

}  // namespace shardscope
