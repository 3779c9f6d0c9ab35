// Communicators behind one interface (docs/design.md §5): self, mpi, nccl, fake.
//
// The public calls are non-virtual: they time the backend-specific `do_*` and record
// calls, payload bytes and milliseconds in the rank's ledger. Payload bytes follow
// nccl-tests' "size": the full buffer for all-reduce and broadcast, the whole
// (world x shard) buffer for reduce-scatter and all-gather, the message for send/recv.
// busbw = size / time * factor, with nccl-tests' factors (see `busbw_factor`).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/dtype.hpp"

namespace shardscope {

class Backend;

// --comm-timeout (docs/cli.md): how long any one collective or p2p exchange may wait, in
// seconds, before its rank aborts the job (exit 3). The longest allowed is a day.
inline constexpr double kDefaultCommTimeoutSeconds = 300.0;
inline constexpr double kMaxCommTimeoutSeconds = 86'400.0;

enum class CollKind : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, send, recv };
inline constexpr int kCollKindCount = 6;
inline constexpr std::array<std::string_view, kCollKindCount> kCollKindNames = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv"};

// One half of a point-to-point exchange; see Communicator::p2p.
struct P2pOp {
  bool is_send;
  float* buf;          // send: read; recv: written
  std::size_t count;   // elements of dtype
  int peer;
  // bf16: a pipeline's bf16 activation or gradient under autocast (2 B an element: the
  // ledger counts them so); buf then holds Bf16 (as_bf16).
  DType dtype = DType::f32;
};

// ms: each call's time from when it was posted to when it was seen complete. exposed_ms:
// the part of it the step spent waiting for the call (docs/design.md, "Overlap"): the
// whole ms for a blocking call, for a non-blocking one (Communicator::start_*) the time
// wait() waited for it, 0 when it had completed before. exposed_ms <= ms always.
struct CollStats {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
  double ms = 0.0;
  double exposed_ms = 0.0;
};

struct CommLedger {
  std::array<CollStats, kCollKindCount> by_kind{};
  CollStats& operator[](CollKind k) { return by_kind[static_cast<int>(k)]; }
  const CollStats& operator[](CollKind k) const { return by_kind[static_cast<int>(k)]; }
  std::int64_t total_bytes() const {
    std::int64_t t = 0;
    for (const auto& s : by_kind) t += s.bytes;
    return t;
  }
  double total_ms() const {
    double t = 0.0;
    for (const auto& s : by_kind) t += s.ms;
    return t;
  }
  double total_exposed_ms() const {
    double t = 0.0;
    for (const auto& s : by_kind) t += s.exposed_ms;
    return t;
  }
};

// A non-blocking collective in flight (Communicator::start_*): the ticket wait() takes.
// 0 is no collective (a default CommTicket, or one already waited for).
struct CommTicket {
  std::int64_t id = 0;
  explicit operator bool() const { return id != 0; }
};

