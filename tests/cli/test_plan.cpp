// `shardscope plan`: the closed forms of a sweep's configurations, nothing run. What it
// prints for a configuration is what a run of it measures, to the byte; its refusals
// are exit 2 with one line naming the flag, before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/cli/plan.hpp"
#include "shardscope/check.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
using testing::env;
using testing::first_line;
using testing::shell;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

class Plan : public testing::BinaryTest {
 protected:
  // `shardscope <command> <flags>` in dir_: the exit code; stdout in out_, stderr's first line in line_.
  int shardscope(const std::string& command, const std::string& flags) {
    const int rc = shell("cd '" + dir_ + "' && timeout 120 '" + bin_ + "' " + command + " " + flags + " > out.txt 2> err.txt");
    std::ifstream in(dir_ + "/out.txt");
    out_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    line_ = first_line(dir_ + "/err.txt");
    return rc;
  }
  std::string out_, line_;
};

// Every rank and stage of an emulated sweep measures what plan predicted for it: resting
// and peak totals, communication bytes, and per stage the saved activations.
TEST_F(Plan, EveryRankOfASweepMeasuresWhatThePlanPredicted) {
  const std::string flags =
      "--strategies ddp,zero1,zero2,zero3 --schedules gpipe,1f1b,interleaved-1f1b,zb-h1,zbv --worlds 2,3 "
      "--microbatches 3,6 --chunks 2 --units 1 --layers 6 --width 24 --batch 12 --activation relu --loss mse";
  ASSERT_EQ(shardscope("plan", flags + " --json plan.json"), 0) << line_;
  ASSERT_EQ(shardscope("sweep", flags + " --emulate --steps 2 --out results"), 0) << line_;
  const json plan = read_json(dir_ + "/plan.json");
  const json measured = read_json(dir_ + "/results/shardscope.json");
  EXPECT_EQ(plan["schema"], "shardscope-plan/1");
  ASSERT_EQ(plan["plans"].size(), measured["runs"].size());
  int ranks = 0, skipped = 0;
  for (std::size_t n = 0; n < plan["plans"].size(); ++n) {
    const json& p = plan["plans"][n];
    const json& m = measured["runs"][n];
    SCOPED_TRACE(m.dump().substr(0, 160));
    EXPECT_EQ(p.value("skipped", false), m.value("skipped", false));
    if (p.value("skipped", false)) {  // interleaved-1f1b at S = 2, M = 3; zbv at S = 3, M = 3
      EXPECT_EQ(p["reason"], m["reason"]);
      ++skipped;
      continue;
    }
    const bool pipeline = p["kind"] == "pipeline";
    const json& mr = m[pipeline ? "stages" : "ranks"];
    // A data-parallel plan lists groups of consecutive ranks: every rank in exactly one.
    std::vector<json> pr;
    if (pipeline) {
      for (const json& stage : p["stages"]) pr.push_back(stage);
    } else {
      for (const json& g : p["rank_groups"]) {
        ASSERT_EQ(g["first"].get<std::size_t>(), pr.size());
        for (int r = g["first"]; r <= g["last"].get<int>(); ++r) pr.push_back(g);
      }
    }
    ASSERT_EQ(pr.size(), mr.size());
    for (std::size_t r = 0; r < pr.size(); ++r, ++ranks) {
      EXPECT_EQ(pr[r]["predicted"]["resting_total"], mr[r]["resting"]["total"]) << "rank " << r;
      EXPECT_EQ(pr[r]["predicted"]["peak_total"], mr[r]["peak"]["total"]) << "rank " << r;
      EXPECT_TRUE(pr[r]["fits"].is_null());  // no --memory
      EXPECT_EQ(pr[r]["predicted"]["comm_bytes"], mr[r]["comm_bytes"]) << "rank " << r;
      if (pipeline) {
        EXPECT_EQ(pr[r]["predicted"]["peak_live_bytes"], mr[r]["saved"]["peak_live_bytes"]) << "stage " << r;
        EXPECT_EQ(pr[r]["layers"], mr[r]["layers"]) << "stage " << r;
      } else {
        EXPECT_EQ(pr[r]["predicted"]["peak_where"], mr[r]["peak"]["where"]) << "rank " << r;
        EXPECT_EQ(pr[r]["predicted"]["resting"], mr[r]["predicted"]["resting"]) << "rank " << r;
      }
    }
  }
  // Data parallel: 4 strategies x (2 + 3 ranks). Pipelines: gpipe, 1f1b and zb-h1 at
  // S = 2 and 3, M = 3 and 6; interleaved-1f1b where M is a multiple of S; zbv (its 2
  // chunks by default) where M >= 2S - 1.
  EXPECT_EQ(ranks, 4 * (2 + 3) + 3 * 2 * (2 + 3) + (2 + 3 + 3) + (2 + 2 + 3));
  EXPECT_EQ(skipped, 2);
  // The tables say the same.
  EXPECT_NE(out_.find("skipped (the configuration cannot run)"), std::string::npos);
}

