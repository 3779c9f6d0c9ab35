// `--comm nccl`: collectives and p2p by NCCL on the CUDA backend's stream (docs/design.md §5).
// The Communicator base class times each call (syncing the backend before and after)
// and keeps the ledger; this file enqueues the NCCL operations and waits for each under
// the watchdog (watchdog.hpp): cudaStreamQuery and ncclCommGetAsyncError, polled until
// the stream drains, NCCL reports an error, or --comm-timeout passes; on either failure
// the communicator is aborted (ncclCommAbort) and the rank throws, and the run command
// ends the job with MPI_Abort. The non-blocking calls (--overlap on) run on a
// communication stream of their own, ordered by events (post_*). ncclCommInitRank and
// the bootstrap before it stay blocking (NCCL's own waits).
#include "harness/comm/nccl_comm.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "harness/backends/cuda_backend.hpp"
#include "harness/comm/watchdog.hpp"
#include "shardscope/check.hpp"
#include "shardscope/cuda_check.hpp"

#ifdef SHARDSCOPE_WITH_MPI
#include <mpi.h>

#include "harness/comm/mpi_env.hpp"
#endif

namespace shardscope {

#ifdef SHARDSCOPE_WITH_NCCL
namespace {

// Host function for the SHARDSCOPE_TEST_STALL hook: sleeps on the stream's behalf for
// the milliseconds its argument carries (a value, so nothing it points to can go first).
void CUDART_CB sleep_on_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::uintptr_t>(ms)));
}