// nccl-tests' bus-bandwidth factors: all-reduce 2(n-1)/n, reduce-scatter and
// all-gather (n-1)/n, broadcast and send/recv 1.
double busbw_factor(CollKind kind, int world);
// GB/s (1e9 bytes per second) from a ledger entry; 0 when no time was measured.
double busbw_gbps(const CollStats& s, CollKind kind, int world);

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual std::string name() const = 0;
  int rank() const { return rank_; }
  int world() const { return world_; }
  // True when collectives move no data (the fake communicator, `--emulate`).
  virtual bool emulated() const { return false; }

  // In place: buf(count) = sum over ranks.
  void all_reduce_sum(float* buf, std::size_t count);
  // In place: buf(count) = elementwise max over ranks (vocabulary-parallel
  // cross-entropy's row maxima). Recorded as an all_reduce of the buffer.
  void all_reduce_max(float* buf, std::size_t count);
  // send(world * recv_count) -> recv(recv_count) = sum over ranks of this rank's slice.
  void reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count);
  // send(send_count) from every rank -> recv(world * send_count), rank order.
  void all_gather(const float* send, float* recv, std::size_t send_count);
  // The same on bf16 elements (FSDP's MixedPrecision gathers its units in bf16): recorded
  // as an all_gather of 2 B an element (world x send_count x 2 B). Host buffers, or a
  // device's under nccl.
  void all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t send_count);
  // In place: buf(count) = sum over ranks, on bf16 elements (each addition rounded to bf16,
  // as NCCL's bf16 sum does; DeepSpeed's bf16 buckets): recorded as an all_reduce of 2 B an
  // element. Host buffers (fake, self, mpi); elsewhere a RunError naming the communicator.
  void all_reduce_sum_bf16(Bf16* buf, std::size_t count);
  void broadcast(float* buf, std::size_t count, int root);
  // Posts every op together and returns when all have completed (MPI Isend/Irecv +
  // Waitall; NCCL group). Ops to the same peer match in order. Pipelines use this
  // so that a send and the next receive cannot deadlock against the peer's pair.
  void p2p(const std::vector<P2pOp>& ops);
  // A sum all-reduce of two ranks inside the world, this one and `peer` (a pipeline's
  // first and last stage, which both hold a tied weight, as Megatron's embedding group
  // does): each sends buf and receives the other's into `scratch` (count floats, the
  // caller's), then the backend adds it: buf = the two ranks' sum on both. Recorded as
  // one all_reduce of count floats (nccl-tests' size: the buffer).
  void pair_all_reduce_sum(float* buf, float* scratch, std::size_t count, int peer);
  void send(const float* buf, std::size_t count, int peer);  // p2p({send})
  void recv(float* buf, std::size_t count, int peer);        // p2p({recv})
  void barrier();

  // The communicator of this rank's group: `members` are ranks of this communicator, in
  // the group's rank order, this one among them. Collective: every rank of this
  // communicator calls it at once, each with its own group, the groups disjoint and
  // covering it (MPI_Comm_split, ncclCommSplit; the fake communicator plays the group's
  // rank as it plays the world's). The new one has its own ledger and the timeout.
  std::unique_ptr<Communicator> split(const std::vector<int>& members);

  // Non-blocking forms of the three data-parallel collectives (--overlap on): post the
  // collective and return its ticket at once. Until wait(ticket) returns, the caller
  // leaves the buffers alone (send unchanged, recv unread) and keeps them allocated: a
  // buffer is freed only after its collective completed (torch's record_stream). The
  // ledger counts the call when it is posted and its times when it is waited for.
  // Communicators whose collectives move no data or have no peers (self, fake) and MPI
  // staged through host memory complete the call when it is posted.
  CommTicket start_all_reduce_sum(float* buf, std::size_t count);
  CommTicket start_reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count);
  CommTicket start_all_gather(const float* send, float* recv, std::size_t send_count);
  CommTicket start_all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t send_count);
  // Lets posted collectives advance and notes which have completed (MPI progresses a
  // non-blocking collective only inside MPI calls: strategies call this between blocks).
  void progress();
  // Returns when the ticket's collective has completed, under the watchdog (--comm-timeout);
  // the time it waited is the call's exposed_ms. The ticket is cleared.
  void wait(CommTicket& ticket);
  // Collectives posted and not yet waited for.
  int in_flight() const { return static_cast<int>(in_flight_.size()); }

  // Each waited-for non-blocking collective also goes to the backend's timeline as a
  // span of the communication track (kCommunicationTrack), from its post to when it was
  // seen complete: the trace draws that track beside the compute ranges.

  const CommLedger& ledger() const { return ledger_; }
  // Starts a new step's ledger; no collective may be in flight across it.
  void reset_ledger();

  // The watchdog's limit: a call whose wait passes it aborts the communicator and throws
  // RunError (see watchdog_text). Communicators that wait on nothing (self, fake) ignore it.
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }
  // SHARDSCOPE_TEST_STALL (harness/comm/watchdog.hpp): this rank stalls its first timed
  // call for `seconds`.
  void arm_stall(double seconds) { stall_s_ = seconds; }

 protected:
  Communicator(int rank, int world, Backend* backend) : rank_(rank), world_(world), backend_(backend) {}
  virtual void do_all_reduce_sum(float* buf, std::size_t count) = 0;
  virtual void do_all_reduce_max(float* buf, std::size_t count) = 0;
  virtual void do_reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count) = 0;
  virtual void do_all_gather(const float* send, float* recv, std::size_t send_count) = 0;
  virtual void do_all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t send_count) = 0;
  virtual void do_all_reduce_sum_bf16(Bf16* buf, std::size_t count);  // default: not built (RunError)
  virtual void do_broadcast(float* buf, std::size_t count, int root) = 0;
  virtual void do_p2p(const std::vector<P2pOp>& ops) = 0;
  virtual void do_barrier() = 0;
  // `color` names the group (its lowest member), `key` is this rank's place in it.
  virtual std::unique_ptr<Communicator> do_split(int color, int key, int size) = 0;

  // The non-blocking side (see start_*). `id` names the collective in test_posted and
  // wait_posted. The defaults run the blocking do_* when the call is posted, so that it
  // is complete at once; a communicator that can post without waiting (mpi, nccl)
  // overrides all five.
  virtual void post_all_reduce_sum(std::int64_t id, float* buf, std::size_t count);
  virtual void post_reduce_scatter_sum(std::int64_t id, const float* send, float* recv, std::size_t recv_count);
  virtual void post_all_gather(std::int64_t id, const float* send, float* recv, std::size_t send_count);
  virtual void post_all_gather_bf16(std::int64_t id, const Bf16* send, Bf16* recv, std::size_t send_count);
  // True once collective `id` has completed (a poll, never a wait).
  virtual bool test_posted(std::int64_t /*id*/) { return true; }
  // Returns when collective `id` has completed; after --comm-timeout throws RunError
  // with watchdog_text(timed_out_text()) (and leaves the communicator aborted).
  virtual void wait_posted(std::int64_t /*id*/) {}

  // The test hook's stall, inside the call (see arm_stall): the host sleeps; a device
  // communicator overrides it to stall its stream instead.
  virtual void do_stall(double seconds);

  Backend* backend() const { return backend_; }

  // The one line a rank exits with when its watchdog fires: "rank R: all_reduce of N B
  // <what> (--comm-timeout T s); the communicator was aborted".
  std::string watchdog_text(const std::string& what) const;
  // "did not complete within --comm-timeout T s (a peer is stuck or dead); ...": the
  // message for a wait that passed the timeout.
  std::string timed_out_text() const;

 private:
  template <class F>
  void timed(CollKind kind, std::size_t bytes, const char* name, F&& f);
  template <class F>
  CommTicket started(CollKind kind, std::size_t bytes, const char* name, F&& post);
  void stall_if_armed();
  struct InFlight {
    std::int64_t id = 0;
    CollKind kind = CollKind::all_reduce;
    const char* name = "";
    std::int64_t bytes = 0;
    std::int64_t start_ns = 0;  // steady clock, when posted
    std::int64_t done_ns = -1;  // steady clock, when first seen complete; -1 while pending
  };
  std::vector<InFlight> in_flight_;
  std::int64_t next_id_ = 1;
  int rank_;
  int world_;
  Backend* backend_;  // synchronized before and after each timed call; may be null
  CommLedger ledger_;
  double timeout_s_ = kDefaultCommTimeoutSeconds;
  double stall_s_ = 0.0;
  // The public call in progress (its ledger name and payload bytes), for watchdog_text.
  const char* call_name_ = "barrier";
  std::int64_t call_bytes_ = 0;
};

struct CommOptions {
  std::string kind;     // "self", "mpi", "nccl", "fake"
  int emulate_world = 0;  // fake: W
  int emulate_rank = 0;   // fake: r
  double timeout_s = kDefaultCommTimeoutSeconds;  // --comm-timeout
};

// Builds the communicator; `mpi`/`nccl` need MPI to be initialised (see mpi_env.hpp).
std::unique_ptr<Communicator> make_communicator(const CommOptions& opt, Backend* backend);

}  // namespace shardscope
