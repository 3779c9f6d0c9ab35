// `--comm mpi`: collectives and p2p over a duplicate of MPI_COMM_WORLD.
//
// Host buffers go to MPI as they are. A backend whose memory is not host memory (any
// backend but "cpu", e.g. CUDA) is staged through the backend's staging memory (pinned
// on CUDA, kept between calls) with its own download/upload, so this file needs no CUDA. Counts above max_count_ floats (MPI
// counts are int) are split into several calls. Every MPI return code is checked: the
// communicator uses MPI_ERRORS_RETURN, and a failure throws RunError naming the rank.
//
// The watchdog (watchdog.hpp): every operation is non-blocking (MPI_Iallreduce,
// MPI_Ireduce_scatter, MPI_Iallgather, MPI_Ibcast, MPI_Ireduce, MPI_Isend/Irecv,
// MPI_Ibarrier), and one call's requests are tested together with MPI_Testall, backing
// off, until they complete or --comm-timeout passes. Then the rank throws RunError with
// the watchdog's line; the run command calls MPI_Abort, which ends every rank, the stuck
// one included. The non-blocking calls (--overlap on) keep their requests by collective:
// progress() tests them, wait() tests them in the same bounded loop.
#ifdef SHARDSCOPE_WITH_MPI

#include "harness/comm/mpi_comm.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "harness/comm/mpi_env.hpp"
#include "harness/comm/watchdog.hpp"
#include "shardscope/backend.hpp"
#include "shardscope/check.hpp"

namespace shardscope {

namespace {

// MPI has no bf16: a sum of 16-bit words read as bf16, each addition rounded to bf16.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const Bf16* a = static_cast<const Bf16*>(in);
  Bf16* b = static_cast<Bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(from_bf16(a[i]) + from_bf16(b[i]));
}

MPI_Op bf16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op made = MPI_OP_NULL;
    MPI_CHECK(MPI_Op_create(&bf16_sum, 1, &made));
    return made;
  }();
  return op;
}

// True when [a, a+na) and [b, b+nb) share an element.
bool overlaps(const float* a, std::size_t na, const float* b, std::size_t nb) {
  if (na == 0 || nb == 0) return false;
  std::less<const float*> lt;
  return lt(a, b + nb) && lt(b, a + na);
}

MPI_Comm dup_world() {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c));
  // Errors come back as codes (MPI_CHECK turns them into RunError), not as an abort.
  MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return c;
}

int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_CHECK(MPI_Comm_rank(c, &r));
  return r;
}

