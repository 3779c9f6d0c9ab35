// The Communicator's public calls (timing, profiler ranges, the ledger), nccl-tests'
// bus-bandwidth factors, and the registry of communicators (make_communicator).
#include "shardscope/comm.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "shardscope/backend.hpp"
#include "shardscope/check.hpp"
#include "harness/comm/watchdog.hpp"

// The registry: one factory per communicator, each defined in its own file.
#include "harness/comm/fake_comm.hpp"
#include "harness/comm/self_comm.hpp"
#ifdef SHARDSCOPE_WITH_MPI
#include "harness/comm/mpi_comm.hpp"
#endif
#ifdef SHARDSCOPE_WITH_NCCL
#include "harness/comm/nccl_comm.hpp"
#endif

namespace shardscope {

namespace {

std::int64_t payload_bytes(std::size_t floats) {
  return static_cast<std::int64_t>(floats) * static_cast<std::int64_t>(sizeof(float));
}

// Runs `f` between two backend synchronisations, inside a profiler range named `label`
// (built only when there is a backend to receive it) that carries the call's payload
// `bytes` to the timeline; returns the wall time in ms.
template <class F, class Label>
double run_timed(Backend* backend, std::int64_t bytes, Label&& label, F&& f) {
  using Clock = std::chrono::steady_clock;
  if (backend == nullptr) {
    auto t0 = Clock::now();
    f();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  backend->synchronize();  // queued compute must not be charged to the collective
  std::string name = label();
  ScopedRange range(*backend, name.c_str(), bytes);
  auto t0 = Clock::now();
  f();
  backend->synchronize();  // device collectives return before they finish
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The communicators this build can make, for error messages.
std::string allowed_comms() {
  std::string s = "self, fake";
#ifdef SHARDSCOPE_WITH_MPI
  s += ", mpi";
#endif
#ifdef SHARDSCOPE_WITH_NCCL
  s += ", nccl";
#endif
  return s;
}

}  // namespace

std::unique_ptr<Communicator> Communicator::split(const std::vector<int>& members) {
  int key = -1;
  int color = world_;
  for (std::size_t i = 0; i < members.size(); ++i) {
    SHARDSCOPE_REQUIRE(members[i] >= 0 && members[i] < world_, "split: a member is not a rank of the communicator");
    if (members[i] == rank_) key = static_cast<int>(i);
    color = std::min(color, members[i]);
  }
  SHARDSCOPE_REQUIRE(key >= 0, "split: this rank is not a member of its group");
  std::unique_ptr<Communicator> made = do_split(color, key, static_cast<int>(members.size()));
  SHARDSCOPE_REQUIRE(made->world() == static_cast<int>(members.size()) && made->rank() == key,
                     "split: the group's size or this rank's place in it is not the one asked for");
  made->set_timeout(timeout_s_);
  return made;
}

// ---- bus bandwidth (nccl-tests, doc/PERFORMANCE.md) ---------------------------------------

double busbw_factor(CollKind kind, int world) {
  if (world < 1) return 0.0;
  const double n = world;
  switch (kind) {
    case CollKind::all_reduce: return 2.0 * (n - 1.0) / n;
    case CollKind::reduce_scatter:
    case CollKind::all_gather: return (n - 1.0) / n;
    case CollKind::broadcast:
    case CollKind::send:
    case CollKind::recv: return 1.0;
  }
  return 0.0;
}

double busbw_gbps(const CollStats& s, CollKind kind, int world) {
  if (s.ms <= 0.0) return 0.0;
  const double algbw = static_cast<double>(s.bytes) / (s.ms * 1e-3) / 1e9;  // GB/s
  return algbw * busbw_factor(kind, world);
}

// ---- timed public calls ----------------------------------------------------------------

// ---- the watchdog's words and the stall hook ---------------------------------------------

std::string Communicator::watchdog_text(const std::string& what) const {
  return "rank " + std::to_string(rank_) + ": " + call_name_ + " of " + std::to_string(call_bytes_) + " B " +
         what + "; the communicator was aborted";
}

std::string Communicator::timed_out_text() const {
  return "did not complete within --comm-timeout " + seconds_text(timeout_s_) +
         " s (a peer is stuck or dead)";
}

void Communicator::do_stall(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

void Communicator::stall_if_armed() {
  if (stall_s_ <= 0.0) return;
  const double s = stall_s_;
  stall_s_ = 0.0;  // once
  do_stall(s);
}

void Communicator::barrier() {
  call_name_ = "barrier";
  call_bytes_ = 0;
  do_barrier();
}

template <class F>
void Communicator::timed(CollKind kind, std::size_t bytes, const char* name, F&& f) {
  call_name_ = name;
  call_bytes_ = static_cast<std::int64_t>(bytes);
  double ms = run_timed(
      backend_, static_cast<std::int64_t>(bytes),
      [&] { return std::string(name) + " " + std::to_string(bytes) + " B"; },
      [&] {
        stall_if_armed();
        f();
      });
  CollStats& s = ledger_[kind];
  s.calls += 1;
  s.bytes += static_cast<std::int64_t>(bytes);
  s.ms += ms;
  s.exposed_ms += ms;  // a blocking call: the step waited for all of it
}

// ---- non-blocking calls (--overlap on) ---------------------------------------------------

template <class F>
CommTicket Communicator::started(CollKind kind, std::size_t bytes, const char* name, F&& post) {
  call_name_ = name;
  call_bytes_ = static_cast<std::int64_t>(bytes);
  const std::int64_t id = next_id_++;
  InFlight f;
  f.id = id;
  f.kind = kind;
  f.name = name;
  f.bytes = static_cast<std::int64_t>(bytes);
  f.start_ns = Timeline::clock_ns();
  {
    // The post alone, on the profiler (NVTX on CUDA); the collective's own span is the
    // communication track's, recorded when it is waited for.
    std::string label;
    if (backend_ != nullptr) {
      label = std::string(name) + " " + std::to_string(bytes) + " B (post)";
      backend_->profiler_push(label.c_str());
    }
    struct Pop {
      Backend* b;
      ~Pop() {
        if (b != nullptr) b->profiler_pop();
      }
    } pop{backend_};
    stall_if_armed();
    post(id);
  }
  CollStats& s = ledger_[kind];
  s.calls += 1;
  s.bytes += static_cast<std::int64_t>(bytes);
  in_flight_.push_back(f);
  return CommTicket{id};
}

CommTicket Communicator::start_all_reduce_sum(float* buf, std::size_t count) {
  return started(CollKind::all_reduce, payload_bytes(count), "all_reduce",
                 [&](std::int64_t id) { post_all_reduce_sum(id, buf, count); });
}

CommTicket Communicator::start_reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count) {
  return started(CollKind::reduce_scatter, payload_bytes(recv_count) * world_, "reduce_scatter",
                 [&](std::int64_t id) { post_reduce_scatter_sum(id, send, recv, recv_count); });
}

CommTicket Communicator::start_all_gather(const float* send, float* recv, std::size_t send_count) {
  return started(CollKind::all_gather, payload_bytes(send_count) * world_, "all_gather",
                 [&](std::int64_t id) { post_all_gather(id, send, recv, send_count); });
}

CommTicket Communicator::start_all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t send_count) {
  return started(CollKind::all_gather, static_cast<std::int64_t>(send_count) * 2 * world_, "all_gather",
                 [&](std::int64_t id) { post_all_gather_bf16(id, send, recv, send_count); });
}

void Communicator::post_all_reduce_sum(std::int64_t, float* buf, std::size_t count) {
  do_all_reduce_sum(buf, count);
}

void Communicator::post_reduce_scatter_sum(std::int64_t, const float* send, float* recv, std::size_t recv_count) {
  do_reduce_scatter_sum(send, recv, recv_count);
}

void Communicator::post_all_gather(std::int64_t, const float* send, float* recv, std::size_t send_count) {
  do_all_gather(send, recv, send_count);
}

void Communicator::post_all_gather_bf16(std::int64_t, const Bf16* send, Bf16* recv, std::size_t send_count) {
  do_all_gather_bf16(send, recv, send_count);
}

void Communicator::progress() {
  for (InFlight& f : in_flight_) {
    if (f.done_ns >= 0) continue;
    call_name_ = f.name;
    call_bytes_ = f.bytes;
    if (test_posted(f.id)) f.done_ns = Timeline::clock_ns();
  }
}

void Communicator::wait(CommTicket& ticket) {
  if (!ticket) return;
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(), [&](const InFlight& f) { return f.id == ticket.id; });
  SHARDSCOPE_REQUIRE(it != in_flight_.end(), "wait: collective " + std::to_string(ticket.id) + " is not in flight");
  call_name_ = it->name;
  call_bytes_ = it->bytes;
  const std::int64_t entered = Timeline::clock_ns();
  if (it->done_ns < 0) {
    if (!test_posted(it->id)) wait_posted(it->id);  // under the watchdog; throws on a timeout
    it->done_ns = Timeline::clock_ns();
  }
  // Seen complete before the wait: nothing exposed. Otherwise the wait, which began after
  // the post, so exposed <= ms.
  const std::int64_t exposed_ns = std::max<std::int64_t>(0, it->done_ns - entered);
  const std::int64_t total_ns = it->done_ns - it->start_ns;
  CollStats& s = ledger_[it->kind];
  s.ms += static_cast<double>(total_ns) * 1e-6;
  s.exposed_ms += static_cast<double>(std::min(exposed_ns, total_ns)) * 1e-6;
  if (backend_ != nullptr) {
    const std::string name = std::string(it->name) + " " + std::to_string(it->bytes) + " B";
    backend_->tracker().add_track_span(kCommunicationTrack, name.c_str(), it->bytes, it->start_ns, it->done_ns);
  }
  in_flight_.erase(it);
  ticket.id = 0;
}

void Communicator::reset_ledger() {
  SHARDSCOPE_REQUIRE(in_flight_.empty(), "reset_ledger: " + std::to_string(in_flight_.size()) +
                                             " non-blocking collective(s) were never waited for");
  ledger_ = {};
}

void Communicator::all_reduce_sum(float* buf, std::size_t count) {
  timed(CollKind::all_reduce, payload_bytes(count), "all_reduce",
        [&] { do_all_reduce_sum(buf, count); });
}

void Communicator::all_reduce_max(float* buf, std::size_t count) {
  timed(CollKind::all_reduce, payload_bytes(count), "all_reduce",
        [&] { do_all_reduce_max(buf, count); });
}

void Communicator::reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count) {
  // nccl-tests' size for reduce-scatter is the whole input: world x shard.
  timed(CollKind::reduce_scatter, payload_bytes(recv_count) * world_, "reduce_scatter",
        [&] { do_reduce_scatter_sum(send, recv, recv_count); });
}

