// The memory tracker (include/shardscope/tracker.hpp) and the tracked allocation path of
// the Backend: peaks, the breakdown at the peak instant, phase and place at the peak,
// reset_peak, rounded figures, Buffer RAII, and out-of-memory errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "shardscope/check.hpp"
#include "shardscope/tracker.hpp"

namespace shardscope {
namespace {

CategoryBytes bytes_of(std::initializer_list<std::pair<Category, std::int64_t>> items) {
  CategoryBytes b;
  for (const auto& [c, n] : items) b[c] += n;
  return b;
}

TEST(Tracker, KnownPeakOfAnAllocFreeSequence) {
  Tracker t;
  t.on_alloc(Category::param, 1000, 1024);
  t.on_alloc(Category::grad, 1000, 1024);
  t.on_alloc(Category::activation, 300, 320);
  t.on_free(Category::activation, 300, 320);
  t.on_alloc(Category::temp, 500, 512);   // 2500: the peak
  t.on_free(Category::temp, 500, 512);
  t.on_alloc(Category::comm, 400, 448);   // 2400: below the peak
  EXPECT_EQ(t.current_total(), 2400);
  EXPECT_EQ(t.peak().total, 2500);
  EXPECT_EQ(t.peak().by_category,
            bytes_of({{Category::param, 1000}, {Category::grad, 1000}, {Category::temp, 500}}));
  EXPECT_EQ(t.peak().by_category.total(), t.peak().total);
  EXPECT_EQ(t.current(), bytes_of({{Category::param, 1000}, {Category::grad, 1000}, {Category::comm, 400}}));
  EXPECT_EQ(t.live_allocations(), 3);
}

TEST(Tracker, PeakBreakdownIsTheInstantNotThePerCategoryMaxima) {
  Tracker t;
  t.on_alloc(Category::activation, 800, 800);
  t.on_alloc(Category::temp, 100, 128);     // 900 = peak: activation 800 + temp 100
  t.on_free(Category::activation, 800, 800);
  t.on_alloc(Category::temp, 700, 704);     // 800: temp's own maximum, but not the peak
  EXPECT_EQ(t.peak().total, 900);
  EXPECT_EQ(t.peak().by_category[Category::activation], 800);
  EXPECT_EQ(t.peak().by_category[Category::temp], 100);
}

TEST(Tracker, PhaseAndPlaceAreThoseAtThePeak) {
  Tracker t;
  t.mark(Phase::forward, {PlaceKind::layer, 0});
  t.on_alloc(Category::activation, 100, 128);
  t.mark(Phase::forward, {PlaceKind::layer, 2});
  t.on_alloc(Category::activation, 100, 128);  // 200: the peak, at forward layer 2
  t.mark(Phase::backward, {PlaceKind::layer, 1});
  t.on_free(Category::activation, 100, 128);
  t.on_alloc(Category::temp, 50, 64);          // 150: no new peak
  t.mark(Phase::optimizer, {PlaceKind::tensor, 3});
  EXPECT_EQ(t.peak().total, 200);
  EXPECT_EQ(t.peak().phase, Phase::forward);
  EXPECT_EQ(t.peak().place, (Place{PlaceKind::layer, 2}));
  EXPECT_EQ(t.phase(), Phase::optimizer);
  // Equalling the peak does not move it: the first instant wins.
  t.mark(Phase::communication, {PlaceKind::unit, 5});
  t.on_alloc(Category::comm, 50, 64);  // 200 again
  EXPECT_EQ(t.peak().phase, Phase::forward);
  t.on_alloc(Category::comm, 4, 64);   // 204: a new peak, here
  EXPECT_EQ(t.peak().phase, Phase::communication);
  EXPECT_EQ(t.peak().place, (Place{PlaceKind::unit, 5}));
  EXPECT_EQ(t.peak().by_category[Category::comm], 54);
}

TEST(Tracker, ResetPeakStartsANewWindowFromTheCurrentState) {
  Tracker t;
  t.on_alloc(Category::param, 1000, 1024);
  t.on_alloc(Category::temp, 5000, 5056);
  t.on_free(Category::temp, 5000, 5056);
  EXPECT_EQ(t.peak().total, 6000);
  EXPECT_EQ(t.rounded_peak(), 6080);
  t.mark(Phase::idle);
  t.reset_peak();
  EXPECT_EQ(t.peak().total, 1000);
  EXPECT_EQ(t.peak().by_category, bytes_of({{Category::param, 1000}}));
  EXPECT_EQ(t.peak().phase, Phase::idle);
  EXPECT_EQ(t.rounded_peak(), 1024);
  t.mark(Phase::backward, {PlaceKind::unit, 1});
  t.on_alloc(Category::grad_unsharded, 200, 256);
  EXPECT_EQ(t.peak().total, 1200);
  EXPECT_EQ(t.peak().phase, Phase::backward);
  EXPECT_EQ(t.rounded_peak(), 1280);
}

TEST(Tracker, RoundedFiguresAreKeptBesideRequested) {
  Tracker t;
  t.on_alloc(Category::temp, 4, 64);
  t.on_alloc(Category::temp, 4, 64);
  t.on_alloc(Category::param, 100, 128);
  EXPECT_EQ(t.current_total(), 108);
  EXPECT_EQ(t.rounded_current(), 256);
  t.on_free(Category::temp, 4, 64);
  EXPECT_EQ(t.rounded_current(), 192);
  EXPECT_EQ(t.rounded_peak(), 256);
  t.on_free(Category::temp, 4, 64);
  t.on_free(Category::param, 100, 128);
  EXPECT_EQ(t.current_total(), 0);
  EXPECT_EQ(t.rounded_current(), 0);
  EXPECT_EQ(t.live_allocations(), 0);
}

// ---- Buffer RAII through a backend -------------------------------------------------

TEST(Tracker, BufferDestructionFreesAndUntracks) {
  CpuBackend be;
  {
    Buffer b = be.alloc(Category::grad, 10);
    EXPECT_EQ(be.tracker().current()[Category::grad], 40);
    EXPECT_EQ(be.tracker().live_allocations(), 1);
  }
  EXPECT_EQ(be.tracker().current_total(), 0);
  EXPECT_EQ(be.tracker().rounded_current(), 0);
  EXPECT_EQ(be.tracker().live_allocations(), 0);
  EXPECT_EQ(be.tracker().peak().total, 40);
}

TEST(Tracker, BufferMoveTransfersOwnershipOnce) {
  CpuBackend be;
  Buffer a = be.alloc(Category::param, 16);
  float* data = a.data();
  Buffer b(std::move(a));  // move construction
  EXPECT_FALSE(a);         // NOLINT(bugprone-use-after-move): the moved-from state is the API
  EXPECT_EQ(a.count(), 0u);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.count(), 16u);
  EXPECT_EQ(b.category(), Category::param);
  EXPECT_EQ(be.tracker().current_total(), 64);