int comm_size(MPI_Comm c) {
  int n = 0;
  MPI_CHECK(MPI_Comm_size(c, &n));
  return n;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(Backend* backend, std::size_t max_count)
      : MpiCommunicator(dup_world(), backend, max_count) {}
  ~MpiCommunicator() override {
    // After a timeout requests are still posted on comm_: leave it to MPI_Abort.
    if (comm_ != MPI_COMM_NULL && mpi_active() && !timed_out_) MPI_Comm_free(&comm_);
  }
  std::string name() const override { return "mpi"; }

 protected:
  void do_all_reduce_sum(float* buf, std::size_t count) override { all_reduce(buf, count, MPI_SUM); }
  void do_all_reduce_max(float* buf, std::size_t count) override { all_reduce(buf, count, MPI_MAX); }

  void do_reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count) override {
    const std::size_t total = recv_count * static_cast<std::size_t>(world());
    if (!staged_) return host_reduce_scatter(send, recv, recv_count);
    float* hs = backend()->staging(0, total);
    float* hr = backend()->staging(1, recv_count);
    backend()->download(hs, send, total);
    host_reduce_scatter(hs, hr, recv_count);
    backend()->upload(recv, hr, recv_count);
  }

  void do_all_gather(const float* send, float* recv, std::size_t send_count) override {
    const std::size_t total = send_count * static_cast<std::size_t>(world());
    if (!staged_) return host_all_gather(send, recv, send_count);
    float* hs = backend()->staging(0, send_count);
    float* hr = backend()->staging(1, total);
    backend()->download(hs, send, send_count);
    host_all_gather(hs, hr, send_count);
    backend()->upload(recv, hr, total);
  }

  // bf16 host buffers (the bf16 MLP runs on the cpu backend), as 16-bit words.
  void do_all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t send_count) override {
    SHARDSCOPE_REQUIRE(!staged_, "--comm mpi: a bf16 all-gather staged through host memory is not built (host "
                                 "buffers only)");
    post_host_all_gather_bf16(send, recv, send_count);
    wait_posted();
  }

  // bf16 host buffers as 16-bit words, summed by bf16_sum (each addition rounded to bf16).
  void do_all_reduce_sum_bf16(Bf16* buf, std::size_t count) override {
    SHARDSCOPE_REQUIRE(!staged_, "--comm mpi: a bf16 all-reduce staged through host memory is not built (host "
                                 "buffers only)");
    for_chunks(count, [&](std::size_t off, int n) {
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf + off, n, MPI_UINT16_T, bf16_sum_op(), comm_, post()));
    });
    wait_posted();
  }

  void do_broadcast(float* buf, std::size_t count, int root) override {
    if (!staged_) return host_broadcast(buf, count, root);
    float* h = backend()->staging(0, count);
    if (rank() == root) backend()->download(h, buf, count);
    host_broadcast(h, count, root);
    if (rank() != root) backend()->upload(buf, h, count);
  }

  // Every op posted (Isend/Irecv, in the caller's order, so ops to one peer match in
  // order), then one wait for all: a two-way exchange cannot deadlock.
  void do_p2p(const std::vector<P2pOp>& ops) override {
    std::vector<float*> host(staged_ ? ops.size() : 0);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const P2pOp& op = ops[i];
      float* buf = op.buf;
      if (op.dtype == DType::bf16) {  // its bytes, as they are (host buffers: autocast runs on the cpu)
        SHARDSCOPE_REQUIRE(!staged_, "mpi: a bf16 p2p through staged host memory is not built");
        char* bytes = reinterpret_cast<char*>(buf);
        for_chunks(op.count * 2, [&](std::size_t off, int n) {
          if (op.is_send)
            MPI_CHECK(MPI_Isend(bytes + off, n, MPI_BYTE, op.peer, kTag, comm_, post()));
          else
            MPI_CHECK(MPI_Irecv(bytes + off, n, MPI_BYTE, op.peer, kTag, comm_, post()));
        });
        continue;
      }
      if (staged_) {  // one staging slot per op, so every op has its own host buffer
        host[i] = backend()->staging(static_cast<int>(i), op.count);
        if (op.is_send) backend()->download(host[i], op.buf, op.count);
        buf = host[i];
      }
      for_chunks(op.count, [&](std::size_t off, int n) {
        if (op.is_send)
          MPI_CHECK(MPI_Isend(buf + off, n, MPI_FLOAT, op.peer, kTag, comm_, post()));
        else
          MPI_CHECK(MPI_Irecv(buf + off, n, MPI_FLOAT, op.peer, kTag, comm_, post()));
      });
    }
    wait_posted();
    if (staged_)
      for (std::size_t i = 0; i < ops.size(); ++i)
        if (!ops[i].is_send) backend()->upload(ops[i].buf, host[i], ops[i].count);
  }

  void do_barrier() override {
    MPI_CHECK(MPI_Ibarrier(comm_, post()));
    wait_posted();
  }

  // MPI_Comm_split of this communicator: the group is the ranks of one color, ordered by key.
  std::unique_ptr<Communicator> do_split(int color, int key, int) override {
    MPI_Comm c = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm_, color, key, &c));
    MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return std::unique_ptr<Communicator>(new MpiCommunicator(c, backend(), max_count_));
  }

  // Non-blocking (--overlap on): the requests are kept under the collective's id and
  // tested by progress() and wait(). Staged buffers (a CUDA backend) complete at the
  // post, through the blocking path: their upload needs the host copy back first.
  void post_all_reduce_sum(std::int64_t id, float* buf, std::size_t count) override {
    if (staged_) return do_all_reduce_sum(buf, count);
    post_host_all_reduce(buf, count, MPI_SUM);
    keep_posted(id, {});
  }

  void post_reduce_scatter_sum(std::int64_t id, const float* send, float* recv, std::size_t recv_count) override {
    if (staged_) return do_reduce_scatter_sum(send, recv, recv_count);
    std::vector<float> keep;
    post_host_reduce_scatter(send, recv, recv_count, keep);
    keep_posted(id, std::move(keep));
  }

  void post_all_gather_bf16(std::int64_t id, const Bf16* send, Bf16* recv, std::size_t send_count) override {
    if (staged_) return do_all_gather_bf16(send, recv, send_count);
    post_host_all_gather_bf16(send, recv, send_count);
    keep_posted(id, {});
  }

  void post_all_gather(std::int64_t id, const float* send, float* recv, std::size_t send_count) override {
    if (staged_) return do_all_gather(send, recv, send_count);
    std::vector<float> keep;
    post_host_all_gather(send, recv, send_count, keep);
    keep_posted(id, std::move(keep));
  }

  bool test_posted(std::int64_t id) override {
    auto it = pending_.find(id);
    if (it == pending_.end()) return true;  // completed at its post
    if (!test_all(it->second.requests)) return false;
    pending_.erase(it);
    return true;
  }

  void wait_posted(std::int64_t id) override {
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    if (!wait_until([&] { return test_all(it->second.requests); }, timeout())) {
      timed_out_ = true;
      throw RunError(watchdog_text(timed_out_text()));
    }
    pending_.erase(it);
  }

 private:
  static constexpr int kTag = 0;

  MpiCommunicator(MPI_Comm comm, Backend* backend, std::size_t max_count)
      : Communicator(comm_rank(comm), comm_size(comm), backend),
        comm_(comm),
        max_count_(max_count),
        staged_(backend != nullptr && backend->name() != "cpu") {}

  // Waits for every request in posted_ (MPI_Testall, backing off) and clears it; when
  // --comm-timeout passes first, throws RunError with the watchdog's line.
  void wait_posted() {
    if (posted_.empty()) return;
    if (!wait_until([&] { return test_all(posted_); }, timeout())) {
      timed_out_ = true;
      throw RunError(watchdog_text(timed_out_text()));
    }
    posted_.clear();
  }

  // True when every request has completed (MPI_Testall, which also progresses them).
  static bool test_all(std::vector<MPI_Request>& requests) {
    if (requests.empty()) return true;
    int flag = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE));
    return flag != 0;
  }

  // Moves posted_ (and the copies its requests read) under the collective's id.
  void keep_posted(std::int64_t id, std::vector<float> keep) {
    if (posted_.empty()) return;  // nothing to move: an empty collective
    Pending& p = pending_[id];
    p.requests = std::move(posted_);
    p.keep = std::move(keep);
    posted_.clear();
  }

  // A fresh slot in posted_ for the next non-blocking call.
  MPI_Request* post() { return &posted_.emplace_back(MPI_REQUEST_NULL); }

  // Calls f(offset, n) for consecutive pieces of at most max_count_ floats.
  template <class F>
  void for_chunks(std::size_t count, F&& f) const {
    for (std::size_t off = 0; off < count; off += max_count_)
      f(off, static_cast<int>(std::min(max_count_, count - off)));
  }

  // --- host buffers from here on ---

  void all_reduce(float* buf, std::size_t count, MPI_Op op) {
    if (!staged_) return host_all_reduce(buf, count, op);
    float* h = backend()->staging(0, count);
    backend()->download(h, buf, count);
    host_all_reduce(h, count, op);
    backend()->upload(buf, h, count);
  }

  // Each host_* posts its requests into posted_ and waits for them; the post_host_*
  // beneath only post (the non-blocking calls keep the requests, see post_*). Copies
  // that MPI reads from go to `keep`, which must live until the requests complete.
  void host_all_reduce(float* buf, std::size_t count, MPI_Op op) {
    post_host_all_reduce(buf, count, op);
    wait_posted();
  }

  void host_reduce_scatter(const float* send, float* recv, std::size_t rc) {
    std::vector<float> keep;
    post_host_reduce_scatter(send, recv, rc, keep);
    wait_posted();
  }

  void host_all_gather(const float* send, float* recv, std::size_t sc) {
    std::vector<float> keep;
    post_host_all_gather(send, recv, sc, keep);
    wait_posted();
  }

  void post_host_all_reduce(float* buf, std::size_t count, MPI_Op op) {
    for_chunks(count, [&](std::size_t off, int n) {
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf + off, n, MPI_FLOAT, op, comm_, post()));
    });
  }

  // send(world * rc) -> recv(rc). recv may lie inside send (an in-place shard): MPI
  // forbids aliased buffers, so such a send is copied first.
  void post_host_reduce_scatter(const float* send, float* recv, std::size_t rc, std::vector<float>& keep) {
    const std::size_t total = rc * static_cast<std::size_t>(world());
    if (overlaps(send, total, recv, rc)) {
      keep.assign(send, send + total);
      send = keep.data();
    }
    if (rc <= max_count_) {
      if (rc == 0) return;
      // MPI_Reduce_scatter with equal counts, not MPI_Reduce_scatter_block: Open MPI
      // 4.1's block variant took 1.1 ms for 2 MiB at 2 ranks where this takes 0.15 ms
      // (bench/strategy_step; the same bytes and result).
      const std::vector<int> counts(static_cast<std::size_t>(world()), static_cast<int>(rc));
      MPI_CHECK(MPI_Ireduce_scatter(send, recv, counts.data(), MPI_FLOAT, MPI_SUM, comm_, post()));
      return;
    }
    // Shards over MPI's int count: reduce each shard's pieces to their owner.
    for (int d = 0; d < world(); ++d)
      for_chunks(rc, [&](std::size_t off, int n) {
        const float* src = send + static_cast<std::size_t>(d) * rc + off;
        float* dst = d == rank() ? recv + off : nullptr;
        MPI_CHECK(MPI_Ireduce(src, dst, n, MPI_FLOAT, MPI_SUM, d, comm_, post()));
      });
  }

  // send(sc) -> recv(world * sc). send may be this rank's slot of recv (in place).
  void post_host_all_gather(const float* send, float* recv, std::size_t sc, std::vector<float>& keep) {
    const std::size_t total = sc * static_cast<std::size_t>(world());
    float* mine = recv + static_cast<std::size_t>(rank()) * sc;
    const bool in_place = send == mine;
    if (!in_place && overlaps(send, sc, recv, total)) {
      keep.assign(send, send + sc);
      send = keep.data();
    }
    if (sc <= max_count_) {
      if (sc == 0) return;
      const int n = static_cast<int>(sc);
      MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MPI_FLOAT, recv, n, MPI_FLOAT,
                               comm_, post()));
      return;
    }
    // Slots over MPI's int count: each rank broadcasts its slot, piece by piece.
    if (!in_place) std::memcpy(mine, send, sc * sizeof(float));
    for (int d = 0; d < world(); ++d)
      post_broadcast(recv + static_cast<std::size_t>(d) * sc, sc, d);
  }

  // bf16 send(sc) -> recv(world * sc) as MPI_UINT16_T. send is this rank's slot of recv
  // (in place: fully_shard's flat buffer) or a buffer of its own (FSDP1's cast shard).
  // Slots over MPI's int count: each rank broadcasts its slot, piece by piece.
  void post_host_all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t sc) {
    if (sc == 0) return;
    Bf16* mine = recv + static_cast<std::size_t>(rank()) * sc;
    const bool in_place = send == mine;
    if (sc <= max_count_) {
      const int n = static_cast<int>(sc);
      MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MPI_UINT16_T, recv, n, MPI_UINT16_T, comm_,
                               post()));
      return;
    }
    if (!in_place) std::memcpy(mine, send, sc * sizeof(Bf16));
    for (int d = 0; d < world(); ++d)
      for_chunks(sc, [&](std::size_t off, int n) {
        MPI_CHECK(MPI_Ibcast(recv + static_cast<std::size_t>(d) * sc + off, n, MPI_UINT16_T, d, comm_, post()));
      });
  }

  void host_broadcast(float* buf, std::size_t count, int root) {
    post_broadcast(buf, count, root);
    wait_posted();
  }

  void post_broadcast(float* buf, std::size_t count, int root) {
    for_chunks(count, [&](std::size_t off, int n) {
      MPI_CHECK(MPI_Ibcast(buf + off, n, MPI_FLOAT, root, comm_, post()));
    });
  }

  MPI_Comm comm_;
  std::size_t max_count_;
  bool staged_;  // buffers are not host memory: go through download/upload
  std::vector<MPI_Request> posted_;  // the call's requests, until wait_posted
  // Non-blocking collectives in flight, by id: their requests and the copies they read.
  struct Pending {
    std::vector<MPI_Request> requests;
    std::vector<float> keep;
  };
  std::map<std::int64_t, Pending> pending_;
  bool timed_out_ = false;           // requests left posted: comm_ is not freed
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(Backend* backend, std::size_t max_count) {
  if (!mpi_active())
    throw UsageError(
        "--comm mpi: MPI is not initialised; start the run under mpirun or srun (allowed "
        "without a launcher: self, fake)");
  SHARDSCOPE_REQUIRE(max_count >= 1 && max_count <= static_cast<std::size_t>(INT_MAX),
                     "make_mpi_communicator: max_count must be in 1..INT_MAX");
  return std::make_unique<MpiCommunicator>(backend, max_count);
}

}  // namespace shardscope

#endif  // SHARDSCOPE_WITH_MPI