TEST_F(Plan, TheSeedsTablesAndAMemoryVerdict) {
  // The seed's tables were measured with every collective blocking (--overlap off; on,
  // zero3's unit in backward also holds the unit above's full gradient in flight).
  ASSERT_EQ(shardscope("plan", "--memory 8MiB --wide --bytes exact --overlap off"), 0) << line_;
  // ddp at rest: 16P + 4T = 8,421,440 B (the seed's table); its peak is above 8 MiB, zero3's
  // with one unit per layer at W = 4 is not.
  EXPECT_NE(out_.find("ddp       2  -      all    8,421,440  4.000  8,749,120  4.156  backward, layer 7"),
            std::string::npos) << out_;
  EXPECT_NE(out_.find("no, 352.06 KiB over"), std::string::npos) << out_;  // 8,749,120 - 8 MiB
  EXPECT_NE(out_.find("yes, 4.93 MiB spare"), std::string::npos) << out_;
  EXPECT_NE(out_.find("fits in 8.00 MiB"), std::string::npos) << out_;
  // zero3, one layer per unit, W = 4: above its resting bytes the peak holds two gathered
  // units (the one in backward and the prefetched next), that unit's full gradient, seven
  // saved outputs and the batch, dy and dx (the seed's third table, measured: docs/results.md).
  EXPECT_NE(out_.find("param_unsharded 514.00 KiB, grad_unsharded 257.00 KiB, activation 224.00 KiB, temp 96.00 KiB"),
            std::string::npos)
      << out_;
  EXPECT_NE(out_.find("pipeline, predicted per stage: 2 x 32, activation relu, loss mse"), std::string::npos);
  // The verdict per configuration, over the worlds planned.
  EXPECT_NE(out_.find("every rank's peak within 8.00 MiB, among the worlds planned:"), std::string::npos) << out_;
  EXPECT_NE(out_.find("  ddp              none      W=2, W=4"), std::string::npos) << out_;
  EXPECT_NE(out_.find("  zero2 units=all  W=4       W=2"), std::string::npos) << out_;
  EXPECT_NE(out_.find("  zero3 units=1    W=2, W=4  -"), std::string::npos) << out_;
  EXPECT_NE(out_.find("  1f1b M=8         S=2       -"), std::string::npos) << out_;
}

// The plan's strategy column and its verdict name every setting that is not the
// default (engine, precision, checkpointing, accumulation), as the run tables do.
TEST_F(Plan, TheStrategyColumnNamesTheEngineAndTheSettings) {
  ASSERT_EQ(shardscope("plan", "--strategies zero3 --worlds 2 --engine fsdp2 --accumulate 2 --no-sync --memory 8MiB"),
            0)
      << line_;
  EXPECT_NE(out_.find("  zero3 engine=fsdp2 accumulate=2 no_sync  2"), std::string::npos) << out_;
  EXPECT_NE(out_.find("  zero3 units=1 engine=fsdp2 accumulate=2 no_sync  W=2"), std::string::npos) << out_;
  ASSERT_EQ(shardscope("plan", "--strategies zero2 --worlds 2 --checkpoint every:2"), 0) << line_;
  EXPECT_NE(out_.find("  zero2 checkpoint=every:2  2"), std::string::npos) << out_;
}

// By default the plan fits 120 columns: binary units, and what the peak holds above rest
// in a table of its own, a column per category.
TEST_F(Plan, TheDefaultTablesFit120Columns) {
  ASSERT_EQ(shardscope("plan", "--memory 8MiB --overlap off"), 0) << line_;  // the seed's blocking figures
  std::istringstream lines(out_);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 120u) << line;
  EXPECT_NE(out_.find("  ddp       2  -      all     8.03 MiB  4.000  8.34 MiB  4.156  backward, layer 7  no, 352 KiB over"),
            std::string::npos)
      << out_;
  // zero3, one layer per unit, W = 4: two gathered units, a unit's gradient, the saves.
  EXPECT_NE(out_.find("  zero3     4  1      all            514 KiB         257 KiB     224 KiB  96.0 KiB     6.02 MiB"),
            std::string::npos)
      << out_;
  EXPECT_NE(out_.find("Bytes: binary units (1 KiB = 1024 B)"), std::string::npos) << out_;
}

