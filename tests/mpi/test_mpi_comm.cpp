// The MPI communicator and the MPI helpers, run under mpirun at W = 2, 3 and 4.
//
// Every rank fills its buffers from a seed, so every rank can regenerate every other
// rank's data and compute the exact expected result locally. Values are k/8 with
// 1 <= |k| <= 64, so sums over at most a few ranks are exact and results compare bit
// for bit. Each test runs on two backends: the CPU backend (host buffers straight to
// MPI) and a "staged" backend whose memory holds each float byte-reversed, so that a
// communicator that handed its buffers to MPI without download/upload would produce
// wrong sums; and with MPI calls capped at the default count and at 7 floats (so that
// every chunked path runs).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "support/random_data.hpp"
#include "support/mathless_backend.hpp"
#include "harness/backends/cpu_backend.hpp"
#include "harness/comm/mpi_comm.hpp"
#include "harness/comm/mpi_env.hpp"
#include "shardscope/backend.hpp"
#include "shardscope/check.hpp"
#include "shardscope/comm.hpp"

namespace shardscope {
namespace {


std::vector<float> seeded(std::uint64_t seed, int rank, std::size_t n, std::size_t first = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = testing::exact_value(seed, rank, first + i);
  return v;
}

bool all_nonzero(const std::vector<float>& v) {
  return std::none_of(v.begin(), v.end(), [](float x) { return x == 0.0f; });
}

int mpi_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int mpi_world() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Memory that is not host memory as far as MPI is concerned: each float is stored
// byte-reversed; upload/download translate, copy moves the stored bytes.
class StagedBackend final : public testing::MathlessBackend {
 public:
  std::string name() const override { return "staged"; }
  void copy(float* dst, const float* src, std::size_t n) override {
    std::memmove(dst, src, n * sizeof(float));
  }
  void fill(float*, float, std::size_t) override { unused(); }
  void upload(float* dst, const float* host, std::size_t n) override {
    ++uploads;
    for (std::size_t i = 0; i < n; ++i) dst[i] = reversed(host[i]);
  }
  void download(float* host, const float* src, std::size_t n) override {
    ++downloads;
    for (std::size_t i = 0; i < n; ++i) host[i] = reversed(src[i]);
  }
  void synchronize() override {}

  int uploads = 0, downloads = 0;

 private:
  static float reversed(float x) {
    unsigned char b[sizeof(float)];
    std::memcpy(b, &x, sizeof b);
    std::reverse(b, b + sizeof b);
    std::memcpy(&x, b, sizeof b);
    return x;
  }
};

struct Param {
  const char* backend;   // "cpu" or "staged"
  std::size_t max_count;  // floats per MPI call
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.backend << ", max_count " << p.max_count;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(info.param.backend) +
         (info.param.max_count == kMpiMaxCount ? std::string()
                                               : "_chunk" + std::to_string(info.param.max_count));
}

class MpiComm : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (std::string(GetParam().backend) == "cpu")
      backend_ = std::make_unique<CpuBackend>();
    else
      backend_ = std::make_unique<StagedBackend>();
    comm_ = make_mpi_communicator(backend_.get(), GetParam().max_count);
    rank_ = comm_->rank();
    world_ = comm_->world();
  }
  bool chunked() const { return GetParam().max_count != kMpiMaxCount; }

  // A backend buffer holding `host`.
  Buffer put(const std::vector<float>& host) {
    Buffer b = backend_->alloc(Category::comm, host.size());
    backend_->upload(b.data(), host.data(), host.size());
    return b;
  }
  std::vector<float> get(const float* p, std::size_t n) {
    std::vector<float> h(n);
    backend_->download(h.data(), p, n);
    return h;
  }
  std::vector<float> get(const Buffer& b) { return get(b.data(), b.count()); }
  void expect_staged_traffic() {
    if (auto* s = dynamic_cast<StagedBackend*>(backend_.get())) {
      EXPECT_GT(s->downloads, 0);
      EXPECT_GT(s->uploads, 0);
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  int rank_ = 0;
  int world_ = 1;
};

TEST_P(MpiComm, WorldMatchesMpi) {
  EXPECT_EQ(comm_->name(), "mpi");
  EXPECT_FALSE(comm_->emulated());
  EXPECT_EQ(rank_, mpi_rank());
  EXPECT_EQ(world_, mpi_world());
  EXPECT_GE(world_, 2);
}

TEST_P(MpiComm, AllReduceSumsEveryRank) {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{1001},
                        std::size_t{4099}}) {
    const auto mine = seeded(n, rank_, n);
    ASSERT_TRUE(all_nonzero(mine));
    std::vector<float> want(n, 0.0f);
    for (int r = 0; r < world_; ++r)
      for (std::size_t i = 0; i < n; ++i) want[i] += testing::exact_value(n, r, i);
    // A sum may cancel to zero here and there, never mostly.
    ASSERT_GT(std::count_if(want.begin(), want.end(), [](float x) { return x != 0.0f; }),
              static_cast<std::ptrdiff_t>(n / 2));
    Buffer buf = put(mine);
    comm_->all_reduce_sum(buf.data(), n);
    EXPECT_EQ(get(buf), want) << "n=" << n;
  }
  expect_staged_traffic();
}

