// The trace printer (harness/report/trace.hpp) on real in-process runs: a run writes a
// valid Chrome trace (required fields, monotonic counters, nested slices, a named process
// per rank), the emulated ranks of a job merged as the sweep merges them give one process
// per rank, and the slices name step, forward, backward, layers, units, each collective
// with its bytes, the optimizer and the pipeline actions. Also: the sweep consumes
// --trace, and the readable JSON printer keeps documents intact.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/cli/run_outputs.hpp"
#include "harness/cli/sweep_plan.hpp"
#include "harness/cli/timeline_spill.hpp"
#include "harness/cli/sweep_results.hpp"
#include "harness/comm/mpi_env.hpp"
#include "harness/records/json_read.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/trace.hpp"
#include "harness/run/run.hpp"
#include "shardscope/category.hpp"
#include "shardscope/check.hpp"
#include "support/pipeline_configs.hpp"
#include "support/trace_check.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
using testing::trace_problems;
using testing::trace_processes;
using testing::trace_slice_names;

RunConfig small_dp(const std::string& strategy, int layers_per_unit) {
  RunConfig cfg;
  cfg.model.layers = 4;
  cfg.model.width = 16;
  cfg.model.batch = 4;
  cfg.strategy = parse_strategy(strategy);
  cfg.layers_per_unit = layers_per_unit;
  cfg.steps = 2;
  return cfg;
}

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/shardscope-trace-XXXXXX";
    const char* d = mkdtemp(tmpl);
    ASSERT_NE(d, nullptr);
    dir_ = d;
    int argc = 1;
    static char name[] = "test_trace";
    static char* args[] = {name, nullptr};
    char** argv = args;
    mpi_ = std::make_unique<MpiSession>(&argc, &argv);
  }
  void TearDown() override {
    mpi_.reset();
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  // One emulated rank of a small model, as `shardscope run` runs it.
  json run_rank(RunConfig cfg, int world, int rank, const std::string& tag) {
    cfg.emulate_world = world;
    cfg.emulate_rank = rank;
    cfg.backend = "cpu";
    cfg.json_path = dir_ + "/" + tag + ".json";
    cfg.trace_path = dir_ + "/" + tag + ".trace.json";
    cfg.command_line = "shardscope run " + tag;
    run_and_write(cfg, *mpi_, std::cout);
    return read_json_file(cfg.json_path);
  }

  // The two emulated ranks of a zero3 run (W = 2, one layer per unit; their documents
  // left in `docs`) merged as the sweep merges them, with a sweep's record of a
  // configuration that could not run inserted at `skipped_at`.
  std::vector<json> zero3_runs_and_a_skipped_one(std::vector<json>& docs, std::size_t skipped_at) {
    for (int r = 0; r < 2; ++r) docs.push_back(run_rank(small_dp("zero3", 1), 2, r, "rank" + std::to_string(r)));
    std::vector<json> runs = merge_emulated_ranks(docs);
    SweepJob skipped;
    skipped.kind = "data_parallel";
    skipped.config = {{"kind", "data_parallel"}, {"strategy", "zero1"}, {"world", 64}};
    runs.insert(runs.begin() + static_cast<std::ptrdiff_t>(skipped_at), skipped_record(skipped, "too few tensors"));
    return runs;
  }

  std::string dir_;
  std::unique_ptr<MpiSession> mpi_;
};

bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

TEST_F(TraceTest, RunJobWritesAValidTraceOfItsRank) {
  const json doc = run_rank(small_dp("zero3", 1), 2, 1, "one");
  const json trace = read_json_file(dir_ + "/one.trace.json");
  const std::vector<std::string> problems = trace_problems(trace);
  EXPECT_TRUE(problems.empty()) << problems.front();
  const auto procs = trace_processes(trace);
  ASSERT_EQ(procs.size(), 1u);
  EXPECT_EQ(procs.begin()->first, 100001) << "pid = (run index 0 + 1) * 100000 + rank 1";
  EXPECT_EQ(procs.begin()->second, "zero3 W=2 units=1 rank 1 (emulated)");
  // The trace is rendered from the document's timeline: one counter per memory row.
  const json& timeline = doc["runs"][0]["ranks"][0]["timeline"];
  std::size_t counters = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "C" && e["name"] == "memory") {
      ++counters;
      EXPECT_EQ(e["args"].size(), static_cast<std::size_t>(kCategoryCount));
    }
  EXPECT_EQ(counters, timeline["memory"].size());
  // The peak marker is the record's peak, inside the last step (each step resets the
  // peak; the warm-up reaches the same bytes first).
  const json& rank = doc["runs"][0]["ranks"][0];
  double last_step_ms = -1.0;
  for (const auto& s : timeline["spans"])
    if (s["name"] == "step") last_step_ms = std::max(last_step_ms, s["start_ms"].get<double>());
  ASSERT_GT(last_step_ms, 0.0);
  int markers = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "i") {
      ++markers;
      EXPECT_EQ(e["args"]["bytes"], rank["peak"]["total"]);
      EXPECT_GE(e["ts"].get<double>(), last_step_ms * 1000.0 - 1e-3);
    }
  EXPECT_EQ(markers, 1);
}