// zero1's ranks differ when the tensors do not split evenly: consecutive ranks with the
// same figures share a row, and an entry of the JSON's rank_groups.
TEST_F(Plan, UnevenZero1RanksAreGrouped) {
  ASSERT_EQ(shardscope("plan", "--strategies zero1 --worlds 3 --layers 2 --width 8 --bytes exact --json p.json"), 0)
      << line_;
  // Two weights (256 B each) to ranks 0 and 1, the two biases to rank 2.
  EXPECT_NE(out_.find("  0-1        1,668  2.896   5,764  10.007  backward, layer 1"), std::string::npos) << out_;
  EXPECT_NE(out_.find("  2          1,288  2.236   5,384   9.347  backward, layer 1"), std::string::npos) << out_;
  const json groups = read_json(dir_ + "/p.json")["plans"][0]["rank_groups"];
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0]["first"], 0);
  EXPECT_EQ(groups[0]["last"], 1);
  EXPECT_EQ(groups[1]["first"], 2);
  EXPECT_EQ(groups[1]["last"], 2);
  EXPECT_EQ(groups[1]["predicted"]["resting"]["optim"], 2 * (8 * 8 + 4));  // two 8-wide biases: 8 B a value, a step each
  // The largest world: still one entry per group.
  ASSERT_EQ(shardscope("plan", "--strategies ddp,zero3 --worlds 65536 --layers 40000 --width 8 --json p.json"), 0)
      << line_;
  for (const json& plan : read_json(dir_ + "/p.json")["plans"]) EXPECT_EQ(plan["rank_groups"].size(), 1u);
}

TEST_F(Plan, RefusalsNameTheFlagAndWriteNothing) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {"--out r", "shardscope: error: --out: not a plan flag: plan writes no results folder; --json FILE writes the plan"},
      {"--emulate", "shardscope: error: --emulate: not a plan flag: plan runs nothing; it predicts every rank of every world"},
      {"--memory 80G", "shardscope: error: --memory: '80G' is ambiguous: write 80GiB (binary) or 80GB (decimal)"},
      {"--memory", "shardscope: error: --memory: needs a value"},
      {"--memory 1GiB --memory 2GiB", "shardscope: error: --memory: given twice; give it once"},
      {"--json a.json --json b.json", "shardscope: error: --json: given twice; give it once"},
      {"--json dir/ --layers 4", "shardscope: error: --json FILE: cannot write 'dir/': it names a directory"},
      {"--layers 0 --json p.json", "shardscope: error: --layers: '0' is not a positive integer"},
      {"--strategies fsdp --json p.json", "shardscope: error: --strategies: 'fsdp' is not a strategy; allowed: ddp, zero1, zero2, zero3, hsdp"},
      {"--bogus --json p.json", "shardscope: error: unknown flag '--bogus' (shardscope plan --help lists the flags)"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(shardscope("plan", c.flags), 2) << c.flags;
    EXPECT_EQ(line_, c.line) << c.flags;
    EXPECT_TRUE(out_.empty()) << c.flags;
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/p.json")) << c.flags;
  }
  EXPECT_EQ(shardscope("plan", "--help"), 0);
  EXPECT_NE(out_.find("usage: shardscope plan"), std::string::npos);
}