TEST_P(MpiComm, ReduceScatterSumsThisRanksSlice) {
  for (std::size_t rc : {std::size_t{1}, std::size_t{5}, std::size_t{333}}) {
    for (bool in_place : {false, true}) {
      const std::size_t total = rc * world_;
      const auto mine = seeded(rc, rank_, total);
      ASSERT_TRUE(all_nonzero(mine));
      std::vector<float> want(rc, 0.0f);
      for (int r = 0; r < world_; ++r)
        for (std::size_t j = 0; j < rc; ++j) want[j] += testing::exact_value(rc, r, rank_ * rc + j);
      Buffer send = put(mine);
      Buffer out;
      float* recv = send.data() + rank_ * rc;  // in place: the shard's own slot
      if (!in_place) {
        out = put(std::vector<float>(rc, -3.0f));
        recv = out.data();
      }
      comm_->reduce_scatter_sum(send.data(), recv, rc);
      EXPECT_EQ(get(recv, rc), want) << "rc=" << rc << " in_place=" << in_place;
    }
  }
  expect_staged_traffic();
}

TEST_P(MpiComm, AllGatherConcatenatesInRankOrder) {
  for (std::size_t sc : {std::size_t{1}, std::size_t{5}, std::size_t{333}}) {
    for (bool in_place : {false, true}) {
      const std::size_t total = sc * world_;
      std::vector<float> want;
      for (int r = 0; r < world_; ++r) {
        const auto part = seeded(sc + 1000, r, sc);
        want.insert(want.end(), part.begin(), part.end());
      }
      ASSERT_TRUE(all_nonzero(want));
      const auto mine = seeded(sc + 1000, rank_, sc);
      Buffer recv = put(std::vector<float>(total, -3.0f));
      Buffer send;
      const float* src = recv.data() + rank_ * sc;
      if (in_place) {
        backend_->upload(recv.data() + rank_ * sc, mine.data(), sc);
      } else {
        send = put(mine);
        src = send.data();
      }
      comm_->all_gather(src, recv.data(), sc);
      EXPECT_EQ(get(recv), want) << "sc=" << sc << " in_place=" << in_place;
    }
  }
  expect_staged_traffic();
}

