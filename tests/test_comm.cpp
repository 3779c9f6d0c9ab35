// Single-process tests of the communicators (harness/comm): self, fake (--emulate),
// nccl-tests' bus-bandwidth factors, the registry's errors, and launch detection.
// The multi-rank MPI communicator is tested in tests/mpi/test_mpi_comm.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "support/random_data.hpp"
#include "support/mathless_backend.hpp"
#include "harness/backends/cpu_backend.hpp"
#include "harness/comm/mpi_env.hpp"
#include "shardscope/backend.hpp"
#include "shardscope/check.hpp"
#include "shardscope/comm.hpp"

namespace shardscope {
namespace {


std::vector<float> seeded(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = testing::exact_value(seed, rank, i);
  return v;
}

bool all_nonzero(const std::vector<float>& v) {
  for (float x : v)
    if (x == 0.0f) return false;
  return !v.empty();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A host-memory backend that records what the communicator asks of it: the
// synchronisations, the profiler ranges and every data movement.
class RecordingBackend final : public testing::MathlessBackend {
 public:
  std::string name() const override { return "recording"; }
  void copy(float* dst, const float* src, std::size_t n) override {
    ++copies;
    std::memmove(dst, src, n * sizeof(float));
  }
  void fill(float* dst, float v, std::size_t n) override {
    ++fills;
    for (std::size_t i = 0; i < n; ++i) dst[i] = v;
  }
  void upload(float* dst, const float* host, std::size_t n) override {
    ++uploads;
    std::memcpy(dst, host, n * sizeof(float));
  }
  void download(float* host, const float* src, std::size_t n) override {
    ++downloads;
    std::memcpy(host, src, n * sizeof(float));
  }
  void synchronize() override { ++syncs; }

  int copies = 0, fills = 0, uploads = 0, downloads = 0, syncs = 0, open_ranges = 0;
  std::vector<std::string> ranges;

 protected:
  void do_range_push(const char* n) override {
    ranges.emplace_back(n);
    ++open_ranges;
  }
  void do_range_pop() override { --open_ranges; }
};

std::unique_ptr<Communicator> make(const std::string& kind, Backend* b, int w = 0, int r = 0) {
  CommOptions o;
  o.kind = kind;
  o.emulate_world = w;
  o.emulate_rank = r;
  return make_communicator(o, b);
}

void expect_stats(const Communicator& c, CollKind k, std::int64_t calls, std::int64_t bytes) {
  const CollStats& s = c.ledger()[k];
  EXPECT_EQ(s.calls, calls) << kCollKindNames[static_cast<int>(k)];
  EXPECT_EQ(s.bytes, bytes) << kCollKindNames[static_cast<int>(k)];
  EXPECT_GE(s.ms, 0.0) << kCollKindNames[static_cast<int>(k)];
}

// ---- self ---------------------------------------------------------------------------------

TEST(comm_self, CollectivesAreIdentitiesAtWorldOne) {
  CpuBackend b;
  auto c = make("self", &b);
  EXPECT_EQ(c->name(), "self");
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world(), 1);
  EXPECT_FALSE(c->emulated());

  const std::size_t n = 37;
  const auto x = seeded(1, 0, n);
  ASSERT_TRUE(all_nonzero(x));
  Buffer buf = b.alloc(Category::comm, n), out = b.alloc(Category::comm, n);
  b.upload(buf.data(), x.data(), n);
  std::vector<float> got(n);

  c->all_reduce_sum(buf.data(), n);  // a sum over one rank
  b.download(got.data(), buf.data(), n);
  EXPECT_TRUE(same_bits(got, x));

  b.fill(out.data(), 0.0f, n);
  c->reduce_scatter_sum(buf.data(), out.data(), n);  // the shard is the whole buffer
  b.download(got.data(), out.data(), n);
  EXPECT_TRUE(same_bits(got, x));

  b.fill(out.data(), 0.0f, n);
  c->all_gather(buf.data(), out.data(), n);
  b.download(got.data(), out.data(), n);
  EXPECT_TRUE(same_bits(got, x));

  c->reduce_scatter_sum(buf.data(), buf.data(), n);  // in place
  c->all_gather(buf.data(), buf.data(), n);
  c->broadcast(buf.data(), n, 0);
  c->barrier();
  b.download(got.data(), buf.data(), n);
  EXPECT_TRUE(same_bits(got, x));

  expect_stats(*c, CollKind::all_reduce, 1, 4 * n);
  expect_stats(*c, CollKind::reduce_scatter, 2, 2 * 4 * n);
  expect_stats(*c, CollKind::all_gather, 2, 2 * 4 * n);
  expect_stats(*c, CollKind::broadcast, 1, 4 * n);
}

TEST(comm_self, PointToPointHasNoPeerAndIsNotRecorded) {
  CpuBackend b;
  auto c = make("self", &b);
  std::vector<float> x(8, 1.0f);
  EXPECT_THROW(c->send(x.data(), x.size(), 0), RunError);
  EXPECT_THROW(c->recv(x.data(), x.size(), 0), RunError);
  EXPECT_THROW(c->send(x.data(), x.size(), 1), RunError);  // not a rank of world 1
  EXPECT_THROW(c->p2p({{true, x.data(), 8, 0}, {false, x.data(), 8, 0}}), RunError);
  EXPECT_THROW(c->broadcast(x.data(), x.size(), 1), RunError);
  c->p2p({});  // nothing to do
  EXPECT_EQ(c->ledger()[CollKind::send].calls, 0);
  EXPECT_EQ(c->ledger()[CollKind::recv].calls, 0);
  EXPECT_EQ(c->ledger()[CollKind::broadcast].calls, 0);
}

TEST(comm_self, WorksWithoutBackend) {
  auto c = make("self", nullptr);
  const auto x = seeded(2, 0, 19);
  std::vector<float> y(19, 0.0f);
  c->all_gather(x.data(), y.data(), 19);
  EXPECT_TRUE(same_bits(x, y));
  std::fill(y.begin(), y.end(), 0.0f);
  c->reduce_scatter_sum(x.data(), y.data(), 19);
  EXPECT_TRUE(same_bits(x, y));
  expect_stats(*c, CollKind::all_gather, 1, 76);
}

TEST(comm_self, EachCallIsSynchronisedAndNamedForProfilers) {
  RecordingBackend b;
  auto c = make("self", &b);
  std::vector<float> x(1000, 1.0f), y(1000);
  c->all_reduce_sum(x.data(), 1000);
  EXPECT_EQ(b.syncs, 2);  // before and after
  c->reduce_scatter_sum(x.data(), y.data(), 1000);
  EXPECT_EQ(b.copies, 1);
  c->broadcast(x.data(), 3, 0);
  c->all_gather(y.data(), y.data(), 5);  // in place: nothing to copy
  EXPECT_EQ(b.copies, 1);
  EXPECT_EQ(b.syncs, 8);
  EXPECT_EQ(b.open_ranges, 0);
  const std::vector<std::string> want = {"all_reduce 4000 B", "reduce_scatter 4000 B",
                                         "broadcast 12 B", "all_gather 20 B"};
  EXPECT_EQ(b.ranges, want);
  // A failing call still closes its range.
  EXPECT_THROW(c->send(x.data(), 4, 0), RunError);
  EXPECT_EQ(b.open_ranges, 0);
  EXPECT_EQ(b.ranges.back(), "send 16 B");
}

// ---- non-blocking calls (--overlap on) ---------------------------------------------------

// The fake rank's non-blocking calls do what its blocking ones do, complete at the post,
// and count in the ledger like them; wait() clears the ticket, exposed_ms <= ms, and a
// collective never waited for makes the next step's reset_ledger refuse.
TEST(comm_nonblocking, FakeRankPostsCompleteAndCountLikeBlockingOnes) {
  RecordingBackend b;
  b.tracker().set_recording(true);
  auto c = make("fake", &b, 4, 2);
  auto grad = seeded(20, 2, 1001), flat = seeded(21, 2, 4 * 250), shard = seeded(22, 2, 250);
  auto gathered = seeded(23, 2, 4 * 13), mine = seeded(24, 2, 13);
  const auto grad_before = grad;
  for (const auto* v : {&grad, &flat, &shard, &gathered, &mine}) ASSERT_TRUE(all_nonzero(*v));
  const int syncs = b.syncs;
  CommTicket t1 = c->start_all_reduce_sum(grad.data(), grad.size());
  CommTicket t2 = c->start_reduce_scatter_sum(flat.data(), shard.data(), shard.size());
  CommTicket t3 = c->start_all_gather(mine.data(), gathered.data(), mine.size());
  EXPECT_EQ(b.syncs, syncs) << "a post never synchronises the backend";
  EXPECT_TRUE(t1 && t2 && t3);
  EXPECT_EQ(c->in_flight(), 3);
  EXPECT_THROW(c->reset_ledger(), RunError);
  c->progress();
  c->wait(t2);
  c->wait(t3);
  c->wait(t1);
  EXPECT_FALSE(t1 || t2 || t3);
  EXPECT_EQ(c->in_flight(), 0);
  c->wait(t1);  // a cleared ticket: nothing to wait for
  EXPECT_TRUE(same_bits(grad, grad_before));
  EXPECT_TRUE(same_bits(shard, std::vector<float>(flat.begin() + 2 * 250, flat.begin() + 3 * 250)));
  for (int slot = 0; slot < 4; ++slot)
    for (int i = 0; i < 13; ++i) EXPECT_EQ(gathered[slot * 13 + i], slot == 2 ? mine[i] : 0.0f);
  expect_stats(*c, CollKind::all_reduce, 1, 1001 * 4);
  expect_stats(*c, CollKind::reduce_scatter, 1, 4 * 250 * 4);
  expect_stats(*c, CollKind::all_gather, 1, 4 * 13 * 4);
  for (const CollStats& st : c->ledger().by_kind) EXPECT_LE(st.exposed_ms, st.ms);
  // Each on the communication track, none among the ranges.
  int on_track = 0;
  for (const TimelineSpan& sp : b.tracker().timeline().spans()) {
    if (sp.track == kCommunicationTrack) {
      ++on_track;
      EXPECT_GE(sp.end_ns, sp.start_ns);
      EXPECT_GT(sp.bytes, 0);
    }
  }
  EXPECT_EQ(on_track, 3);
  EXPECT_EQ(b.open_ranges, 0);
  c->reset_ledger();
  // A blocking call's whole time is exposed, point-to-point's too.
  c->all_reduce_sum(grad.data(), grad.size());
  std::vector<float> in(7);
  c->p2p({{true, grad.data(), 11, 3}, {false, in.data(), 7, 1}});
  for (CollKind k : {CollKind::all_reduce, CollKind::send, CollKind::recv})
    EXPECT_EQ(c->ledger()[k].exposed_ms, c->ledger()[k].ms) << kCollKindNames[static_cast<int>(k)];
}

TEST(comm_nonblocking, SelfRankCompletesAtThePost) {
  auto c = make("self", nullptr);
  auto x = seeded(30, 0, 64), y = std::vector<float>(64, 0.0f);
  CommTicket t = c->start_reduce_scatter_sum(x.data(), y.data(), 64);
  EXPECT_TRUE(same_bits(x, y));  // complete at the post: world 1
  CommTicket u;
  EXPECT_FALSE(u);
  EXPECT_THROW(c->wait(t = CommTicket{t.id + 99}), RunError);
}

// ---- fake (--emulate W:r) -----------------------------------------------------------------

TEST(comm_fake, RecordsWhatRankTwoOfFourWouldAndTakesTheOthersAsZeros) {
  RecordingBackend b;
  auto c = make("fake", &b, 4, 2);
  EXPECT_EQ(c->name(), "fake");
  EXPECT_TRUE(c->emulated());
  EXPECT_EQ(c->world(), 4);
  EXPECT_EQ(c->rank(), 2);

  // Every buffer holds seeded data. What this rank sends or reduces in place keeps it;
  // what it receives holds its own part and zeros for the other ranks' parts.
  auto grad = seeded(10, 2, 1001), flat = seeded(11, 2, 4 * 250), shard = seeded(12, 2, 250);
  auto gathered = seeded(13, 2, 4 * 13), mine = seeded(14, 2, 13), bc = seeded(15, 2, 77);
  auto out1 = seeded(16, 2, 100), in1 = seeded(17, 2, 50), out2 = seeded(18, 2, 10);
  const auto kept_before = std::vector<std::vector<float>>{grad, flat, mine, bc, out1, out2};
  for (const auto& v : kept_before) ASSERT_TRUE(all_nonzero(v));

  c->all_reduce_sum(grad.data(), grad.size());
  c->reduce_scatter_sum(flat.data(), shard.data(), shard.size());
  c->all_gather(mine.data(), gathered.data(), mine.size());
  c->broadcast(bc.data(), bc.size(), 3);
  c->p2p({{true, out1.data(), 100, 3}, {false, in1.data(), 50, 1}, {true, out2.data(), 10, 1}});
  c->send(out2.data(), 10, 0);
  c->recv(in1.data(), 50, 3);
  c->barrier();

  const auto kept_after = std::vector<std::vector<float>>{grad, flat, mine, bc, out1, out2};
  for (std::size_t i = 0; i < kept_before.size(); ++i) EXPECT_TRUE(same_bits(kept_before[i], kept_after[i])) << i;
  // reduce-scatter: this rank's slice of its own input (the others add zeros).
  EXPECT_TRUE(same_bits(shard, std::vector<float>(flat.begin() + 2 * 250, flat.begin() + 3 * 250)));
  // all-gather: its own shard in slot 2, zeros in the others.
  for (int slot = 0; slot < 4; ++slot)
    for (int i = 0; i < 13; ++i)
      EXPECT_EQ(gathered[slot * 13 + i], slot == 2 ? mine[i] : 0.0f) << slot << " " << i;
  EXPECT_EQ(in1, std::vector<float>(50, 0.0f));  // received: zeros
  EXPECT_EQ(b.uploads + b.downloads, 0);

  // The bytes a real rank 2 of 4 records: nccl-tests' sizes.
  expect_stats(*c, CollKind::all_reduce, 1, 1001 * 4);
  expect_stats(*c, CollKind::reduce_scatter, 1, 4 * 250 * 4);
  expect_stats(*c, CollKind::all_gather, 1, 4 * 13 * 4);
  expect_stats(*c, CollKind::broadcast, 1, 77 * 4);
  expect_stats(*c, CollKind::send, 3, (100 + 10 + 10) * 4);
  expect_stats(*c, CollKind::recv, 2, (50 + 50) * 4);
  EXPECT_EQ(c->ledger().total_bytes(), 4004 + 4000 + 208 + 308 + 480 + 400);

  c->reset_ledger();
  EXPECT_EQ(c->ledger().total_bytes(), 0);
  EXPECT_EQ(c->ledger()[CollKind::send].calls, 0);
}

TEST(comm_fake, ChecksPeersAndRootsAgainstTheEmulatedWorld) {
  auto c = make("fake", nullptr, 4, 0);
  std::vector<float> x(4, 1.0f);
  EXPECT_THROW(c->send(x.data(), 4, 4), RunError);
  EXPECT_THROW(c->recv(x.data(), 4, -1), RunError);
  EXPECT_THROW(c->broadcast(x.data(), 4, 4), RunError);
  c->send(x.data(), 4, 3);
  expect_stats(*c, CollKind::send, 1, 16);
  auto one = make("fake", nullptr, 1, 0);
  EXPECT_EQ(one->world(), 1);
  EXPECT_TRUE(one->emulated());
}

TEST(comm_fake, P2pGroupTimeIsChargedToEachDirection) {
  // Exchange 300 B out and 100 B in: the group's time goes in full to each direction,
  // split within a direction by bytes.
  auto c = make("fake", nullptr, 2, 0);
  std::vector<float> x(75);
  c->p2p({{true, x.data(), 50, 1}, {true, x.data(), 25, 1}, {false, x.data(), 25, 1}});
  const CollStats& s = c->ledger()[CollKind::send];
  const CollStats& r = c->ledger()[CollKind::recv];
  EXPECT_EQ(s.calls, 2);
  EXPECT_EQ(s.bytes, 300);
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.bytes, 100);
  EXPECT_NEAR(s.ms, r.ms, 1e-9 + 1e-9 * r.ms);
}

// ---- bus bandwidth ------------------------------------------------------------------------

TEST(comm_busbw, FactorsAreNcclTests) {
  for (int n : {1, 2, 3, 4, 8}) {
    const double d = n;
    EXPECT_DOUBLE_EQ(busbw_factor(CollKind::all_reduce, n), 2.0 * (d - 1) / d) << n;
    EXPECT_DOUBLE_EQ(busbw_factor(CollKind::reduce_scatter, n), (d - 1) / d) << n;
    EXPECT_DOUBLE_EQ(busbw_factor(CollKind::all_gather, n), (d - 1) / d) << n;
    EXPECT_DOUBLE_EQ(busbw_factor(CollKind::broadcast, n), 1.0) << n;
    EXPECT_DOUBLE_EQ(busbw_factor(CollKind::send, n), 1.0) << n;
    EXPECT_DOUBLE_EQ(busbw_factor(CollKind::recv, n), 1.0) << n;
  }
  EXPECT_DOUBLE_EQ(busbw_factor(CollKind::all_reduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busbw_factor(CollKind::all_gather, 4), 0.75);
}

TEST(comm_busbw, GbpsFromAHandMadeLedger) {
  CommLedger l;
  l[CollKind::all_reduce] = {3, 2'000'000'000, 1000.0};  // 2 GB in 1 s: algbw 2 GB/s
  l[CollKind::reduce_scatter] = {1, 500'000'000, 250.0};  // 2 GB/s
  l[CollKind::all_gather] = {1, 1'000'000'000, 2000.0};   // 0.5 GB/s
  l[CollKind::broadcast] = {2, 300'000'000, 100.0};       // 3 GB/s
  l[CollKind::send] = {4, 4'000'000, 1.0};                // 4 GB/s
  l[CollKind::recv] = {1, 0, 0.0};                        // nothing timed
  EXPECT_DOUBLE_EQ(busbw_gbps(l[CollKind::all_reduce], CollKind::all_reduce, 4), 3.0);
  EXPECT_DOUBLE_EQ(busbw_gbps(l[CollKind::all_reduce], CollKind::all_reduce, 2), 2.0);
  EXPECT_DOUBLE_EQ(busbw_gbps(l[CollKind::reduce_scatter], CollKind::reduce_scatter, 4), 1.5);
  EXPECT_DOUBLE_EQ(busbw_gbps(l[CollKind::all_gather], CollKind::all_gather, 2), 0.25);
  EXPECT_DOUBLE_EQ(busbw_gbps(l[CollKind::broadcast], CollKind::broadcast, 8), 3.0);
  EXPECT_DOUBLE_EQ(busbw_gbps(l[CollKind::send], CollKind::send, 2), 4.0);
  EXPECT_DOUBLE_EQ(busbw_gbps(l[CollKind::recv], CollKind::recv, 2), 0.0);
  EXPECT_DOUBLE_EQ(busbw_gbps(l[CollKind::all_reduce], CollKind::all_reduce, 1), 0.0);
  EXPECT_EQ(l.total_bytes(),
            std::int64_t{2'000'000'000} + 500'000'000 + 1'000'000'000 + 300'000'000 + 4'000'000);
}

// ---- the registry -------------------------------------------------------------------------

void expect_usage_error(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " lacks " << p;
  }
}

TEST(comm_factory, RefusesUnknownNamesAndBadEmulation) {
  expect_usage_error([] { make("bogus", nullptr); }, {"--comm bogus", "allowed: self, fake"});
  expect_usage_error([] { make("", nullptr); }, {"--comm", "allowed: self, fake"});
  expect_usage_error([] { make("fake", nullptr, 0, 0); }, {"--emulate 0:0", "W"});
  expect_usage_error([] { make("fake", nullptr, -2, 0); }, {"--emulate -2:0"});
  expect_usage_error([] { make("fake", nullptr, 4, 4); }, {"--emulate 4:4", "0..3"});
  expect_usage_error([] { make("fake", nullptr, 4, -1); }, {"--emulate 4:-1", "0..3"});
#ifndef SHARDSCOPE_WITH_NCCL
  expect_usage_error([] { make("nccl", nullptr); },
                     {"--comm nccl: this build has no NCCL; allowed: self, fake"});
#endif
#ifdef SHARDSCOPE_WITH_MPI
  // Built with MPI, but this process never initialised it.
  expect_usage_error([] { make("mpi", nullptr); }, {"--comm mpi", "not initialised"});
#else
  expect_usage_error([] { make("mpi", nullptr); },
                     {"--comm mpi: this build has no MPI; allowed: self, fake"});
#endif
}

// ---- launch detection and the single-process MPI helpers ---------------------------------

// Clears every launcher variable for the test and restores them afterwards.
class LaunchEnv {
 public:
  LaunchEnv() {
    for (const char* n : kNames) {
      const char* v = std::getenv(n);
      saved_.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(n);
    }
  }
  ~LaunchEnv() {
    for (const auto& [n, v] : saved_) {
      if (v)
        setenv(n, v->c_str(), 1);
      else
        unsetenv(n);
    }
  }
  void set(const char* n, const char* v) { setenv(n, v, 1); }

 private:
  static constexpr const char* kNames[] = {
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
      "PMI_SIZE",             "PMI_RANK",             "MPI_LOCALRANKID",
      "PMIX_RANK",            "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS",
      "SLURM_PROCID",         "SLURM_LOCALID"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

void expect_launch(const LaunchInfo& got, bool under, int world, int rank) {
  EXPECT_EQ(got.under_launcher, under);
  EXPECT_EQ(got.world, world);
  EXPECT_EQ(got.rank, rank);
}

TEST(comm_launch, NoLauncherIsRankZeroOfOne) {
  LaunchEnv env;
  expect_launch(detect_launch(), false, 1, 0);
}

TEST(comm_launch, ReadsOpenMpi) {
  LaunchEnv env;
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("OMPI_COMM_WORLD_RANK", "2");
  env.set("SLURM_NTASKS", "16");  // Open MPI's own variables win
  env.set("SLURM_PROCID", "9");
  expect_launch(detect_launch(), true, 4, 2);
}

TEST(comm_launch, ReadsHydraAndPmix) {
  {
    LaunchEnv env;
    env.set("PMI_SIZE", "3");
    env.set("PMI_RANK", "2");
    expect_launch(detect_launch(), true, 3, 2);
  }
  {
    LaunchEnv env;
    env.set("PMIX_RANK", "5");  // a rank without a size: world unknown (0)
    expect_launch(detect_launch(), true, 0, 5);
  }
}

TEST(comm_launch, ReadsSlurmPreferringTheStep) {
  LaunchEnv env;
  env.set("SLURM_NTASKS", "8");
  env.set("SLURM_PROCID", "7");
  expect_launch(detect_launch(), true, 8, 7);
  env.set("SLURM_STEP_NUM_TASKS", "8");
  env.set("SLURM_NTASKS", "16");
  expect_launch(detect_launch(), true, 8, 7);
}

// The rank on this node (which picks the GPU) comes from MPI, never from a launcher's
// variables (under `srun --mpi=pmix` they said 0 on every rank): without MPI it is 0,
// whatever they say. tests/cli/test_run_record.cpp checks it under mpirun.
TEST(comm_launch, LocalRankIsNotTheLaunchersWord) {
  LaunchEnv env;
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  env.set("MPI_LOCALRANKID", "2");
  env.set("SLURM_LOCALID", "3");
  MpiSession s(nullptr, nullptr);
  EXPECT_FALSE(s.active());
  EXPECT_EQ(s.local_rank(), 0);
}

TEST(comm_launch, RefusesMalformedVariables) {
  LaunchEnv env;
  env.set("OMPI_COMM_WORLD_SIZE", "four");
  env.set("OMPI_COMM_WORLD_RANK", "0");
  EXPECT_THROW(detect_launch(), UsageError);
  env.set("OMPI_COMM_WORLD_SIZE", "2");
  env.set("OMPI_COMM_WORLD_RANK", "2");  // not below the size
  EXPECT_THROW(detect_launch(), UsageError);
  env.set("OMPI_COMM_WORLD_RANK", "-1");
  EXPECT_THROW(detect_launch(), UsageError);
}

TEST(comm_launch, SessionWithoutLauncherIsInactive) {
  LaunchEnv env;
  MpiSession s(nullptr, nullptr);
  EXPECT_FALSE(s.active());
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.world(), 1);
  EXPECT_EQ(s.local_rank(), 0);
  EXPECT_FALSE(s.launch().under_launcher);
  // The helpers are single-process versions.
  EXPECT_TRUE(all_ranks_equal("anything"));
  EXPECT_EQ(gather_strings_to_root("mine"), std::vector<std::string>{"mine"});
  std::string t = "kept";
  broadcast_string(t, 0);
  EXPECT_EQ(t, "kept");
  EXPECT_EQ(all_reduce_max(-7), -7);
}

#ifndef SHARDSCOPE_WITH_MPI
TEST(comm_launch, BuildWithoutMpiRefusesAMultiRankLaunch) {
  LaunchEnv env;
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("OMPI_COMM_WORLD_RANK", "1");
  expect_usage_error([] { MpiSession s(nullptr, nullptr); },
                     {"launched by mpirun with 4 ranks but this build has no MPI"});
  env.set("OMPI_COMM_WORLD_SIZE", "1");
  env.set("OMPI_COMM_WORLD_RANK", "0");
  MpiSession one(nullptr, nullptr);  // mpirun -np 1 is fine
  EXPECT_FALSE(one.active());
}
#endif

}  // namespace
}  // namespace shardscope