TEST(PlanMemory, SizesInEveryUnitAndTheirRefusals) {
  EXPECT_EQ(parse_memory_size("80GiB"), 80LL << 30);
  EXPECT_EQ(parse_memory_size("80 gib"), 80LL << 30);
  EXPECT_EQ(parse_memory_size("141GB"), 141'000'000'000LL);
  EXPECT_EQ(parse_memory_size("0.5KiB"), 512);
  EXPECT_EQ(parse_memory_size("1.5TB"), 1'500'000'000'000LL);
  // Exact to the byte, in integers (a double would round these).
  EXPECT_EQ(parse_memory_size("9007199254740993"), 9'007'199'254'740'993LL);
  EXPECT_EQ(parse_memory_size("123456789012345679"), 123'456'789'012'345'679LL);
  EXPECT_EQ(parse_memory_size("4611686018427387904"), 4'611'686'018'427'387'904LL);
  EXPECT_EQ(parse_memory_size("0.0000001GiB"), 107);
  EXPECT_EQ(parse_memory_size("0.99999999999999999999999KiB"), 1023);
  EXPECT_EQ(parse_memory_size("0.000000000931322574615478515625GiB"), 1);  // 2^-30 GiB, every digit counts
  EXPECT_EQ(parse_memory_size("1.000000000931322574615478515625GiB"), (1LL << 30) + 1);
  EXPECT_THROW(parse_memory_size("4611686018427387905"), UsageError);  // 4 EiB + 1
  EXPECT_THROW(parse_memory_size("99999999999999999999"), UsageError);
  EXPECT_EQ(parse_memory_size("1073741824"), 1LL << 30);
  EXPECT_EQ(parse_memory_size("4096B"), 4096);
  for (const std::string& bad : std::vector<std::string>{"", "GiB", "-1GiB", "1e9", "1.GiB", ".5GiB", "1..5GiB", "1.5", "1.5B", "0", "0.1B",
                          "80G", "80 m", "80 PiB", "9999999999999999999999", "5EiB", "1GiB ",
                          std::string(400, '9'), "0." + std::string(400, '0') + "1KiB"}) {
    std::string what;
    try {
      parse_memory_size(bad);
    } catch (const UsageError& e) {
      what = e.what();
    }
    EXPECT_EQ(what.rfind("--memory: '", 0), 0u) << "'" << bad << "' -> '" << what << "'";
  }
}

}  // namespace
}  // namespace shardscope

namespace shardscope {
namespace {

// --backend cuda plans cuBLAS's workspace (32 MiB, category workspace) on every rank and
// stage, at rest and at the peak; no flag (or cpu) plans none, as a cpu run measures.
TEST_F(Plan, CudaAddsCublasWorkspaceToEveryRankCpuNone) {
  const std::string flags = "--strategies ddp,zero3 --schedules 1f1b --worlds 2 --layers 4 --width 16 --batch 4";
  ASSERT_EQ(shardscope("plan", flags + " --json cpu.json"), 0) << line_;
  ASSERT_EQ(shardscope("plan", flags + " --backend cuda --json cuda.json --memory 32MiB"), 0) << line_;
  const json cpu = read_json(dir_ + "/cpu.json"), cuda = read_json(dir_ + "/cuda.json");
  ASSERT_EQ(cpu["plans"].size(), 3u);
  ASSERT_EQ(cuda["plans"].size(), 3u);
  constexpr std::int64_t kWorkspace = 33'554'432;
  int ranks = 0;
  for (std::size_t n = 0; n < cpu["plans"].size(); ++n) {
    const bool pipeline = cpu["plans"][n]["kind"] == "pipeline";
    const json& a = cpu["plans"][n][pipeline ? "stages" : "rank_groups"];
    const json& b = cuda["plans"][n][pipeline ? "stages" : "rank_groups"];
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t r = 0; r < a.size(); ++r, ++ranks) {
      const json &p = a[r]["predicted"], &q = b[r]["predicted"];
      EXPECT_EQ(p["peak_by_category"]["workspace"], 0);
      EXPECT_EQ(q["peak_by_category"]["workspace"], kWorkspace);
      EXPECT_EQ(q["peak_total"].get<std::int64_t>(), p["peak_total"].get<std::int64_t>() + kWorkspace);
      EXPECT_EQ(q["resting_total"].get<std::int64_t>(), p["resting_total"].get<std::int64_t>() + kWorkspace);
      if (!pipeline) {
        EXPECT_EQ(p["resting"]["workspace"], 0);
        EXPECT_EQ(q["resting"]["workspace"], kWorkspace);
      }
      // Every peak here is under 1 MiB: 32 MiB fits it alone, not beside the workspace.
      EXPECT_EQ(b[r]["fits"], false);
    }
  }
  EXPECT_EQ(ranks, 1 + 1 + 2);  // ddp's and zero3's ranks in one group each; 1f1b's two stages
  // A cpu run measures no workspace, and predicts none.
  ASSERT_EQ(shardscope("run", "--backend cpu --layers 2 --width 8 --batch 4 --steps 2 --emulate 2:0 --json run.json"), 0)
      << line_;
  const json rank = read_json(dir_ + "/run.json")["runs"][0]["ranks"][0];
  EXPECT_EQ(rank["resting"]["workspace"], 0);
  EXPECT_EQ(rank["peak"]["by_category"]["workspace"], 0);
  EXPECT_EQ(rank["predicted"]["resting"]["workspace"], 0);
  EXPECT_EQ(rank["predicted"]["peak_by_category"]["workspace"], 0);
  const json& categories = rank["timeline"]["categories"];
  EXPECT_NE(std::find(categories.begin(), categories.end(), "workspace"), categories.end());
}

}  // namespace
}  // namespace shardscope