// The non-blocking calls (--overlap on): several in flight at once, progressed, waited
// for out of order, with the blocking calls' results; each counted once, its exposed_ms
// within its ms. A reduce-scatter in place and a chunked all-gather take the copies MPI
// reads from along until they complete.
TEST_P(MpiComm, NonBlockingCallsOverlapAndMatchTheBlockingOnes) {
  const std::size_t n = 4099, rc = 333, sc = 333;
  std::vector<float> want_sum(n, 0.0f), want_shard(rc, 0.0f), want_gather;
  for (int r = 0; r < world_; ++r) {
    for (std::size_t i = 0; i < n; ++i) want_sum[i] += testing::exact_value(n, r, i);
    for (std::size_t j = 0; j < rc; ++j) want_shard[j] += testing::exact_value(rc, r, rank_ * rc + j);
    const auto part = seeded(sc + 2000, r, sc);
    want_gather.insert(want_gather.end(), part.begin(), part.end());
  }
  ASSERT_TRUE(all_nonzero(want_gather));
  // Sums may cancel to zero here and there, never mostly.
  for (const auto* v : {&want_sum, &want_shard})
    ASSERT_GT(std::count_if(v->begin(), v->end(), [](float x) { return x != 0.0f; }),
              static_cast<std::ptrdiff_t>(v->size() / 2));
  Buffer sum = put(seeded(n, rank_, n));
  Buffer flat = put(seeded(rc, rank_, rc * world_));
  float* shard = flat.data() + rank_ * rc;  // in place
  Buffer gathered = put(std::vector<float>(sc * world_, -3.0f));
  Buffer mine = put(seeded(sc + 2000, rank_, sc));

  comm_->reset_ledger();
  CommTicket a = comm_->start_all_reduce_sum(sum.data(), n);
  CommTicket b = comm_->start_reduce_scatter_sum(flat.data(), shard, rc);
  CommTicket c = comm_->start_all_gather(mine.data(), gathered.data(), sc);
  EXPECT_EQ(comm_->in_flight(), 3);
  for (int i = 0; i < 5; ++i) comm_->progress();
  comm_->wait(c);
  comm_->wait(a);
  comm_->wait(b);
  EXPECT_EQ(comm_->in_flight(), 0);
  EXPECT_EQ(get(sum), want_sum);
  EXPECT_EQ(get(shard, rc), want_shard);
  EXPECT_EQ(get(gathered), want_gather);
  const CommLedger& l = comm_->ledger();
  EXPECT_EQ(l[CollKind::all_reduce].calls, 1);
  EXPECT_EQ(l[CollKind::all_reduce].bytes, static_cast<std::int64_t>(n * 4));
  EXPECT_EQ(l[CollKind::reduce_scatter].bytes, static_cast<std::int64_t>(rc * world_ * 4));
  EXPECT_EQ(l[CollKind::all_gather].bytes, static_cast<std::int64_t>(sc * world_ * 4));
  for (const CollStats& st : l.by_kind) {
    EXPECT_GE(st.exposed_ms, 0.0);
    EXPECT_LE(st.exposed_ms, st.ms);
  }
  expect_staged_traffic();
}

TEST_P(MpiComm, BroadcastCopiesTheRootsBuffer) {
  const std::size_t n = 1001;
  for (int root = 0; root < world_; ++root) {
    const auto want = seeded(50 + root, root, n);
    const auto mine = rank_ == root ? want : seeded(70, rank_, n);
    ASSERT_TRUE(all_nonzero(mine));
    Buffer buf = put(mine);
    comm_->broadcast(buf.data(), n, root);
    EXPECT_EQ(get(buf), want) << "root=" << root;
  }
  expect_staged_traffic();
}

TEST_P(MpiComm, LedgerCountsNcclTestsBytesLikeTheFakeRank) {
  const int next = (rank_ + 1) % world_, prev = (rank_ + world_ - 1) % world_;
  CommOptions fo;
  fo.kind = "fake";
  fo.emulate_world = world_;
  fo.emulate_rank = rank_;
  auto fake = make_communicator(fo, nullptr);
  for (Communicator* c : {comm_.get(), fake.get()}) {
    Buffer a = put(seeded(1, rank_, 1001)), s = put(seeded(2, rank_, 5 * world_));
    Buffer r = put(seeded(3, rank_, 5)), g = put(seeded(4, rank_, 3 * world_));
    Buffer m = put(seeded(5, rank_, 3)), p = put(seeded(6, rank_, 6));
    Buffer q = put(seeded(7, rank_, 6));
    c->all_reduce_sum(a.data(), 1001);
    c->all_reduce_sum(a.data(), 1001);
    c->reduce_scatter_sum(s.data(), r.data(), 5);
    c->all_gather(m.data(), g.data(), 3);
    c->broadcast(a.data(), 10, world_ - 1);
    c->p2p({{true, p.data(), 6, next}, {false, q.data(), 6, prev}});
    c->barrier();
  }
  const CommLedger& l = comm_->ledger();
  const std::int64_t want_bytes[kCollKindCount] = {2 * 1001 * 4, 5 * 4 * world_, 3 * 4 * world_,
                                                   40, 24, 24};
  const std::int64_t want_calls[kCollKindCount] = {2, 1, 1, 1, 1, 1};
  for (int k = 0; k < kCollKindCount; ++k) {
    EXPECT_EQ(l.by_kind[k].calls, want_calls[k]) << kCollKindNames[k];
    EXPECT_EQ(l.by_kind[k].bytes, want_bytes[k]) << kCollKindNames[k];
    EXPECT_EQ(fake->ledger().by_kind[k].calls, want_calls[k]) << kCollKindNames[k];
    EXPECT_EQ(fake->ledger().by_kind[k].bytes, want_bytes[k]) << kCollKindNames[k];
    EXPECT_GE(l.by_kind[k].ms, 0.0) << kCollKindNames[k];
  }
  EXPECT_GT(l[CollKind::all_reduce].ms, 0.0);
  EXPECT_GT(busbw_gbps(l[CollKind::all_reduce], CollKind::all_reduce, world_), 0.0);
}

