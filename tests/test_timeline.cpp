// The memory timeline (include/shardscope/timeline.hpp): it records every allocation and
// free exactly (integrating it gives the tracker's bytes), coalescing past its limit keeps
// the peak and says so, spans nest and carry a collective's bytes, recording never changes
// what is measured, and the rank record's "timeline" has the documented shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "harness/records/json_write.hpp"
#include "harness/run/records.hpp"
#include "harness/pipeline/run_pipeline.hpp"
#include "shardscope/timeline.hpp"
#include "shardscope/tracker.hpp"
#include "support/pipeline_configs.hpp"
#include "support/dp_harness.hpp"

namespace shardscope {
namespace {

CategoryBytes integrate(const Timeline& t) {
  CategoryBytes b = t.start_state();
  for (const TimelineSample& s : t.samples()) b[s.category] += s.delta;
  return b;
}

std::int64_t max_total(const Timeline& t) {
  std::int64_t m = t.start_state().total();
  for (const TimelineSample& s : t.samples()) m = std::max(m, s.bytes.total());
  return m;
}

// The mark in force at `t_ns`: an event's phase and place.
const PhaseMark& mark_in_force(const Timeline& t, std::int64_t t_ns) {
  const PhaseMark* in_force = &t.marks().front();
  for (const PhaseMark& m : t.marks())
    if (m.t_ns <= t_ns) in_force = &m;
  return *in_force;
}

// Waits for the timeline's clock to move past its last sample, so that a mark made next
// is strictly later than every event before it (two clock reads can return one ns).
void after_last_sample(const Timeline& t) {
  while (!t.samples().empty() && t.now_ns() <= t.samples().back().t_ns) {
  }
}

TEST(Timeline, RecordsEveryAllocAndFreeWithCategoryBytesAndPlace) {
  Tracker t;
  t.on_alloc(Category::param, 1000, 1024);  // before recording: the start state
  t.set_recording(true);
  t.mark(Phase::forward, {PlaceKind::layer, 0});
  t.on_alloc(Category::activation, 300, 320);
  after_last_sample(t.timeline());
  t.mark(Phase::forward, {PlaceKind::layer, 1});
  t.on_alloc(Category::temp, 500, 512);
  after_last_sample(t.timeline());
  t.mark(Phase::backward, {PlaceKind::unit, 2});
  t.on_free(Category::temp, 500, 512);
  t.on_free(Category::activation, 300, 320);
  t.on_alloc(Category::grad_unsharded, 64, 64);

  const Timeline& tl = t.timeline();
  EXPECT_EQ(tl.start_state()[Category::param], 1000);
  ASSERT_EQ(tl.samples().size(), 5u);
  EXPECT_EQ(tl.events(), 5);
  EXPECT_FALSE(tl.coalesced());
  const std::vector<std::int64_t> deltas = {300, 500, -500, -300, 64};
  const std::vector<Category> cats = {Category::activation, Category::temp, Category::temp, Category::activation,
                                      Category::grad_unsharded};
  CategoryBytes state = tl.start_state();
  std::int64_t last_t = 0;
  for (std::size_t i = 0; i < tl.samples().size(); ++i) {
    const TimelineSample& s = tl.samples()[i];
    EXPECT_EQ(s.delta, deltas[i]) << i;
    EXPECT_EQ(s.category, cats[i]) << i;
    state[s.category] += s.delta;
    EXPECT_EQ(s.bytes, state) << "each sample is the state after its event, " << i;
    EXPECT_GE(s.t_ns, last_t) << "steady clock: times never go back";
    last_t = s.t_ns;
  }
  EXPECT_EQ(mark_in_force(tl, tl.samples()[1].t_ns).phase, Phase::forward);
  EXPECT_EQ(mark_in_force(tl, tl.samples()[1].t_ns).place, (Place{PlaceKind::layer, 1}));
  EXPECT_EQ(mark_in_force(tl, tl.samples()[2].t_ns).phase, Phase::backward);
  EXPECT_EQ(mark_in_force(tl, tl.samples()[2].t_ns).place, (Place{PlaceKind::unit, 2}));
  EXPECT_EQ(integrate(tl), t.current());
  EXPECT_EQ(max_total(tl), t.peak().total);
  EXPECT_EQ(tl.samples().back().bytes, t.current());
}

TEST(Timeline, IntegratingABackendsTimelineGivesTheTrackersCurrentBytes) {
  CpuBackend be;
  be.tracker().set_recording(true);
  std::vector<Buffer> held;
  for (int i = 0; i < 200; ++i) {
    held.push_back(be.alloc(static_cast<Category>(i % kCategoryCount), static_cast<std::size_t>(1 + i * 7)));
    if (i % 3 == 2) held.erase(held.begin() + (i % static_cast<int>(held.size())));
  }
  const Timeline& tl = be.tracker().timeline();
  EXPECT_GT(be.tracker().current_total(), 0);
  EXPECT_EQ(tl.events(), static_cast<std::int64_t>(tl.samples().size()));
  EXPECT_EQ(integrate(tl), be.tracker().current());
  EXPECT_EQ(max_total(tl), be.tracker().peak().total);
  held.clear();
  EXPECT_EQ(integrate(tl), CategoryBytes{});
  EXPECT_EQ(tl.samples().back().bytes.total(), 0);
}

TEST(Timeline, RecordingOffRecordsNothing) {
  Tracker t;
  t.on_alloc(Category::param, 10, 64);
  t.push_span("ignored", -1);
  t.pop_span();
  EXPECT_FALSE(t.recording());
  EXPECT_TRUE(t.timeline().samples().empty());
  EXPECT_TRUE(t.timeline().spans().empty());
  t.set_recording(true);
  t.on_alloc(Category::param, 10, 64);
  t.set_recording(false);
  t.on_free(Category::param, 10, 64);
  EXPECT_EQ(t.timeline().samples().size(), 1u) << "events after switching off are not recorded";
}

TEST(Timeline, CoalescingPastTheLimitKeepsThePeakAndSaysSo) {
  Tracker t;
  t.timeline() = Timeline(16, 8);
  t.set_recording(true);
  std::int64_t events = 0;
  // A saw-tooth whose highest tooth (event ~600) is the peak; ends at a known state.
  for (int i = 0; i < 1000; ++i) {
    const std::int64_t b = 100 + (i % 17) * 10 + (i == 600 ? 100000 : 0);
    t.on_alloc(Category::activation, b, b);
    t.on_alloc(Category::temp, 8, 64);
    t.on_free(Category::activation, b, b);
    events += 3;
  }
  const Timeline& tl = t.timeline();
  EXPECT_LE(tl.samples().size(), tl.sample_limit());
  EXPECT_GE(tl.samples().size(), tl.sample_limit() / 2);
  EXPECT_TRUE(tl.coalesced());
  EXPECT_EQ(tl.events(), events);
  EXPECT_EQ(tl.merged_events(), events - static_cast<std::int64_t>(tl.samples().size()))
      << "every event is either a sample or counted as merged";
  EXPECT_EQ(max_total(tl), t.peak().total) << "the peak survives every merge";
  EXPECT_EQ(t.peak().total, 8 * 600 + 100 + (600 % 17) * 10 + 100000 + 8);
  EXPECT_EQ(tl.samples().back().bytes, t.current()) << "the latest sample is the current state";
  for (std::size_t i = 1; i < tl.samples().size(); ++i)
    EXPECT_GE(tl.samples()[i].t_ns, tl.samples()[i - 1].t_ns) << "samples stay in time order";

  const nlohmann::json j = to_json(timeline_record(tl));
  EXPECT_EQ(j["coalesced"], true);
  EXPECT_EQ(j["merged_events"], tl.merged_events());
  EXPECT_EQ(j["memory"].size(), tl.samples().size() + 1);
  std::int64_t json_peak = 0;
  for (const auto& row : j["memory"]) {
    std::int64_t total = 0;
    for (std::size_t c = 1; c < row.size(); ++c) total += row[c].get<std::int64_t>();
    json_peak = std::max(json_peak, total);
  }
  EXPECT_EQ(json_peak, t.peak().total);
}

TEST(Timeline, SpansNestCarryBytesAndStayBounded) {
  CpuBackend be;
  be.tracker().set_recording(true);
  {
    ScopedRange step(be, "step");
    {
      ScopedRange coll(be, "all_reduce 4096 B", 4096);
      Buffer b = be.alloc(Category::comm, 1024);
    }
    ScopedRange opt(be, "optimizer");
  }
  be.range_pop();  // an unmatched pop is ignored
  const Timeline& tl = be.tracker().timeline();
  ASSERT_EQ(tl.spans().size(), 3u);
  EXPECT_EQ(tl.open_spans(), 0u);
  const nlohmann::json j = to_json(timeline_record(tl));
  ASSERT_EQ(j["spans"].size(), 3u);
  const auto& spans = j["spans"];
  EXPECT_EQ(spans[0]["name"], "step");  // by start, the parent first
  EXPECT_EQ(spans[0]["depth"], 0);
  EXPECT_FALSE(spans[0].contains("bytes"));
  EXPECT_EQ(spans[1]["name"], "all_reduce 4096 B");
  EXPECT_EQ(spans[1]["depth"], 1);
  EXPECT_EQ(spans[1]["bytes"], 4096);
  EXPECT_EQ(spans[2]["name"], "optimizer");
  for (const auto& s : spans) {
    EXPECT_LE(s["start_ms"].get<double>(), s["end_ms"].get<double>());
    EXPECT_GE(s["start_ms"].get<double>(), spans[0]["start_ms"].get<double>());
    EXPECT_LE(s["end_ms"].get<double>(), spans[0]["end_ms"].get<double>());
  }

  Tracker t;
  t.timeline() = Timeline(16, 8);
  t.set_recording(true);
  for (int i = 0; i < 100; ++i) {
    t.push_span("x", -1);
    t.pop_span();
  }
  EXPECT_LE(t.timeline().spans().size(), 8u);
  EXPECT_EQ(t.timeline().dropped_spans() + static_cast<std::int64_t>(t.timeline().spans().size()), 100);
}

TEST(Timeline, JsonHasTheDocumentedShape) {
  CpuBackend be;
  Buffer keep = be.alloc(Category::param, 16);
  be.tracker().set_recording(true);
  be.tracker().mark(Phase::forward, {PlaceKind::layer, 3});
  {
    Buffer a = be.alloc(Category::activation, 8);
    Buffer b = be.alloc(Category::activation, 8);
  }
  be.tracker().mark(Phase::backward, {PlaceKind::unit, 1});
  Buffer g = be.alloc(Category::grad_unsharded, 4);
  const nlohmann::json j = to_json(timeline_record(be.tracker().timeline()));
  EXPECT_EQ(j["unit"], "ms since the run started");
  EXPECT_EQ(j["coalesced"], false);
  EXPECT_EQ(j["merged_events"], 0);
  ASSERT_EQ(j["categories"].size(), static_cast<std::size_t>(kCategoryCount));
  for (int c = 0; c < kCategoryCount; ++c) EXPECT_EQ(j["categories"][c], std::string(kCategoryNames[c]));
  ASSERT_EQ(j["memory"].size(), 6u);  // the start, then 5 events
  EXPECT_EQ(j["memory"][0], nlohmann::json({0.0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(j["memory"][2], nlohmann::json({j["memory"][2][0], 64, 0, 0, 0, 0, 64, 0, 0, 0, 0, 0}));
  EXPECT_EQ(j["memory"][5], nlohmann::json({j["memory"][5][0], 64, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0}));
  for (const auto& row : j["memory"]) ASSERT_EQ(row.size(), static_cast<std::size_t>(kCategoryCount) + 1);
  // Marks where the phase or place changes, from the start (setup, at 0): forward
  // layer 3, then backward unit 1, each when it was marked.
  ASSERT_EQ(j["marks"].size(), 3u);
  EXPECT_EQ(j["marks"][0], nlohmann::json({0.0, "setup", "-"}));
  EXPECT_EQ(j["marks"][1][1], "forward");
  EXPECT_EQ(j["marks"][1][2], "layer 3");
  EXPECT_EQ(j["marks"][2][1], "backward");
  EXPECT_EQ(j["marks"][2][2], "unit 1");
  EXPECT_LE(j["marks"][1][0].get<double>(), j["memory"][1][0].get<double>());
  EXPECT_LE(j["marks"][2][0].get<double>(), j["memory"][5][0].get<double>());
  EXPECT_GE(j["marks"][2][0].get<double>(), j["memory"][4][0].get<double>());
  EXPECT_EQ(j["dropped_marks"], 0);
  EXPECT_TRUE(j["spans"].is_array());
}

// A phase that allocates nothing (the fused AdamW update) is still on the timeline, and
// marking the same phase and place again adds nothing.
TEST(Timeline, APhaseWithoutAllocationsIsMarked) {
  CpuBackend be;
  be.tracker().set_recording(true);
  be.tracker().mark(Phase::backward, {PlaceKind::layer, 0});
  { Buffer a = be.alloc(Category::activation, 8); }
  be.tracker().mark(Phase::optimizer);
  be.tracker().mark(Phase::optimizer);
  const auto& marks = be.tracker().timeline().marks();
  ASSERT_EQ(marks.size(), 3u);  // setup, backward layer 0, optimizer
  EXPECT_EQ(marks.back().phase, Phase::optimizer);
  EXPECT_GE(marks.back().t_ns, be.tracker().timeline().samples().back().t_ns);
}

// Marks are bounded like spans: past the limit the older half goes, and is counted.
TEST(Timeline, MarksAreBounded) {
  Timeline t(4, 8);
  for (int i = 0; i < 100; ++i) t.mark(i % 2 ? Phase::forward : Phase::backward, {PlaceKind::layer, i});
  EXPECT_LE(t.marks().size(), 8u);
  EXPECT_EQ(t.dropped_marks() + static_cast<std::int64_t>(t.marks().size()), 100);
  EXPECT_EQ(t.marks().back().place.index, 99);
}

// ---- recording never changes what is measured ------------------------------------------

struct Measured {
  CategoryBytes resting;
  PeakRecord peak;
  std::string where;
  std::int64_t comm_bytes = 0;
};

// One emulated rank (the fake communicator moves no data, so bytes are exact and
// numerics are not compared); `out` gets the timeline while the strategy still lives.
Measured run_strategy(const RunConfig& cfg, int world, int rank, bool record, Timeline* out) {
  CpuBackend be;
  be.tracker().set_recording(record);
  auto comm = make_communicator(CommOptions{"fake", world, rank}, &be);
  StrategyContext ctx{cfg, be, *comm};
  auto strategy = make_strategy(ctx);
  strategy->setup();
  for (int s = 0; s < cfg.steps; ++s) {
    strategy->prepare_batch(s);
    strategy->step();
  }
  if (out) *out = be.tracker().timeline();
  const Tracker& t = be.tracker();
  return {t.current(), t.peak(), describe_place(t.peak().place), comm->ledger().total_bytes()};
}

TEST(Timeline, RecordingDoesNotChangeTheBytesMeasured) {
  for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3"}) {
    for (const int units : {0, 1}) {
      RunConfig cfg = testing::seed_config();
      cfg.model.layers = 4;
      cfg.model.width = 32;
      cfg.model.batch = 4;
      cfg.strategy = parse_strategy(strategy);
      cfg.layers_per_unit = units;
      SCOPED_TRACE(strategy + " units " + std::to_string(units));
      Timeline tl;
      const Measured off = run_strategy(cfg, 2, 1, false, nullptr);
      const Measured on = run_strategy(cfg, 2, 1, true, &tl);
      EXPECT_GT(off.peak.total, 0);
      EXPECT_EQ(on.resting, off.resting);
      EXPECT_EQ(on.peak.total, off.peak.total);
      EXPECT_EQ(on.peak.by_category, off.peak.by_category);
      EXPECT_EQ(on.peak.phase, off.peak.phase);
      EXPECT_EQ(on.where, off.where);
      EXPECT_EQ(on.comm_bytes, off.comm_bytes);
      // And the timeline holds what was measured: its rows end at rest and reach the
      // peak of the last step (the whole run's maximum here: every step is alike).
      EXPECT_EQ(integrate(tl), on.resting);
      EXPECT_EQ(max_total(tl), on.peak.total);
      EXPECT_FALSE(tl.spans().empty());
    }
  }
}

TEST(Timeline, PipelineStageRecordCarriesItsTimeline) {
  const RunConfig cfg = testing::pipeline_config(
      "1f1b", 4, 1, testing::model_of(2, 8, 4, Activation::relu, Loss::mse), 2, 0);
  for (const bool record : {false, true}) {
    CpuBackend be;
    be.tracker().set_recording(record);
    auto comm = make_communicator(CommOptions{"fake", 2, 1}, &be);
    const nlohmann::json r = to_json(run_pipeline(cfg, be, *comm));
    EXPECT_EQ(r.contains("timeline"), record);
    if (!record) continue;
    const nlohmann::json& t = r["timeline"];
    const auto& last = t["memory"].back();
    for (int c = 0; c < kCategoryCount; ++c)
      EXPECT_EQ(last[c + 1], r["resting"][std::string(kCategoryNames[c])]) << kCategoryNames[c];
    bool action = false, step = false, optimizer = false, p2p_bytes = false;
    for (const auto& s : t["spans"]) {
      const std::string name = s["name"];
      action = action || name == "F(m=2)";
      step = step || name == "step";
      optimizer = optimizer || name == "optimizer";
      p2p_bytes = p2p_bytes || (name.rfind("recv ", 0) == 0 && s.value("bytes", 0) == 8 * 4);
    }
    EXPECT_TRUE(action && step && optimizer) << t["spans"].dump();
    EXPECT_TRUE(p2p_bytes) << "a received activation of one row of 8 floats";
    bool microbatch_mark = false;
    for (const auto& m : t["marks"]) microbatch_mark = microbatch_mark || m[2] == "micro-batch 3";
    EXPECT_TRUE(microbatch_mark);
  }
}

}  // namespace
}  // namespace shardscope