TEST_F(TraceTest, EmulatedRanksMergedAsTheSweepDoesGiveOneProcessPerRank) {
  // A skipped configuration (no ranks) before it: the run's index, not its position
  // among completed runs, makes the pid.
  std::vector<json> docs;
  const std::vector<json> runs = zero3_runs_and_a_skipped_one(docs, 0);
  const json doc = sweep_document(runs, docs[0]["provenance"], "shardscope sweep --trace t.json", true, 2, "");
  const json trace = trace_document(read_result(doc, "shardscope.json"));
  const std::vector<std::string> problems = trace_problems(trace);
  EXPECT_TRUE(problems.empty()) << problems.front();
  const auto procs = trace_processes(trace);
  ASSERT_EQ(procs.size(), 2u);
  EXPECT_EQ(procs.at(200000), "zero3 W=2 units=1 rank 0 (emulated)");
  EXPECT_EQ(procs.at(200001), "zero3 W=2 units=1 rank 1 (emulated)");
  EXPECT_EQ(trace["otherData"]["command"], "shardscope sweep --trace t.json");

  const std::vector<std::string> names = trace_slice_names(trace, 200001);
  for (const char* want : {"setup", "step", "forward", "backward", "unit 0", "unit 3", "forward layer 2",
                           "backward layer 1", "optimizer"})
    EXPECT_TRUE(has(names, want)) << want;
  // Each collective is a slice named with its payload, which its args carry.
  // zero3 with one layer per unit of 16 x 16 + 16 = 272 parameters: an all-gather of
  // 272 floats padded to a multiple of 2 -> 1088 B, a reduce-scatter of the same.
  int gathers = 0, scatters = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["pid"] != 200001) continue;
    const std::string name = e["name"];
    if (name.rfind("all_gather ", 0) == 0 || name.rfind("reduce_scatter ", 0) == 0) {
      EXPECT_EQ(name.substr(name.find(' ') + 1), std::to_string(e["args"]["bytes"].get<std::int64_t>()) + " B");
      EXPECT_EQ(e["args"]["bytes"], 1088);
      (name[0] == 'a' ? gathers : scatters) += 1;
    }
  }
  EXPECT_EQ(gathers, 2 * (4 + 4)) << "two steps, every unit gathered in forward and again in backward";
  EXPECT_EQ(scatters, 2 * 4);
  // The peak marker sits at the rank's highest memory row.
  bool peak = false;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "i" && e["pid"] == 200001) peak = e["args"]["bytes"] == doc["runs"][1]["ranks"][1]["peak"]["total"];
  EXPECT_TRUE(peak) << "2 steps alike: the run's highest row is the last step's peak";
}

TEST_F(TraceTest, PipelineTraceShowsTheActions) {
  const RunConfig cfg = testing::pipeline_config(
      "1f1b", 4, 1, testing::model_of(2, 8, 4, Activation::relu, Loss::mse), 2, 0);
  run_rank(cfg, 2, 0, "pipe");
  const json trace = read_json_file(dir_ + "/pipe.trace.json");
  const std::vector<std::string> problems = trace_problems(trace);
  EXPECT_TRUE(problems.empty()) << problems.front();
  EXPECT_EQ(trace_processes(trace).at(100000), "1f1b S=2 M=4 stage 0 (emulated)");
  const std::vector<std::string> names = trace_slice_names(trace, 100000);
  for (const char* want : {"step", "F(m=0)", "F(m=3)", "B(m=2)", "forward layer 0", "backward layer 0", "p2p",
                           "optimizer"})
    EXPECT_TRUE(has(names, want)) << want;
}