void Communicator::all_gather(const float* send, float* recv, std::size_t send_count) {
  // nccl-tests' size for all-gather is the whole output: world x shard.
  timed(CollKind::all_gather, payload_bytes(send_count) * world_, "all_gather",
        [&] { do_all_gather(send, recv, send_count); });
}

void Communicator::all_gather_bf16(const Bf16* send, Bf16* recv, std::size_t send_count) {
  timed(CollKind::all_gather, static_cast<std::int64_t>(send_count) * 2 * world_, "all_gather",
        [&] { do_all_gather_bf16(send, recv, send_count); });
}

void Communicator::all_reduce_sum_bf16(Bf16* buf, std::size_t count) {
  timed(CollKind::all_reduce, static_cast<std::int64_t>(count) * 2, "all_reduce",
        [&] { do_all_reduce_sum_bf16(buf, count); });
}

void Communicator::do_all_reduce_sum_bf16(Bf16*, std::size_t) {
  throw RunError("--comm " + name() + ": a bf16 all-reduce is not built for this communicator (host buffers under "
                 "fake, self and mpi only)");
}

void Communicator::broadcast(float* buf, std::size_t count, int root) {
  SHARDSCOPE_REQUIRE(root >= 0 && root < world_,
                     "broadcast: root " + std::to_string(root) + " is not a rank of world " +
                         std::to_string(world_));
  timed(CollKind::broadcast, payload_bytes(count), "broadcast",
        [&] { do_broadcast(buf, count, root); });
}

