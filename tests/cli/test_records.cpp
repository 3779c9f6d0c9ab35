// The typed records (harness/records/): a result file of every kind the binary writes
// reads back into them and writes out byte for byte as it was; the writer gives the
// fields, types and figures the JSON-building code before it gave (golden files under
// tests/reference/records/, written by that code, plus the fields added since, each
// added to them by hand: outside_pool_source, null on cpu; a data-parallel run's engine,
// "torch"; every run's precision, "fp32"); a bad file is refused naming
// the file, the run, the rank and the field.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/records/json_read.hpp"
#include "harness/records/json_write.hpp"
#include "harness/report/json_io.hpp"
#include "shardscope/check.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
using testing::shell;

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Records : public testing::BinaryTest {
 protected:
  // Runs `args` (after "run", or "sweep" when it starts so) in the test's folder.
  void run(const std::string& launcher, const std::string& args) {
    ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 120 " + launcher + " '" + bin_ + "' " + args +
                    " > out.txt 2> err.txt"),
              0)
        << args << "\n"
        << file_text(dir_ + "/err.txt");
  }
  // The file read into the records and written again: the same bytes.
  void expect_round_trip(const std::string& name) {
    const std::string path = dir_ + "/" + name;
    const std::string text = file_text(path);
    ASSERT_FALSE(text.empty()) << name;
    const ResultDocument doc = read_result(read_json_file(path), name);
    ASSERT_FALSE(doc.runs.empty()) << name;
    EXPECT_EQ(readable_json(to_json(doc)) + "\n", text) << name;
  }
};

constexpr const char* kSmall = "--backend cpu --layers 4 --width 16 --batch 8 --steps 3";

TEST_F(Records, EveryKindOfResultWritesBackByteForByte) {
  const std::string s = kSmall;
  struct Case {
    std::string launcher, args, file;
  };
  const std::vector<Case> cases = {
      {"", "run " + s + " --strategy ddp --json ddp.json", "ddp.json"},
      {"", "run " + s + " --strategy ddp --timeline off --ddp-bucket copy --bucket-mb 0.001 --json ddp-copy.json",
       "ddp-copy.json"},
      {"", "run " + s + " --strategy zero1 --emulate 4:1 --json zero1.json", "zero1.json"},
      {"", "run " + s + " --strategy zero2 --emulate 2:0 --json zero2.json", "zero2.json"},
      {"", "run " + s + " --strategy zero3 --units all --prefetch 0 --emulate 4:3 --json zero3.json", "zero3.json"},
      {"", "run --backend cpu --layers 4 --width 16 --batch 8 --steps 1 --strategy zero3 --json untimed.json",
       "untimed.json"},
      {"mpirun -np 2 --oversubscribe", "run " + s + " --strategy zero3 --json zero3-mpi.json", "zero3-mpi.json"},
      {"mpirun -np 2 --oversubscribe", "run " + s + " --schedule 1f1b --microbatches 4 --json 1f1b-mpi.json",
       "1f1b-mpi.json"},
      {"mpirun -np 2 --oversubscribe",
       "run " + s + " --schedule interleaved-1f1b --chunks 2 --microbatches 4 --json interleaved-mpi.json",
       "interleaved-mpi.json"},
      {"", "run " + s + " --schedule gpipe --emulate 2:1 --json gpipe.json", "gpipe.json"},
      {"", "run --backend cpu --layers 4 --width 16 --batch 8 --steps 1 --schedule zb-h1 --timeline off --emulate 2:0"
           " --json zb-h1.json",
       "zb-h1.json"},
      {"", "run " + s + " --schedule gpipe --json gpipe-one-stage.json", "gpipe-one-stage.json"},
      // A sweep's merged file: emulated ranks and stages, a replayed bubble, a skipped
      // configuration (S = 64 micro-batches from a batch of 8), the "sweep" summary.
      {"", "sweep --out sweep --emulate " + s + " --strategies ddp,zero3 --schedules 1f1b --worlds 2,64",
       "sweep/shardscope.json"},
  };
  for (const Case& c : cases) {
    run(c.launcher, c.args);
    expect_round_trip(c.file);
  }
  const ResultDocument sweep = read_result(read_json_file(dir_ + "/sweep/shardscope.json"), "sweep");
  ASSERT_TRUE(sweep.sweep.has_value());
  EXPECT_GT(sweep.sweep->skipped, 0) << "the sweep should hold a skipped configuration";
  bool skipped = false, pipeline = false;
  for (const RunRecord& r : sweep.runs) {
    skipped = skipped || std::holds_alternative<SkippedRun>(r);
    if (const auto* p = std::get_if<PipelineRun>(&r); p && p->world == 2) {
      pipeline = true;
      EXPECT_TRUE(p->replayed_makespan_ms.has_value()) << "the emulated stages' bubble is replayed";
    }
  }
  EXPECT_TRUE(skipped);
  EXPECT_TRUE(pipeline);
}