TEST_F(TraceTest, TimelineOffWritesNoTimelineAndRunsWithoutItAddNothing) {
  RunConfig cfg = small_dp("ddp", 0);
  cfg.timeline = false;
  cfg.emulate_world = 2;
  cfg.emulate_rank = 0;
  cfg.json_path = dir_ + "/off.json";
  run_and_write(cfg, *mpi_, std::cout);
  const json doc = read_json_file(cfg.json_path);
  EXPECT_FALSE(doc["runs"][0]["ranks"][0].contains("timeline"));
  const json trace = trace_document(read_result(doc, "off.json"));
  EXPECT_TRUE(trace["traceEvents"].empty());
  EXPECT_TRUE(trace_problems(trace).empty());
}

// The sweep keeps its ranks' timelines on disk (TimelineSpill) and writes its results
// and trace one record at a time: the same bytes as the whole document's, without ever
// holding more than one record's timeline.
TEST_F(TraceTest, TheSweepWritesResultsAndTraceOneRecordAtATime) {
  std::vector<json> docs;
  std::vector<json> runs = zero3_runs_and_a_skipped_one(docs, 1);
  const json pipe = run_rank(
      testing::pipeline_config("1f1b", 2, 1, testing::model_of(2, 8, 4, Activation::relu, Loss::mse), 2, 0), 2, 1, "stage1");
  for (const json& run : runs_of_document(pipe, "stage1")) runs.push_back(run);
  const json doc = sweep_document(runs, docs[0]["provenance"], "shardscope sweep", true, 3, "");
  const std::string results = readable_json(doc) + "\n",
                    trace = json_text(trace_document(read_result(doc, "shardscope.json"))) + "\n";

  json light = doc;
  TimelineSpill spill(dir_ + "/timelines");
  spill.take(light);
  EXPECT_EQ(light.dump().find("\"timeline\""), std::string::npos) << "a timeline was left in memory";
  EXPECT_GT(spill.bytes(), 0);
  int restored = 0;
  const auto whole_record = [&](const json& record) {
    ++restored;
    return spill.restore(record);
  };
  std::string text;
  std::size_t largest = 0;
  const TextSink sink = [&](std::string_view piece) {
    text += piece;
    largest = std::max(largest, piece.size());
  };
  write_results_text(light, whole_record, sink);
  EXPECT_EQ(text, results);
  EXPECT_EQ(restored, 3) << "two ranks and a stage, each once";
  EXPECT_LT(largest, results.size() / 2) << "written in one piece, not a record at a time";
  text.clear();
  // The trace reads the records without their timelines, and each timeline from disk.
  const ResultDocument records = read_result(light, "shardscope.json");
  int timelines = 0;
  const TimelineSource from_disk = spill.timelines_of(light);
  write_trace_text(records, [&](std::size_t run, std::size_t member) {
    ++timelines;
    return from_disk(run, member);
  }, sink);
  EXPECT_EQ(text, trace);
  EXPECT_EQ(timelines, 3) << "two ranks and a stage, each once";
  text.clear();
  write_results_text(doc, [](const json& record) { return record; }, sink);  // nothing spilled: as it is
  EXPECT_EQ(text, results);
  EXPECT_EQ(spill.restore_run(light["runs"][0]), doc["runs"][0]);
  // No runs, or runs without records, are written as readable_json writes them.
  for (const json& other : {sweep_document({}, docs[0]["provenance"], "shardscope sweep", true, 0, ""),
                            json{{"runs", {{{"kind", "pipeline"}, {"stages", json::array()}}}}}}) {
    text.clear();
    write_results_text(other, [](const json& record) { return record; }, sink);
    EXPECT_EQ(text, readable_json(other) + "\n");
  }
}

DataParallelRun dp_run(const std::string& strategy, int world, std::optional<int> layers_per_unit) {
  DataParallelRun run;
  run.strategy = strategy;
  run.world = world;
  run.layers_per_unit = layers_per_unit;
  run.prefetch = 1;
  run.ddp_bucket = "view";
  return run;
}

RankRecord rank_record(int rank) {
  RankRecord r;
  r.rank = rank;
  return r;
}