void Communicator::pair_all_reduce_sum(float* buf, float* scratch, std::size_t count, int peer) {
  SHARDSCOPE_REQUIRE(peer >= 0 && peer < world_ && peer != rank_,
                     "all_reduce of a pair: peer " + std::to_string(peer) + " is not another rank of world " +
                         std::to_string(world_));
  SHARDSCOPE_REQUIRE(backend_ != nullptr, "all_reduce of a pair: the communicator has no backend to add with");
  timed(CollKind::all_reduce, payload_bytes(count), "all_reduce", [&] {
    do_p2p({{true, buf, count, peer}, {false, scratch, count, peer}});
  });
  backend_->add(buf, scratch, count);
}

// One do_p2p for the whole group, so the ops progress together. The ledger counts one
// call per op. The group's wall time is charged in full to each direction that has ops
// (an exchange of b bytes each way in t ms is b/t in each direction, as nccl-tests'
// sendrecv counts it) and split within a direction in proportion to bytes.
void Communicator::p2p(const std::vector<P2pOp>& ops) {
  if (ops.empty()) return;
  std::int64_t dir_bytes[2] = {0, 0};  // [send, recv]
  int dir_ops[2] = {0, 0};
  for (const P2pOp& op : ops) {
    SHARDSCOPE_REQUIRE(op.peer >= 0 && op.peer < world_,
                       std::string(op.is_send ? "send" : "recv") + ": peer " +
                           std::to_string(op.peer) + " is not a rank of world " +
                           std::to_string(world_));
    dir_bytes[op.is_send ? 0 : 1] += static_cast<std::int64_t>(op.count) * dtype_bytes(op.dtype);
    dir_ops[op.is_send ? 0 : 1] += 1;
  }
  auto label = [&] {
    if (ops.size() == 1)
      return std::string(ops[0].is_send ? "send " : "recv ") +
             std::to_string(dir_bytes[0] + dir_bytes[1]) + " B";
    return "p2p " + std::to_string(ops.size()) + " ops send " + std::to_string(dir_bytes[0]) +
           " B recv " + std::to_string(dir_bytes[1]) + " B";
  };
  call_name_ = ops.size() > 1 ? "p2p" : ops[0].is_send ? "send" : "recv";
  call_bytes_ = dir_bytes[0] + dir_bytes[1];
  double ms = run_timed(backend_, dir_bytes[0] + dir_bytes[1], label, [&] {
    stall_if_armed();
    do_p2p(ops);
  });
  for (const P2pOp& op : ops) {
    const int d = op.is_send ? 0 : 1;
    const std::int64_t b = static_cast<std::int64_t>(op.count) * dtype_bytes(op.dtype);
    CollStats& s = ledger_[op.is_send ? CollKind::send : CollKind::recv];
    s.calls += 1;
    s.bytes += b;
    const double share = dir_bytes[d] > 0 ? ms * static_cast<double>(b) / static_cast<double>(dir_bytes[d])
                                          : ms / dir_ops[d];
    s.ms += share;
    s.exposed_ms += share;  // blocking: the step waited for all of it
  }
}