  Buffer c = be.alloc(Category::temp, 8);
  c = std::move(b);  // move assignment frees c's old allocation first
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(be.tracker().current()[Category::temp], 0);
  EXPECT_EQ(be.tracker().current()[Category::param], 64);
  EXPECT_EQ(be.tracker().live_allocations(), 1);

  Buffer& alias = c;
  c = std::move(alias);  // self-move keeps the allocation
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(be.tracker().live_allocations(), 1);

  std::vector<Buffer> held;
  held.push_back(std::move(c));
  held.push_back(be.alloc(Category::optim, 4));
  held.reserve(100);  // reallocation moves the Buffers: nothing freed twice
  EXPECT_EQ(be.tracker().current_total(), 64 + 16);
  held.clear();
  EXPECT_EQ(be.tracker().current_total(), 0);
  EXPECT_EQ(be.tracker().live_allocations(), 0);
}

TEST(Tracker, BufferResetFreesNowAndOnlyOnce) {
  CpuBackend be;
  Buffer b = be.alloc(Category::activation, 100);
  Buffer keep = be.alloc(Category::param, 1);
  b.reset();
  EXPECT_FALSE(b);
  EXPECT_EQ(b.count(), 0u);
  EXPECT_EQ(be.tracker().current()[Category::activation], 0);
  b.reset();  // a second reset does nothing
  EXPECT_EQ(be.tracker().current_total(), 4);
  EXPECT_EQ(be.tracker().live_allocations(), 1);
  Buffer empty;
  empty.reset();  // a default Buffer owns nothing
  EXPECT_EQ(be.tracker().live_allocations(), 1);
}

TEST(Tracker, BackendPeakRecordsMarkedPhase) {
  CpuBackend be;
  Buffer p = be.alloc(Category::param, 256);
  be.tracker().mark(Phase::forward, {PlaceKind::layer, 1});
  {
    Buffer act = be.alloc(Category::activation, 1024);
    Buffer tmp = be.alloc(Category::temp, 1);
  }
  be.tracker().mark(Phase::optimizer);
  Buffer state = be.alloc(Category::optim, 512);
  const PeakRecord& peak = be.tracker().peak();
  EXPECT_EQ(peak.total, 4 * (256 + 1024 + 1));
  EXPECT_EQ(peak.phase, Phase::forward);
  EXPECT_EQ(peak.place, (Place{PlaceKind::layer, 1}));
  EXPECT_EQ(peak.by_category[Category::temp], 4);
  EXPECT_EQ(be.tracker().rounded_peak(), 1024 + 4096 + 64);
}

// ---- out of memory -----------------------------------------------------------------

// A CPU backend whose allocator always fails.
class ExhaustedBackend : public CpuBackend {
 protected:
  void* raw_alloc(std::size_t) override { return nullptr; }
};

TEST(Tracker, OutOfMemoryThrowsRunErrorNamingBytesAndCategory) {
  ExhaustedBackend be;
  try {
    Buffer b = be.alloc(Category::optim, 1000000);
    FAIL() << "alloc succeeded on an exhausted allocator";
  } catch (const RunError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("out of memory"), std::string::npos) << what;
    EXPECT_NE(what.find("4,000,000 B"), std::string::npos) << what;
    EXPECT_NE(what.find("optim"), std::string::npos) << what;
  }
  // A failed allocation leaves no trace in the tracker.
  EXPECT_EQ(be.tracker().current_total(), 0);
  EXPECT_EQ(be.tracker().rounded_current(), 0);
  EXPECT_EQ(be.tracker().live_allocations(), 0);
  EXPECT_EQ(be.tracker().peak().total, 0);
}

TEST(Tracker, ImpossibleCountThrowsRunError) {
  CpuBackend be;
  EXPECT_THROW(be.alloc(Category::temp, static_cast<std::size_t>(-1)), RunError);
  EXPECT_EQ(be.tracker().live_allocations(), 0);
}

}  // namespace
}  // namespace shardscope