TEST(Trace, ProcessNamesSayRunAndRank) {
  EXPECT_EQ(trace_process_name(dp_run("zero3", 4, 1), rank_record(2)), "zero3 W=4 units=1 rank 2");
  DataParallelRun zero2 = dp_run("zero2", 2, std::nullopt);
  zero2.prefetch = 0;
  EXPECT_EQ(trace_process_name(zero2, rank_record(0)), "zero2 W=2 units=all prefetch=0 rank 0");
  DataParallelRun ddp = dp_run("ddp", 2, std::nullopt);
  ddp.ddp_bucket = "copy";
  EXPECT_EQ(trace_process_name(ddp, rank_record(1)), "ddp W=2 bucket=copy rank 1");
  PipelineRun pp;
  pp.schedule = "interleaved-1f1b";
  pp.world = 2;
  pp.microbatches = 4;
  pp.chunks = 2;
  StageRecord stage;
  stage.stage = 1;
  stage.rank = 1;
  EXPECT_EQ(trace_process_name(pp, stage), "interleaved-1f1b S=2 M=4 chunks=2 stage 1");
  pp.place.emulated = true;
  EXPECT_EQ(trace_process_name(pp, stage), "interleaved-1f1b S=2 M=4 chunks=2 stage 1 (emulated)");
}

TEST(Trace, SweepConsumesTraceAndRefusesItWithoutTheTimeline) {
  const SweepOptions o = parse_sweep_args({"--strategies", "ddp", "--trace", "t.json", "--layers", "2"});
  EXPECT_EQ(o.trace, "t.json");
  for (const PassFlag& f : o.pass) EXPECT_NE(f.name, "--trace") << "passed on to run";
  for (const SweepJob& job : plan_sweep(o))
    EXPECT_EQ(std::find(job.run_args.begin(), job.run_args.end(), "--trace"), job.run_args.end());
  EXPECT_EQ(parse_sweep_args({"--trace=u.json"}).trace, "u.json");
  EXPECT_THROW(parse_sweep_args({"--trace"}), UsageError);
  EXPECT_THROW(parse_sweep_args({"--trace", "t.json", "--timeline", "off"}), UsageError);
  EXPECT_NO_THROW(parse_sweep_args({"--timeline", "off"}));
}

// A rank record with the smallest timeline the trace renders: one memory row.
RankRecord tiny_rank(int rank) {
  RankRecord record = rank_record(rank);
  record.timeline.emplace();
  TimelineRow row;
  row.bytes[0] = 8;
  record.timeline->memory.push_back(row);
  return record;
}

ResultDocument document_of(std::vector<RunRecord> runs) {
  ResultDocument doc;
  doc.runs = std::move(runs);
  return doc;
}

// pid -> how many process_name events name it, and every pid in range.
std::map<std::int64_t, int> process_name_counts(const json& trace) {
  std::map<std::int64_t, int> counts;
  for (const auto& e : trace["traceEvents"]) {
    const std::int64_t pid = e["pid"];
    EXPECT_GT(pid, 0) << "Perfetto reads pid 0 as the idle process";
    EXPECT_LT(pid, std::int64_t{1} << 31) << "pids are read as 32-bit";
    if (e["ph"] == "M" && e["name"] == "process_name") ++counts[pid];
  }
  return counts;
}

// Worlds go to 65,536: a run of 1,001 ranks next to another run shares no pid with it.
TEST(Trace, EveryRankOfEveryRunHasItsOwnPid) {
  DataParallelRun big = dp_run("ddp", 1001, std::nullopt);
  for (int r = 0; r < 1001; ++r) big.ranks.push_back(tiny_rank(r));
  DataParallelRun one = dp_run("ddp", 1, std::nullopt);
  one.ranks.push_back(tiny_rank(0));
  const json trace = trace_document(document_of({big, one}));
  EXPECT_TRUE(trace_problems(trace).empty());
  const std::map<std::int64_t, int> counts = process_name_counts(trace);
  EXPECT_EQ(counts.size(), 1002u);
  for (const auto& [pid, n] : counts) EXPECT_EQ(n, 1) << "pid " << pid << " named " << n << " times";
  const auto procs = trace_processes(trace);
  EXPECT_EQ(procs.at(100000 + 1000), "ddp W=1001 rank 1000");
  EXPECT_EQ(procs.at(200000), "ddp W=1 rank 0");
}