class NcclCommunicator final : public Communicator {
 public:
  // `memory`: where the backend keeps this communicator's device memory (add_nccl_memory).
  NcclCommunicator(int rank, int world, CudaBackend* backend, ncclComm_t comm, std::size_t memory)
      : Communicator(rank, world, backend), cuda_(backend), comm_(comm), memory_(memory) {
    CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(float)));  // untracked: 4 B for barrier()
    // The communication stream of the non-blocking calls (--overlap on), as torch's
    // ProcessGroupNCCL keeps one beside the compute stream.
    CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  }

  // On an error path (an exception unwinding, NCCL's asynchronous error, a failed stream)
  // the communicator is aborted before anything synchronises: ncclCommAbort does not wait
  // for peers and stops NCCL's kernels, so neither this nor the backend's teardown can
  // block on a collective that will never finish. Otherwise queued work is waited for,
  // within --comm-timeout, and the communicator destroyed.
  ~NcclCommunicator() override {
    if (!aborted_ && std::uncaught_exceptions() > 0) abort_comm();
    if (!aborted_) {
      std::string why;
      bool drained = false;
      try {
        drained = wait_until([&] { return poll(&why) != Poll::pending; }, timeout()) && why.empty();
      } catch (...) {
      }
      if (!drained) abort_comm();
    }
    if (aborted_) {
      for (auto& [id, p] : pending_) destroy_events(p);
      (void)cudaStreamDestroy(comm_stream_);
      (void)cudaFree(barrier_scratch_);  // may fail on a broken context; nothing to add then
      (void)cudaGetLastError();
      return;
    }
    NCCL_CHECK_NOEXCEPT(ncclCommDestroy(comm_));
    for (auto& [id, p] : pending_) destroy_events(p);
    CUDA_CHECK_NOEXCEPT(cudaStreamDestroy(comm_stream_));
    CUDA_CHECK_NOEXCEPT(cudaFree(barrier_scratch_));
  }

  std::string name() const override { return "nccl"; }

 protected:
  // Counts are equal on every rank for a collective, and on both sides of a p2p pair, so
  // skipping empty operations keeps every rank in step.
  // Each call waits for its stream under the watchdog (wait_stream), so the base class's
  // synchronisation after it finds nothing left to wait for.
  void do_all_reduce_sum(float* buf, std::size_t count) override {
    usable();
    const FirstCall first(*this, Op::all_reduce);
    if (count > 0)
      NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm_, cuda_->stream()));
    wait_stream();
  }

  void do_all_reduce_max(float* buf, std::size_t count) override {
    usable();
    const FirstCall first(*this, Op::all_reduce);
    if (count > 0)
      NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclMax, comm_, cuda_->stream()));
    wait_stream();
  }

  void do_reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count) override {
    usable();
    const FirstCall first(*this, Op::reduce_scatter);
    if (recv_count > 0)
      NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, ncclFloat, ncclSum, comm_, cuda_->stream()));
    wait_stream();
  }

  void do_all_gather(const float* send, float* recv, std::size_t send_count) override {
    usable();
    const FirstCall first(*this, Op::all_gather);
    if (send_count > 0)
      NCCL_CHECK(ncclAllGather(send, recv, send_count, ncclFloat, comm_, cuda_->stream()));
    wait_stream();
  }

  void do_all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t send_count) override {
    usable();
    const FirstCall first(*this, Op::all_gather);
    if (send_count > 0)
      NCCL_CHECK(ncclAllGather(send, recv, send_count, ncclBfloat16, comm_, cuda_->stream()));
    wait_stream();
  }

  void do_broadcast(float* buf, std::size_t count, int root) override {
    usable();
    const FirstCall first(*this, Op::broadcast);
    if (count > 0)
      NCCL_CHECK(ncclBroadcast(buf, buf, count, ncclFloat, root, comm_, cuda_->stream()));
    wait_stream();
  }

  void do_p2p(const std::vector<P2pOp>& ops) override {
    usable();
    const FirstCall first(*this, Op::p2p);
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
      const ncclDataType_t type = op.dtype == DType::bf16 ? ncclBfloat16 : ncclFloat;
      const ncclResult_t r =
          op.is_send ? ncclSend(op.buf, op.count, type, op.peer, comm_, cuda_->stream())
                     : ncclRecv(op.buf, op.count, type, op.peer, comm_, cuda_->stream());
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
    wait_stream();
  }

  void do_barrier() override {
    usable();
    const FirstCall first(*this, Op::barrier);
    NCCL_CHECK(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat, ncclSum, comm_,
                             cuda_->stream()));
    wait_stream();
  }

  // ncclCommSplit (NCCL >= 2.18): the group is the ranks of one color, ordered by key;
  // blocking, as ncclCommInitRank is.
  std::unique_ptr<Communicator> do_split(int color, int key, int size) override {
    usable();
    ncclComm_t c = nullptr;
    const MeasuredPart before = cuda_->device_bytes_now();  // the group's own memory, as at init
    NCCL_CHECK(ncclCommSplit(comm_, color, key, &c, nullptr));
    try {
      const MeasuredPart init = CudaBackend::growth(before, cuda_->device_bytes_now());
      const std::size_t memory =
          cuda_->add_nccl_memory({"split of world, color " + std::to_string(color), size, init, init});
      return std::make_unique<NcclCommunicator>(key, size, cuda_, c, memory);
    } catch (...) {
      (void)ncclCommDestroy(c);
      throw;
    }
  }

  // Non-blocking (--overlap on), on the communication stream: it waits for an event
  // recorded on the compute stream after the buffers' producers (and their stream-ordered
  // allocation), runs the collective and records `done`; wait() polls `done` under the
  // watchdog and makes the compute stream wait for it, so that whatever the compute
  // stream does next (reading the result, freeing the buffers) follows the collective:
  // the record-stream rule, with the free where the caller waits.
  void post_all_reduce_sum(std::int64_t id, float* buf, std::size_t count) override {
    on_comm_stream(id, Op::all_reduce, [&](cudaStream_t st) {
      if (count > 0) NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm_, st));
    });
  }

  void post_reduce_scatter_sum(std::int64_t id, const float* send, float* recv, std::size_t recv_count) override {
    on_comm_stream(id, Op::reduce_scatter, [&](cudaStream_t st) {
      if (recv_count > 0) NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, ncclFloat, ncclSum, comm_, st));
    });
  }

  void post_all_gather(std::int64_t id, const float* send, float* recv, std::size_t send_count) override {
    on_comm_stream(id, Op::all_gather, [&](cudaStream_t st) {
      if (send_count > 0) NCCL_CHECK(ncclAllGather(send, recv, send_count, ncclFloat, comm_, st));
    });
  }

  void post_all_gather_bf16(std::int64_t id, const Bf16* send, Bf16* recv, std::size_t send_count) override {
    on_comm_stream(id, Op::all_gather, [&](cudaStream_t st) {
      if (send_count > 0) NCCL_CHECK(ncclAllGather(send, recv, send_count, ncclBfloat16, comm_, st));
    });
  }

  bool test_posted(std::int64_t id) override {
    auto it = pending_.find(id);
    if (it == pending_.end()) return true;
    std::string why;
    const Poll p = poll_event(it->second.done, &why);
    if (p == Poll::pending) return false;
    finish(it, p, why, true);
    return true;
  }

  void wait_posted(std::int64_t id) override {
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    std::string why;
    Poll p = Poll::pending;
    const bool finished = wait_until(
        [&] {
          p = poll_event(it->second.done, &why);
          return p != Poll::pending;
        },
        timeout());
    finish(it, p, why, finished);
  }

  // The test hook stalls the stream, not the host: the collective then stays queued
  // behind a host function that sleeps, as behind a peer that never arrives.
  void do_stall(double seconds) override {
    const auto ms = static_cast<std::uintptr_t>(seconds * 1000.0);
    CUDA_CHECK(cudaLaunchHostFunc(cuda_->stream(), sleep_on_stream, reinterpret_cast<void*>(ms)));
  }

 private:
  enum class Poll { done, pending, failed };
  // The kinds of operation NCCL connects for separately (FirstCall).
  enum class Op { all_reduce, reduce_scatter, all_gather, broadcast, p2p, barrier, count };

  // One look at the stream and at NCCL, as nccl-tests' testStreamSynchronize takes it:
  // done when the stream has drained; failed (with `why`) when NCCL reports an
  // asynchronous error or the stream an error; pending otherwise.
  Poll poll(std::string* why) noexcept {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      *why = "failed: NCCL reports " + detail::nccl_error_text(r != ncclSuccess ? r : async);
      return Poll::failed;
    }
    const cudaError_t e = cudaStreamQuery(cuda_->stream());
    if (e == cudaSuccess) return Poll::done;
    if (e == cudaErrorNotReady) return Poll::pending;
    (void)cudaGetLastError();
    *why = "failed: the stream reports " + detail::cuda_error_text(e);
    return Poll::failed;
  }

  // As poll(), for one event of the communication stream.
  Poll poll_event(cudaEvent_t done, std::string* why) noexcept {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      *why = "failed: NCCL reports " + detail::nccl_error_text(r != ncclSuccess ? r : async);
      return Poll::failed;
    }
    const cudaError_t e = cudaEventQuery(done);
    if (e == cudaSuccess) return Poll::done;
    if (e == cudaErrorNotReady) return Poll::pending;
    (void)cudaGetLastError();
    *why = "failed: the communication stream reports " + detail::cuda_error_text(e);
    return Poll::failed;
  }

  struct Pending {
    cudaEvent_t ready = nullptr;  // on the compute stream: the buffers are ready
    cudaEvent_t done = nullptr;   // on the communication stream: the collective is
  };

  static void destroy_events(Pending& p) noexcept {
    if (p.ready != nullptr) (void)cudaEventDestroy(p.ready);
    if (p.done != nullptr) (void)cudaEventDestroy(p.done);
    p = {};
  }

  // Records `ready` on the compute stream, makes the communication stream wait for it,
  // enqueues `enqueue(comm_stream_)` and records `done` behind it. The first call of a
  // kind connects NCCL's buffers for it at the enqueue, on the host (FirstCall measures
  // that, as for a blocking call).
  template <class F>
  void on_comm_stream(std::int64_t id, Op op, F&& enqueue) {
    usable();
    const FirstCall first(*this, op);
    Pending p;
    try {
      CUDA_CHECK(cudaEventCreateWithFlags(&p.ready, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventRecord(p.ready, cuda_->stream()));
      CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, p.ready, 0));
      enqueue(comm_stream_);
      CUDA_CHECK(cudaEventRecord(p.done, comm_stream_));
    } catch (...) {
      destroy_events(p);
      throw;
    }
    pending_[id] = p;
  }

  // The end of a non-blocking collective's wait: complete (the compute stream waits for
  // it), or failed or past --comm-timeout (`finished` false): the communicator is aborted
  // and the rank throws the watchdog's line.
  void finish(std::map<std::int64_t, Pending>::iterator it, Poll p, const std::string& why, bool finished) {
    if (finished && p == Poll::done) {
      const cudaError_t e = cudaStreamWaitEvent(cuda_->stream(), it->second.done, 0);
      destroy_events(it->second);
      pending_.erase(it);
      CUDA_CHECK(e);
      return;
    }
    abort_comm();
    throw RunError(watchdog_text(finished ? why + " (within --comm-timeout " + seconds_text(timeout()) + " s)"
                                          : timed_out_text()));
  }

  // Waits for the stream under the watchdog; on an asynchronous error or when
  // --comm-timeout passes, aborts the communicator and throws RunError with the
  // watchdog's line (the run command then calls MPI_Abort).
  void wait_stream() {
    std::string why;
    const bool finished = wait_until([&] { return poll(&why) != Poll::pending; }, timeout());
    if (finished && why.empty()) return;
    abort_comm();
    throw RunError(watchdog_text(finished ? why + " (within --comm-timeout " + seconds_text(timeout()) + " s)"
                                          : timed_out_text()));
  }

  void abort_comm() noexcept {
    if (aborted_) return;
    (void)ncclCommAbort(comm_);
    aborted_ = true;
  }

  // An aborted communicator takes no more calls.
  void usable() const {
    if (aborted_) throw RunError("rank " + std::to_string(rank()) + ": the NCCL communicator was aborted");
  }

  // NCCL connects lazily (NCCL_RUNTIME_CONNECT, NCCL 2.22 and later): the first call of
  // each kind of operation may allocate the buffers of the algorithm it needs. The growth of
  // the process's device memory around that first call is added to this communicator's
  // (nothing else allocates on the device while a call is being made: the pool grows
  // only when the host asks it to).
  class FirstCall {
   public:
    FirstCall(NcclCommunicator& c, Op op) : c_(c) {
      bool& seen = c.seen_[static_cast<std::size_t>(op)];
      if (seen) return;
      seen = true;
      active_ = true;
      before_ = c.cuda_->device_bytes_now();
    }
    // Not after a failed call: the communicator is aborted, and its figure no longer matters.
    ~FirstCall() {
      if (!active_ || std::uncaught_exceptions() > 0) return;
      try {
        c_.cuda_->add_nccl_growth(c_.memory_, CudaBackend::growth(before_, c_.cuda_->device_bytes_now()));
      } catch (...) {  // a figure lost is not worth a failed run
      }
    }
    FirstCall(const FirstCall&) = delete;
    FirstCall& operator=(const FirstCall&) = delete;

   private:
    NcclCommunicator& c_;
    bool active_ = false;
    MeasuredPart before_;
  };

  CudaBackend* cuda_;
  ncclComm_t comm_;
  std::size_t memory_;
  std::array<bool, static_cast<std::size_t>(Op::count)> seen_{};
  cudaStream_t comm_stream_ = nullptr;
  std::map<std::int64_t, Pending> pending_;  // non-blocking collectives not yet seen complete
  float* barrier_scratch_ = nullptr;
  bool aborted_ = false;
};

}  // namespace
#endif  // SHARDSCOPE_WITH_NCCL

