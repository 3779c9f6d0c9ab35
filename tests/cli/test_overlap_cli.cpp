// --overlap on|off through the binary under mpirun at W = 2 (ddp, zero1, zero2 and zero3
// under the torch and fsdp2 engines, --accumulate): the record says it, every
// collective's exposed_ms is within its ms (all of it with overlap off), every rank holds
// its predicted bytes either way, and the trace draws the posted collectives on a
// communication track of their own, beside the ranges; a bad value or a pipeline's
// --overlap is refused (exit 2, one line).
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"
#include "support/trace_check.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

constexpr const char* kModel = " --layers 4 --width 64 --batch 8 --activation relu --loss mse --steps 3 ";

class OverlapCli : public shardscope::testing::BinaryTest {
 protected:
  // The record of `flags` under mpirun -np 2, with its trace in t.json.
  json run_mpi(const std::string& flags) {
    const int rc = shell("cd '" + dir_ + "' && timeout 120 mpirun -np 2 --oversubscribe '" + bin_ +
                         "' run --backend cpu --comm mpi" + kModel + flags +
                         " --json r.json --trace t.json > out.txt 2> err.txt");
    EXPECT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
    std::ifstream in(dir_ + "/r.json");
    return json::parse(in);
  }
  json trace() {
    std::ifstream in(dir_ + "/t.json");
    return json::parse(in);
  }
};

TEST_F(OverlapCli, ExposedWithinTotalAndBytesAsPredictedUnderMpirun) {
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  for (const char* strategy : {"--strategy ddp --bucket-mb 0.01", "--strategy zero1 --bucket-mb 0.01 --ddp-bucket copy",
                               "--strategy zero3 --units 1", "--strategy zero2 --units 1",
                               "--strategy zero3 --units 1 --engine fsdp2", "--strategy zero2 --units 2 --engine fsdp2",
                               "--strategy zero3 --units 1 --accumulate 2"}) {
    for (const char* overlap : {"on", "off"}) {
      const std::string what = std::string(strategy) + " --overlap " + overlap;
      const json doc = run_mpi(std::string(strategy) + " --overlap " + overlap);
      const json& run = doc["runs"][0];
      EXPECT_EQ(run["overlap"], std::string(overlap) == "on") << what;
      ASSERT_EQ(run["ranks"].size(), 2u) << what;
      int posted = 0;
      for (const json& rank : run["ranks"]) {
        EXPECT_EQ(rank["resting"], rank["predicted"]["resting"]) << what;
        EXPECT_EQ(rank["peak"]["total"], rank["predicted"]["peak_total"]) << what;
        EXPECT_EQ(rank["peak"]["by_category"], rank["predicted"]["peak_by_category"]) << what;
        for (const auto& [kind, c] : rank["comm"].items()) {
          const double ms = c["ms"], exposed = c["exposed_ms"];
          EXPECT_GE(exposed, 0.0) << what << " " << kind;
          EXPECT_LE(exposed, ms) << what << " " << kind;
          if (std::string(overlap) == "off") {
            EXPECT_EQ(exposed, ms) << what << " " << kind;
          }
        }
        for (const json& span : rank["timeline"]["spans"])
          if (span.contains("track")) {
            EXPECT_EQ(span["track"], "communication") << what;
            EXPECT_LE(span["start_ms"].get<double>(), span["end_ms"].get<double>()) << what;
            ++posted;
          }
      }
      // ddp and zero1 post every bucket (several: 0.01 MiB against 16 KiB weights), zero2
      // and zero3 every unit's reduce-scatter, zero3 its prefetches too (zero2 keeps every
      // unit gathered from forward: nothing to prefetch), under both engines.
      const bool posts = std::string(overlap) == "on";
      if (posts) {
        EXPECT_GE(posted, 2 * 3) << what;
      } else {
        EXPECT_EQ(posted, 0) << what;
      }

      const json t = trace();
      EXPECT_TRUE(shardscope::testing::trace_problems(t).empty()) << what;
      std::set<std::string> threads;
      int collectives = 0;
      for (const json& e : t["traceEvents"]) {
        if (e["ph"] == "M" && e["name"] == "thread_name") threads.insert(e["args"]["name"].get<std::string>());
        if (e["ph"] == "X" && e.value("cat", "") == "collective") {
          ++collectives;
          EXPECT_NE(e["tid"], e["pid"]) << what << ": a posted collective among the ranges";
        }
      }
      EXPECT_EQ(collectives, posted) << what;
      EXPECT_EQ(threads.count("communication"), posts ? 1u : 0u) << what;
    }
  }
}

TEST_F(OverlapCli, BadValuesAndPipelinesAreRefused) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {"--overlap maybe", "shardscope: error: --overlap: unknown 'maybe'; allowed: on, off"},
      {"--schedule gpipe --overlap on", "shardscope: error: --overlap is only valid with --strategy (data parallel)"},
  };
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + kModel + c.flags +
                         " > out.txt 2> err.txt");
    EXPECT_EQ(rc, 2) << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
}

}  // namespace