TEST_P(MpiComm, P2pRingMatchesMessagesInOrder) {
  const int next = (rank_ + 1) % world_, prev = (rank_ + world_ - 1) % world_;
  // Two messages of different sizes each way: ops to one peer match in posting order.
  Buffer a = put(seeded(100, rank_, 5)), b = put(seeded(200, rank_, 19));
  Buffer ra = put(std::vector<float>(5, -3.0f)), rb = put(std::vector<float>(19, -3.0f));
  comm_->p2p({{true, a.data(), 5, next},
              {true, b.data(), 19, next},
              {false, ra.data(), 5, prev},
              {false, rb.data(), 19, prev}});
  EXPECT_EQ(get(ra), seeded(100, prev, 5));
  EXPECT_EQ(get(rb), seeded(200, prev, 19));
  EXPECT_EQ(comm_->ledger()[CollKind::send].calls, 2);
  EXPECT_EQ(comm_->ledger()[CollKind::send].bytes, 24 * 4);
  EXPECT_EQ(comm_->ledger()[CollKind::recv].calls, 2);
  EXPECT_EQ(comm_->ledger()[CollKind::recv].bytes, 24 * 4);
  expect_staged_traffic();
}

TEST_P(MpiComm, LargeTwoWayExchangesComplete) {
  // 4 MiB each way, both sides posting their send first: blocking sends would deadlock
  // (far above any eager limit). Chunked runs use a smaller size to keep the request
  // count sane; they still split every message.
  const std::size_t n = chunked() ? 7 * 9 + 3 : (std::size_t{4} << 20) / sizeof(float);
  const int partner = rank_ ^ 1;
  if (partner < world_) {
    Buffer out = put(seeded(300, rank_, n)), in = put(std::vector<float>(n, -3.0f));
    comm_->p2p({{true, out.data(), n, partner}, {false, in.data(), n, partner}});
    EXPECT_EQ(get(in), seeded(300, partner, n));
  }
  // Everyone at once, both directions of the ring (covers the odd rank out at W = 3).
  const int next = (rank_ + 1) % world_, prev = (rank_ + world_ - 1) % world_;
  Buffer to_next = put(seeded(400, rank_, n)), to_prev = put(seeded(500, rank_, n));
  Buffer from_prev = put(std::vector<float>(n, -3.0f));
  Buffer from_next = put(std::vector<float>(n, -3.0f));
  comm_->p2p({{true, to_next.data(), n, next},
              {true, to_prev.data(), n, prev},
              {false, from_prev.data(), n, prev},
              {false, from_next.data(), n, next}});
  // At W = 2 next == prev: the peer's two messages arrive in its posting order, which
  // is the same pairing.
  EXPECT_EQ(get(from_prev), seeded(400, prev, n));
  EXPECT_EQ(get(from_next), seeded(500, next, n));
}

TEST_P(MpiComm, SendAndRecvOneAtATime) {
  const std::size_t n = 123;
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r) {
      Buffer b = put(seeded(600 + r, 0, n));
      comm_->send(b.data(), n, r);
    }
    EXPECT_EQ(comm_->ledger()[CollKind::send].calls, world_ - 1);
    EXPECT_EQ(comm_->ledger()[CollKind::send].bytes,
              (world_ - 1) * 4 * static_cast<std::int64_t>(n));
  } else {
    Buffer b = put(std::vector<float>(n, -3.0f));
    comm_->recv(b.data(), n, 0);
    EXPECT_EQ(get(b), seeded(600 + rank_, 0, n));
    EXPECT_EQ(comm_->ledger()[CollKind::recv].calls, 1);
  }
  comm_->barrier();
}