// Times, losses and the machine differ from run to run: everything else must be what
// the writer before the records wrote (tests/reference/records/, its provenance
// scrubbed of the machine it ran on).
void drop_volatile(json& j) {
  static const std::vector<std::string> keys = {
      "step_ms", "step_ms_all", "comm_ms", "comm_ms_all", "comm_exposed_ms", "comm_exposed_ms_all", "ms",
      "exposed_ms", "busbw_gbps", "busy_ms",
      "actions_end_ms", "bubble_fraction", "bubble_fraction_replayed", "replayed_makespan_ms", "wall_makespan_ms",
      "start_ms", "end_ms", "loss", "provenance"};
  if (j.is_object()) {
    for (const std::string& k : keys)
      if (j.contains(k)) j[k] = "(varies)";
    if (j.contains("memory") && j["memory"].is_array())  // timeline rows: [t_ms, bytes...]
      for (json& row : j["memory"]) row[0] = "(varies)";
    if (j.contains("marks") && j["marks"].is_array())  // [t_ms, phase, place]
      for (json& mark : j["marks"]) mark[0] = "(varies)";
    for (auto& [key, value] : j.items()) drop_volatile(value);
  } else if (j.is_array()) {
    for (json& v : j) drop_volatile(v);
  }
}

TEST_F(Records, TheWriterKeepsTheFieldsAndFiguresOfTheCodeBeforeIt) {
  const std::string reference = testing::env("SHARDSCOPE_REFERENCE_DIR");
  ASSERT_FALSE(reference.empty());
  const std::string s = "--backend cpu --layers 2 --width 8 --batch 4 --steps 2";
  struct Case {
    std::string launcher, args, file;
  };
  const std::vector<Case> cases = {
      {"", "run " + s + " --strategy zero3 --emulate 2:1 --json zero3-emulated.json", "zero3-emulated.json"},
      {"", "run " + s + " --strategy ddp --emulate 2:0 --timeline off --json ddp-emulated.json", "ddp-emulated.json"},
      {"", "run " + s + " --schedule 1f1b --microbatches 2 --emulate 2:1 --json 1f1b-emulated.json",
       "1f1b-emulated.json"},
      {"mpirun -np 2 --oversubscribe",
       "run --backend cpu --layers 4 --width 8 --batch 4 --steps 2 --schedule interleaved-1f1b --chunks 2"
       " --microbatches 2 --timeline off --json interleaved-mpi.json",
       "interleaved-mpi.json"},
  };
  for (const Case& c : cases) {
    run(c.launcher, c.args);
    json now = read_json_file(dir_ + "/" + c.file);
    json before = read_json_file(reference + "/records/" + c.file);
    // Same fields, same types, same figures: compared as text, so 2 and 2.0 differ.
    drop_volatile(now);
    drop_volatile(before);
    EXPECT_EQ(readable_json(now), readable_json(before)) << c.file;
    // The golden file itself reads back and writes out as it is.
    const std::string golden = reference + "/records/" + c.file;
    EXPECT_EQ(readable_json(to_json(read_result(read_json_file(golden), c.file))) + "\n", file_text(golden));
  }
}

// Files written before the workspace category (no "workspace" key, 8 timeline columns)
// still read, their workspace 0, and write back as today's files with workspace 0.
// Files written before workspace (8 categories) and before master and param_cast (9) read
// as the file of today, the categories they predate holding nothing.
TEST_F(Records, FilesFromBeforeTheWorkspaceCategoryRead) {
  const std::string golden = testing::env("SHARDSCOPE_REFERENCE_DIR") + "/records/zero3-emulated.json";
  const json now = read_json_file(golden);
  for (const int keep : {kCategoriesBeforeWorkspace, kCategoriesBeforePrecision}) {
    json before = now;
    int dropped = 0;
    std::function<void(json&)> strip = [&](json& j) {
      if (j.is_object()) {
        if (j.contains("workspace") && j.contains("temp")) {
          for (int c = keep; c < kCategoryCount; ++c) {
            ASSERT_EQ(j[kCategoryNames[c]], 0);
            j.erase(kCategoryNames[c]);
          }
          ++dropped;
        }
        if (j.contains("categories") && j.contains("memory")) {
          ASSERT_EQ(j["categories"].size(), static_cast<std::size_t>(kCategoryCount));
          j["categories"].erase(j["categories"].begin() + keep, j["categories"].end());
          for (json& row : j["memory"]) row.erase(row.begin() + 1 + keep, row.end());
        }
        for (auto& [key, value] : j.items()) strip(value);
      } else if (j.is_array()) {
        for (json& v : j) strip(v);
      }
    };
    strip(before);
    EXPECT_EQ(dropped, 4);  // resting, peak.by_category, predicted.resting and .peak_by_category
    EXPECT_EQ(to_json(read_result(before, "before.json")), to_json(read_result(now, "now.json"))) << keep;
  }
}