void Communicator::send(const float* buf, std::size_t count, int peer) {
  // P2pOp carries one pointer for both directions; a send only reads it.
  p2p({P2pOp{true, const_cast<float*>(buf), count, peer}});
}

void Communicator::recv(float* buf, std::size_t count, int peer) {
  p2p({P2pOp{false, buf, count, peer}});
}

// ---- registry ------------------------------------------------------------------------------

namespace {

std::unique_ptr<Communicator> make_kind(const CommOptions& opt, Backend* backend) {
  if (opt.kind == "self") return make_self_communicator(backend);
  if (opt.kind == "fake") {
    const std::string flag = "--emulate " + std::to_string(opt.emulate_world) + ":" +
                             std::to_string(opt.emulate_rank);
    if (opt.emulate_world < 1)
      throw UsageError(flag + ": the world W must be at least 1 (--emulate W:r, 0 <= r < W)");
    if (opt.emulate_rank < 0 || opt.emulate_rank >= opt.emulate_world)
      throw UsageError(flag + ": the rank r must be in 0.." +
                       std::to_string(opt.emulate_world - 1) + " (--emulate W:r, 0 <= r < W)");
    return make_fake_communicator(opt.emulate_world, opt.emulate_rank, backend);
  }
  if (opt.kind == "mpi") {
#ifdef SHARDSCOPE_WITH_MPI
    return make_mpi_communicator(backend);
#else
    throw UsageError("--comm mpi: this build has no MPI; allowed: " + allowed_comms());
#endif
  }
  if (opt.kind == "nccl") {
#ifdef SHARDSCOPE_WITH_NCCL
    return make_nccl_communicator(backend, opt.timeout_s);
#else
    throw UsageError("--comm nccl: this build has no NCCL; allowed: " + allowed_comms());
#endif
  }
  throw UsageError("--comm " + opt.kind + ": unknown communicator; allowed: " + allowed_comms());
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(const CommOptions& opt, Backend* backend) {
  if (!(opt.timeout_s > 0.0 && opt.timeout_s <= kMaxCommTimeoutSeconds))
    throw UsageError("--comm-timeout " + seconds_text(opt.timeout_s) + ": allowed: more than 0 and at most " +
                     seconds_text(kMaxCommTimeoutSeconds) + " seconds");
  const StallHook stall = stall_hook_from_env();
  std::unique_ptr<Communicator> comm = make_kind(opt, backend);
  comm->set_timeout(opt.timeout_s);
  if (stall.rank == comm->rank() && !comm->emulated()) comm->arm_stall(stall.seconds);
  return comm;
}

}  // namespace shardscope