TEST_P(MpiComm, RefusesPeersAndRootsOutsideTheWorld) {
  std::vector<float> x(4, 1.0f);
  Buffer b = put(x);
  EXPECT_THROW(comm_->send(b.data(), 4, world_), RunError);
  EXPECT_THROW(comm_->recv(b.data(), 4, -1), RunError);
  EXPECT_THROW(comm_->broadcast(b.data(), 4, world_), RunError);
  EXPECT_EQ(comm_->ledger().total_bytes(), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, MpiComm,
                         ::testing::Values(Param{"cpu", kMpiMaxCount}, Param{"staged", kMpiMaxCount},
                                         Param{"cpu", 7}, Param{"staged", 7}),
                         param_name);

// ---- MPI errors --------------------------------------------------------------------------

TEST(MpiCheck, NamesTheRankTheCallAndMpisError) {
  const std::string prefix = "rank " + std::to_string(mpi_rank()) + ": MPI_Bcast failed: ";
  try {
    mpi_check(MPI_ERR_COUNT, "MPI_Bcast(buf, -1, MPI_FLOAT, 0, comm)", "x.cpp", 12);
    ADD_FAILURE() << "no RunError";
  } catch (const RunError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
    EXPECT_NE(msg.find("x.cpp:12"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(mpi_check(MPI_SUCCESS, "MPI_Barrier(comm)", "x.cpp", 13));

  // A real failure, returned (not fatal) on a communicator with MPI_ERRORS_RETURN.
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  float f = 1.0f;
  try {
    MPI_CHECK(MPI_Bcast(&f, -1, MPI_FLOAT, 0, c));
    ADD_FAILURE() << "MPI_Bcast with count -1 succeeded";
  } catch (const RunError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
    EXPECT_NE(msg.find("MPI_ERR_COUNT"), std::string::npos) << msg;
  }
  MPI_Comm_free(&c);
}

// ---- helpers for the run command ----------------------------------------------------------

TEST(MpiHelpers, AllRanksEqual) {
  const int rank = mpi_rank(), world = mpi_world();
  EXPECT_TRUE(all_ranks_equal("--strategy zero3 --layers 8"));
  EXPECT_TRUE(all_ranks_equal(""));
  EXPECT_FALSE(all_ranks_equal("rank " + std::to_string(rank)));
  EXPECT_FALSE(all_ranks_equal(rank == world - 1 ? "abd" : "abc"));  // same length
  EXPECT_FALSE(all_ranks_equal(rank == 0 ? "abcd" : "abc"));
  EXPECT_FALSE(all_ranks_equal(rank == 1 ? "" : "x"));
}

TEST(MpiHelpers, GatherStringsToRootInRankOrder) {
  const int rank = mpi_rank(), world = mpi_world();
  auto text = [](int r) {
    return r == 1 ? std::string() : "rank " + std::to_string(r) + std::string(r * 3, 'x');
  };
  const auto got = gather_strings_to_root(text(rank));
  if (rank == 0) {
    ASSERT_EQ(static_cast<int>(got.size()), world);
    for (int r = 0; r < world; ++r) EXPECT_EQ(got[r], text(r));
  } else {
    EXPECT_TRUE(got.empty());
  }
}

TEST(MpiHelpers, BroadcastStringAndMax) {
  const int rank = mpi_rank(), world = mpi_world();
  std::string s = rank == world - 1 ? std::string("from the last rank") : std::string(rank, 'q');
  broadcast_string(s, world - 1);
  EXPECT_EQ(s, "from the last rank");
  EXPECT_EQ(all_reduce_max(10 * rank - 5), 10 * (world - 1) - 5);
}

TEST(MpiHelpers, SessionAdoptsAnInitialisedMpi) {
  {
    MpiSession s(nullptr, nullptr);
    EXPECT_TRUE(s.active());
    EXPECT_EQ(s.rank(), mpi_rank());
    EXPECT_EQ(s.world(), mpi_world());
    const LaunchInfo l = detect_launch();
    EXPECT_TRUE(l.under_launcher);
    EXPECT_EQ(l.world, mpi_world());
    EXPECT_EQ(l.rank, mpi_rank());
  }
  EXPECT_TRUE(mpi_active());  // the session did not finalise what it did not initialise
  EXPECT_EQ(all_reduce_max(1), 1);
}

// The rank on this node comes from MPI (MPI_COMM_TYPE_SHARED, in world-rank order), not
// from launcher variables that say otherwise. These tests run every rank on one node,
// so it equals the world rank.
TEST(MpiHelpers, SessionTakesTheLocalRankFromMpi) {
  const char* names[] = {"SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const char* n : names) {
    const char* v = std::getenv(n);
    saved.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
    setenv(n, "0", 1);  // every rank told it is the node's first
  }
  {
    MpiSession s(nullptr, nullptr);
    EXPECT_EQ(s.local_rank(), mpi_rank());
  }
  for (const auto& [n, v] : saved) {
    if (v)
      setenv(n.c_str(), v->c_str(), 1);
    else
      unsetenv(n.c_str());
  }
}

}  // namespace
}  // namespace shardscope