// Records the formula cannot place (a repeated rank, a negative one, one past the stride;
// a file with them is refused when read, records built in memory are not) and runs past
// what fits below 2^31 still get pids of their own.
TEST(Trace, PidsStayDistinctAndInRangeForOddDocuments) {
  DataParallelRun odd = dp_run("ddp", 2, std::nullopt);
  for (int rank : {0, 0, -2, 200000, 100000, -1, 1}) odd.ranks.push_back(tiny_rank(rank));
  std::vector<RunRecord> runs = {odd};
  DataParallelRun one = dp_run("ddp", 1, std::nullopt);
  one.ranks.push_back(tiny_rank(65535));
  for (int i = 0; i < 21500; ++i) runs.push_back(one);
  const json trace = trace_document(document_of(std::move(runs)));
  const std::map<std::int64_t, int> counts = process_name_counts(trace);
  EXPECT_EQ(counts.size(), 7u + 21500u);
  for (const auto& [pid, n] : counts) EXPECT_EQ(n, 1) << "pid " << pid << " named " << n << " times";
  const auto procs = trace_processes(trace);
  EXPECT_EQ(procs.at(100000), "ddp W=2 rank 0") << "the first rank 0 keeps the formula's pid";
  EXPECT_EQ(procs.at(100001), "ddp W=2 rank 1") << "a spare pid never takes a later rank's";
  EXPECT_EQ(procs.at(1), "ddp W=2 rank 0") << "the repeated rank 0 gets the lowest free pid";
  EXPECT_EQ(procs.at(21473 * std::int64_t{100000} + 65535), "ddp W=1 rank 65535");  // the last run that fits
  // Listed in the document's order.
  std::vector<std::int64_t> sorted_pids;
  for (const auto& e : trace["traceEvents"])
    if (e["name"] == "process_sort_index") {
      EXPECT_EQ(e["args"]["sort_index"], sorted_pids.size());
      sorted_pids.push_back(e["pid"]);
    }
  EXPECT_EQ(sorted_pids.size(), counts.size());
}

// The checker the trace tests rely on catches what Perfetto would trip on.
TEST(Trace, CheckerFlagsBrokenTraces) {
  const json name = {{"name", "process_name"}, {"ph", "M"}, {"ts", 0}, {"pid", 1}, {"tid", 1}, {"args", {{"name", "p"}}}};
  auto x = [](double ts, double dur) {
    return json{{"name", "s"}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"pid", 1}, {"tid", 1}};
  };
  auto c = [](double ts) {
    return json{{"name", "memory"}, {"ph", "C"}, {"ts", ts}, {"pid", 1}, {"tid", 1}, {"args", {{"param", 1}}}};
  };
  auto trace = [](json events) { return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}; };
  EXPECT_TRUE(trace_problems(trace({name, x(1, 5), x(2, 1), c(1), c(2)})).empty());
  EXPECT_FALSE(trace_problems(trace({name, x(1, 5), x(2, 10)})).empty()) << "a child sticks out";
  EXPECT_FALSE(trace_problems(trace({name, x(1, -1)})).empty()) << "negative dur";
  EXPECT_FALSE(trace_problems(trace({name, c(2), c(1)})).empty()) << "a counter goes back";
  EXPECT_FALSE(trace_problems(trace({x(1, 1)})).empty()) << "no process_name";
  json b = x(1, 0);
  b["ph"] = "B";
  b.erase("dur");
  EXPECT_FALSE(trace_problems(trace({name, b})).empty()) << "B without E";
  json no_ts = x(1, 1);
  no_ts.erase("ts");
  EXPECT_FALSE(trace_problems(trace({name, no_ts})).empty()) << "no ts";
  EXPECT_FALSE(trace_problems(json{{"traceEvents", json::array()}}).empty()) << "no displayTimeUnit";
}

TEST(ReadableJson, KeepsTheDocumentAndPutsFlatArraysOnOneLine) {
  const json doc = {{"schema", "shardscope/1"},
                    {"runs", json::array({{{"memory", {{0.0, 1, 2}, {0.5, 3, 4}}}, {"empty", json::array()},
                                           {"span", {{"name", "a \"b\""}, {"start_ms", 1.25}}}, {"null", nullptr}}})}};
  const std::string text = readable_json(doc);
  EXPECT_EQ(json::parse(text), doc);
  EXPECT_NE(text.find("[0.0, 1, 2]"), std::string::npos) << text;
  EXPECT_NE(text.find("{\"name\": \"a \\\"b\\\"\", \"start_ms\": 1.25}"), std::string::npos) << text;
  EXPECT_NE(text.find("\"empty\": []"), std::string::npos) << text;
  EXPECT_EQ(readable_json(json(3)), "3");
}

}  // namespace
}  // namespace shardscope