// The plan (no times, nothing measured) is written byte for byte as the JSON-building
// code before the records wrote it: tests/reference/records/plan.json, a skipped
// configuration and --memory's verdicts among its plans.
TEST_F(Records, ThePlanIsWrittenAsBefore) {
  run("", "plan --layers 4 --width 64 --strategies ddp,zero1,zero3 --schedules 1f1b,interleaved-1f1b --chunks 2"
          " --worlds 2,3,4 --memory 250KiB --json plan.json");
  const std::string golden = file_text(testing::env("SHARDSCOPE_REFERENCE_DIR") + "/records/plan.json");
  ASSERT_NE(golden.find("\"skipped\": true"), std::string::npos);
  ASSERT_NE(golden.find("\"fits\": false"), std::string::npos);
  EXPECT_EQ(file_text(dir_ + "/plan.json"), golden);
}

// A field of the wrong type is refused where the file is read, with the file, the run,
// the rank or stage and the field's path, and what was expected.
TEST_F(Records, ABadFileIsRefusedNamingTheFileRunRankAndField) {
  run("", "run --backend cpu --layers 2 --width 8 --batch 4 --steps 2 --strategy zero2 --emulate 2:1 --json dp.json");
  run("", "run --backend cpu --layers 2 --width 8 --batch 4 --steps 2 --schedule gpipe --emulate 2:0 --json pp.json");
  const json dp = read_json_file(dir_ + "/dp.json"), pp = read_json_file(dir_ + "/pp.json");
  auto refusal = [](const json& doc, const std::string& name) -> std::string {
    try {
      (void)read_result(doc, name);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(read)";
  };
  ASSERT_EQ(refusal(dp, "dp.json"), "(read)");
  ASSERT_EQ(refusal(pp, "pp.json"), "(read)");
  const std::string dp_at = "'dp.json': runs[0] (zero2 W=2 units=1): ";
  const std::string pp_at = "'pp.json': runs[0] (gpipe S=2 M=2 chunks=1): ";

  json bad = dp;
  bad["runs"][0]["ranks"][0]["peak"]["total"] = "x";
  EXPECT_EQ(refusal(bad, "dp.json"), dp_at + "ranks[0].peak.total is \"x\", not a byte count");
  bad = dp;
  bad["runs"][0]["ranks"][0]["resting"]["param"] = json::parse("1180591620717411303424");  // 2^70
  EXPECT_EQ(refusal(bad, "dp.json"),
            dp_at + "ranks[0].resting.param is 1.1805916207174113e+21, not a byte count (beyond 2^63 - 1)");
  bad = dp;
  bad["runs"][0]["ranks"][0]["comm"]["all_gather"]["bytes"] = -4;
  EXPECT_EQ(refusal(bad, "dp.json"), dp_at + "ranks[0].comm.all_gather.bytes is -4, not a byte count (negative)");
  bad = dp;
  bad["runs"][0]["ranks"][0]["predicted"].erase("peak_total");
  EXPECT_EQ(refusal(bad, "dp.json"), dp_at + "ranks[0].predicted.peak_total is missing; expected a byte count");
  bad = dp;
  bad["runs"][0]["ranks"][0]["step_ms"]["median"] = -1.0;
  EXPECT_EQ(refusal(bad, "dp.json"),
            dp_at + "ranks[0].step_ms.median is -1.0, not a time in ms (a number >= 0) or null");
  bad = dp;
  bad["runs"][0]["ranks"][0]["timeline"]["memory"][1] = json::array({0.5, 1});
  EXPECT_EQ(refusal(bad, "dp.json"),
            dp_at + "ranks[0].timeline.memory[1] is [0.5,1], not a row [t_ms, bytes of each of the 11 categories]");
  bad = dp;
  bad["runs"][0]["layers_per_unit"] = 0;
  EXPECT_EQ(refusal(bad, "dp.json"), "'dp.json': runs[0] (zero2 W=2 units=0): layers_per_unit is 0, not a positive "
                                     "integer or \"all\"");
  bad = dp;
  bad["runs"][0].erase("kind");
  EXPECT_EQ(refusal(bad, "dp.json"), "'dp.json': runs[0]: kind is missing; expected \"data_parallel\" or \"pipeline\"");

  bad = pp;
  bad["runs"][0]["stages"][0]["action_ms"][2]["microbatch"] = "one";
  EXPECT_EQ(refusal(bad, "pp.json"), pp_at + "stages[0].action_ms[2].microbatch is \"one\", not a count");
  bad = pp;
  bad["runs"][0]["stages"][0]["saved"]["peak_live_bytes"] = 1.5;
  EXPECT_EQ(refusal(bad, "pp.json"), pp_at + "stages[0].saved.peak_live_bytes is 1.5, not a byte count (not an integer)");
  bad = pp;
  bad["runs"][0]["stages"].push_back(bad["runs"][0]["stages"][0]);
  EXPECT_EQ(refusal(bad, "pp.json"), pp_at + "stages[1].stage is 0, not a stage number no other record has");
  bad = pp;
  bad["schema"] = "shardscope/0";
  EXPECT_EQ(refusal(bad, "pp.json"), "'pp.json' is not a shardscope/1 result (no \"schema\": \"shardscope/1\")");
}

}  // namespace
}  // namespace shardscope