std::unique_ptr<Communicator> make_nccl_communicator(Backend* backend, double timeout_s) {
#ifndef SHARDSCOPE_WITH_NCCL
  (void)backend;
  (void)timeout_s;
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
  if (with_mpi) {  // under the watchdog too: a rank that never comes must not hold the others
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Ibcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, MPI_COMM_WORLD, &req));
    const bool sent = wait_until(
        [&] {
          int flag = 0;
          MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
          return flag != 0;
        },
        timeout_s);
    if (!sent)
      throw RunError("rank " + std::to_string(rank) + ": the broadcast of NCCL's unique id (" +
                     std::to_string(sizeof(id)) + " B) did not complete within --comm-timeout " +
                     seconds_text(timeout_s) + " s (a peer is stuck or dead)");
  }
#endif

  CUDA_CHECK(cudaSetDevice(cuda->device()));  // NCCL binds the communicator to this device
  ncclComm_t comm = nullptr;
  // Its device memory at creation: the process's figure around ncclCommInitRank (the pool
  // is not touched meanwhile). Its first calls add to it (NcclCommunicator::FirstCall).
  const MeasuredPart before_init = cuda->device_bytes_now();
  NCCL_CHECK(ncclCommInitRank(&comm, world, id, rank));
  try {
    const MeasuredPart init = CudaBackend::growth(before_init, cuda->device_bytes_now());
    const std::size_t memory = cuda->add_nccl_memory({"world", world, init, init});
    auto made = std::make_unique<NcclCommunicator>(rank, world, cuda, comm, memory);
    made->set_timeout(timeout_s);
    return made;
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
