// The sweep's plan: presets, pass-through flags overriding them, which families run,
// and flag validation (docs/design.md §6). Pure: nothing is launched.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness/cli/sweep_plan.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using Args = std::vector<std::string>;

bool contains_pair(const Args& args, const std::string& name, const std::string& value) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == name && args[i + 1] == value) return true;
  return false;
}

bool contains(const Args& args, const std::string& token) {
  return std::find(args.begin(), args.end(), token) != args.end();
}

std::vector<std::string> labels(const std::vector<SweepJob>& jobs) {
  std::vector<std::string> out;
  for (const SweepJob& j : jobs) out.push_back(j.label);
  return out;
}

// The UsageError message of planning `args` ("" when it plans fine).
std::string usage_error(const Args& args) {
  try {
    plan_sweep(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return {};
}

TEST(SweepPlan, NoArgumentsRunsTheSeedsExperiment) {
  const std::vector<SweepJob> jobs = plan_sweep(Args{});
  ASSERT_EQ(jobs.size(), 18u);  // (ddp, zero1, 2 x zero2, 2 x zero3) x W = 2, 4; 2 schedules x M = 2, 4, 8
  EXPECT_EQ(jobs[0].run_args, (Args{"--strategy", "ddp", "--layers", "8", "--width", "256", "--batch", "32",
                                    "--activation", "none", "--loss", "sum", "--steps", "11"}));
  EXPECT_EQ(jobs[0].world, 2);
  EXPECT_EQ(jobs[0].kind, "data_parallel");
  const std::vector<std::string> l = labels(jobs);
  const std::vector<std::string> first_world = {"ddp W=2", "zero1 W=2", "zero2 W=2 units=all", "zero2 W=2 units=1",
                                                "zero3 W=2 units=all", "zero3 W=2 units=1"};
  EXPECT_EQ(std::vector<std::string>(l.begin(), l.begin() + 6), first_world);
  EXPECT_EQ(jobs[6].world, 4);
  EXPECT_EQ(l[12], "gpipe S=2 M=2");
  EXPECT_EQ(l[17], "1f1b S=2 M=8");
  EXPECT_TRUE(contains_pair(jobs[3].run_args, "--units", "1"));
  EXPECT_EQ(jobs[3].config["layers_per_unit"], 1);
  EXPECT_EQ(jobs[2].config["layers_per_unit"], "all");
  EXPECT_EQ(jobs[17].run_args, (Args{"--schedule", "1f1b", "--microbatches", "8", "--layers", "2", "--width", "32",
                                     "--batch", "8", "--activation", "relu", "--loss", "mse", "--steps", "11"}));
  EXPECT_EQ(jobs[17].config["microbatches"], 8);
  EXPECT_EQ(jobs[17].config["args"], jobs[17].run_args);
}

TEST(SweepPlan, ExplicitFlagsReplaceAPresetsValues) {
  const std::vector<SweepJob> jobs = plan_sweep(Args{"--layers", "4", "--width=64", "--tf32", "--backend", "cpu"});
  ASSERT_EQ(jobs.size(), 18u);
  for (const SweepJob& job : jobs) {
    EXPECT_TRUE(contains_pair(job.run_args, "--layers", "4")) << job.label;
    EXPECT_FALSE(contains_pair(job.run_args, "--layers", "8") || contains_pair(job.run_args, "--layers", "2"));
    EXPECT_TRUE(contains(job.run_args, "--width=64")) << job.label;  // verbatim
    EXPECT_FALSE(contains(job.run_args, "--width")) << job.label;    // the preset's is gone
    EXPECT_TRUE(contains(job.run_args, "--tf32"));
    EXPECT_TRUE(contains_pair(job.run_args, "--backend", "cpu"));
    EXPECT_EQ(std::count(job.run_args.begin(), job.run_args.end(), "--layers"), 1);
  }
  // Unreplaced preset values stay.
  EXPECT_TRUE(contains_pair(jobs[0].run_args, "--batch", "32"));
  EXPECT_TRUE(contains_pair(jobs[17].run_args, "--batch", "8"));
}

TEST(SweepPlan, ExplicitUnitsReplaceTheUnitComparison) {
  const std::vector<SweepJob> jobs = plan_sweep(Args{"--preset", "seed-dp", "--units", "2", "--worlds", "4"});
  ASSERT_EQ(jobs.size(), 4u);
  for (const SweepJob& job : jobs) {
    EXPECT_EQ(job.world, 4);
    EXPECT_EQ(std::count(job.run_args.begin(), job.run_args.end(), "--units"), 1) << job.label;
    if (job.config["strategy"] == "zero2" || job.config["strategy"] == "zero3")
      EXPECT_EQ(job.config["layers_per_unit"], 2) << job.label;
    else  // --units has no effect on ddp and zero1: their label does not claim one
      EXPECT_FALSE(job.config.contains("layers_per_unit")) << job.label;
  }
  EXPECT_EQ(jobs[3].label, "zero3 W=4 units=2");
}

TEST(SweepPlan, StrategiesAloneRunDataParallelWithoutPresetValues) {
  const std::vector<SweepJob> jobs = plan_sweep(Args{"--strategies", "ddp,zero3"});
  EXPECT_EQ(labels(jobs), (std::vector<std::string>{"ddp W=2", "zero3 W=2 units=1", "ddp W=4", "zero3 W=4 units=1"}));
  EXPECT_EQ(jobs[1].run_args, (Args{"--strategy", "zero3"}));
}

TEST(SweepPlan, SchedulesAloneRunPipelineOnly) {
  std::vector<SweepJob> jobs = plan_sweep(Args{"--schedules", "1f1b"});
  EXPECT_EQ(labels(jobs), (std::vector<std::string>{"1f1b S=2", "1f1b S=4"}));
  EXPECT_EQ(jobs[0].run_args, (Args{"--schedule", "1f1b"}));
  jobs = plan_sweep(Args{"--schedules", "zb-h1,interleaved-1f1b", "--microbatches", "4", "--worlds", "2", "--chunks", "2"});
  EXPECT_EQ(labels(jobs), (std::vector<std::string>{"zb-h1 S=2 M=4", "interleaved-1f1b S=2 M=4 chunks=2"}));
  EXPECT_EQ(jobs[0].run_args, (Args{"--schedule", "zb-h1", "--microbatches", "4"}));
  EXPECT_EQ(jobs[1].run_args, (Args{"--schedule", "interleaved-1f1b", "--microbatches", "4", "--chunks", "2"}));
}

// Under --mesh a pipeline job runs the mesh's D·T·S ranks, but its label says its stages
// (the mesh's pp) and the mesh, as a data-parallel job's record label does.
TEST(SweepPlan, AMeshsPipelineJobIsLabelledByItsStages) {
  const std::vector<SweepJob> jobs = plan_sweep(Args{"--schedules", "1f1b", "--microbatches", "4", "--mesh", "dp=2,tp=2,pp=2"});
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].world, 8);
  EXPECT_EQ(jobs[0].label, "1f1b S=2 mesh=dp2,tp2,pp2 M=4");
}

TEST(SweepPlan, PresetsChooseTheirFamilies) {
  EXPECT_EQ(plan_sweep(Args{"--preset", "seed-pp"}).size(), 6u);
  EXPECT_EQ(plan_sweep(Args{"--preset", "seed-dp"}).size(), 12u);
  EXPECT_EQ(plan_sweep(Args{"--preset", "seed-dp", "--preset", "seed-pp"}).size(), 18u);
  // A preset's list replaced by an explicit one.
  const std::vector<SweepJob> jobs = plan_sweep(Args{"--preset", "seed-dp", "--strategies", "zero2"});
  EXPECT_EQ(labels(jobs), (std::vector<std::string>{"zero2 W=2 units=all", "zero2 W=2 units=1",
                                                    "zero2 W=4 units=all", "zero2 W=4 units=1"}));
  EXPECT_TRUE(contains_pair(jobs[0].run_args, "--layers", "8"));
}

TEST(SweepPlan, SweepFlagsAreParsed) {
  const SweepOptions o = parse_sweep_args(Args{"--out", "d", "--emulate", "--mpirun=/opt/mpirun", "--oversubscribe",
                                              "--timeout", "5", "--worlds", "1,3", "--worlds=8", "--seed", "-1"});
  EXPECT_EQ(o.out, "d");
  EXPECT_TRUE(o.emulate);
  EXPECT_EQ(o.mpirun, "/opt/mpirun");
  EXPECT_TRUE(o.oversubscribe);
  EXPECT_EQ(o.timeout_s, 5);
  EXPECT_EQ(o.worlds, (std::vector<int>{1, 3, 8}));
  ASSERT_EQ(o.pass.size(), 1u);
  EXPECT_EQ(o.pass[0].name, "--seed");
  EXPECT_EQ(o.pass[0].tokens, (Args{"--seed", "-1"}));
  EXPECT_TRUE(sweep_wants_help(Args{"--worlds", "2", "--help"}));
  EXPECT_FALSE(sweep_wants_help(Args{"--worlds", "2"}));
  EXPECT_NE(sweep_usage().find("--preset"), std::string::npos);
}

TEST(SweepPlan, BadFlagsAreRefusedNamingTheFlag) {
  EXPECT_EQ(usage_error({"--worlds", "2,x"}), "--worlds: 'x' is not a positive integer");
  EXPECT_EQ(usage_error({"--worlds", "0"}), "--worlds: '0' is not a positive integer");
  EXPECT_EQ(usage_error({"--worlds", "2,,4"}), "--worlds: '2,,4' has an empty item; give a comma-separated list");
  EXPECT_EQ(usage_error({"--worlds"}), "--worlds: needs a value");
  EXPECT_EQ(usage_error({"--strategies", "ddp,fsdp"}),
            "--strategies: 'fsdp' is not a strategy; allowed: ddp, zero1, zero2, zero3, hsdp");
  EXPECT_EQ(usage_error({"--schedules", "pipedream"}),
            "--schedules: 'pipedream' is not a schedule; allowed: gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv");
  EXPECT_EQ(usage_error({"--preset", "seed"}), "--preset: 'seed' is not a preset; allowed: seed-dp, seed-pp");
  EXPECT_EQ(usage_error({"--microbatches", "two"}), "--microbatches: 'two' is not a positive integer");
  EXPECT_EQ(usage_error({"--timeout", "-5"}), "--timeout: '-5' is not a positive integer");
  EXPECT_EQ(usage_error({"--timeout", "1000000000"}), "--timeout: 1000000000 is above the largest allowed, 604800 s (a week)");
  EXPECT_EQ(usage_error({"--schedules", "1f1b", "--microbatches", "1000000000"}),
            "--microbatches: 1000000000 is above the largest allowed, 10000");
  // The sweep's own one-value flags once each; lists and presets add up.
  EXPECT_EQ(usage_error({"--out", "a", "--out", "b"}), "--out: given more than once; give it once");
  EXPECT_EQ(usage_error({"--timeout", "5", "--timeout=6"}), "--timeout: given more than once; give it once");
  EXPECT_EQ(usage_error({"--emulate", "--emulate"}), "--emulate: given more than once; give it once");
  EXPECT_EQ(usage_error({"--strategy", "zero3"}), "--strategy: use --strategies in a sweep");
  EXPECT_EQ(usage_error({"--schedule", "1f1b"}), "--schedule: use --schedules in a sweep");
  EXPECT_NE(usage_error({"--json", "x.json"}).find("--out DIR"), std::string::npos);
  EXPECT_NE(usage_error({"--emulate", "2:0"}).find("--emulate: takes no value"), std::string::npos);
  EXPECT_NE(usage_error({"--oversubscribe=1"}).find("--oversubscribe: takes no value"), std::string::npos);
  EXPECT_EQ(usage_error({"zero3"}), "sweep: unexpected argument 'zero3'; flags are written --name value");
  EXPECT_NE(usage_error({"--preset", "seed-dp", "--microbatches", "4"}).find("--microbatches: applies to pipeline"),
            std::string::npos);
  EXPECT_EQ(usage_error({"--strategies", "ddp", "--layers", "4"}), "");
}

TEST(SweepPlan, ReportAndCsvAreTheSweepsOwn) {
  const SweepOptions o = parse_sweep_args(Args{"--report", "r.html", "--csv=out/csv", "--layers", "4"});
  EXPECT_EQ(o.report, "r.html");
  EXPECT_EQ(o.csv, "out/csv");
  ASSERT_EQ(o.pass.size(), 1u);  // --layers only
  for (const SweepJob& job : plan_sweep(o)) {
    EXPECT_FALSE(contains(job.run_args, "--report")) << job.label;
    EXPECT_FALSE(contains(job.run_args, "--csv")) << job.label;
  }
  EXPECT_EQ(usage_error({"--report"}), "--report: needs a value");
  EXPECT_EQ(usage_error({"--report="}), "--report: needs a file name");
  EXPECT_EQ(usage_error({"--csv="}), "--csv: needs a directory");
  EXPECT_NE(sweep_usage().find("--report FILE.html"), std::string::npos);
  EXPECT_NE(sweep_usage().find("--csv DIR"), std::string::npos);
}

}  // namespace
}  // namespace shardscope

namespace shardscope {
namespace {

// --chunks reaches interleaved-1f1b only, so one sweep compares it with the others.
TEST(SweepPlan, ChunksReachOnlyInterleavedSchedules) {
  const std::vector<SweepJob> jobs =
      plan_sweep(std::vector<std::string>{"--schedules", "1f1b,interleaved-1f1b", "--chunks", "2", "--worlds", "2"});
  ASSERT_EQ(jobs.size(), 2u);
  auto has_chunks = [](const SweepJob& j) {
    for (const std::string& a : j.run_args)
      if (a == "--chunks" || a.rfind("--chunks=", 0) == 0) return true;
    return false;
  };
  EXPECT_FALSE(has_chunks(jobs[0]));
  EXPECT_TRUE(has_chunks(jobs[1]));
  EXPECT_EQ(jobs[1].config["chunks"], 2);
  EXPECT_FALSE(jobs[0].config.contains("chunks"));
}

}  // namespace
}  // namespace shardscope

namespace shardscope {
namespace {

bool has_flag(const SweepJob& job, const std::string& flag) {
  for (const std::string& a : job.run_args)
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  return false;
}

// A mixed sweep: data-parallel flags reach data-parallel jobs only, pipeline flags
// pipeline jobs only (run refuses them elsewhere), so no job is skipped for them.
TEST(SweepPlan, EachFamilysFlagsReachOnlyItsJobs) {
  const std::vector<SweepJob> jobs = plan_sweep(Args{
      "--worlds", "2", "--strategies", "zero2", "--schedules", "zb-h1,interleaved-1f1b", "--chunks", "2", "--split=1,1",
      "--units", "1", "--prefetch", "0", "--ddp-bucket", "copy", "--bucket-mb=1", "--layers", "4"});
  ASSERT_EQ(labels(jobs), (std::vector<std::string>{"zero2 W=2 units=1", "zb-h1 S=2", "interleaved-1f1b S=2 chunks=2"}));
  for (const char* dp : {"--units", "--prefetch", "--ddp-bucket", "--bucket-mb"}) {
    EXPECT_TRUE(has_flag(jobs[0], dp)) << dp;
    EXPECT_FALSE(has_flag(jobs[1], dp)) << dp;
    EXPECT_FALSE(has_flag(jobs[2], dp)) << dp;
  }
  EXPECT_FALSE(has_flag(jobs[0], "--chunks"));
  EXPECT_FALSE(has_flag(jobs[0], "--split"));
  EXPECT_FALSE(has_flag(jobs[1], "--chunks"));  // interleaved-1f1b's only
  EXPECT_TRUE(has_flag(jobs[1], "--split"));
  EXPECT_TRUE(has_flag(jobs[2], "--chunks"));
  EXPECT_TRUE(has_flag(jobs[2], "--split"));
  for (const SweepJob& job : jobs) EXPECT_TRUE(contains_pair(job.run_args, "--layers", "4")) << job.label;
  EXPECT_EQ(jobs[0].config["layers_per_unit"], 1);

  const std::vector<SweepJob> gpipe = plan_sweep(Args{"--strategies", "ddp", "--schedules", "gpipe", "--units", "1"});
  for (const SweepJob& job : gpipe) EXPECT_EQ(has_flag(job, "--units"), job.kind == "data_parallel") << job.label;

  // --accumulate and --no-sync (a bare flag) reach ddp and zero1, not a pipeline (which refuses them).
  const std::vector<SweepJob> acc = plan_sweep(
      Args{"--strategies", "ddp,zero1", "--worlds", "2", "--schedules", "gpipe", "--accumulate", "2", "--no-sync"});
  ASSERT_EQ(acc.size(), 3u);
  for (const SweepJob& job : acc) {
    EXPECT_EQ(contains_pair(job.run_args, "--accumulate", "2"), job.kind == "data_parallel") << job.label;
    EXPECT_EQ(has_flag(job, "--no-sync"), job.kind == "data_parallel") << job.label;
  }
}

// A family's flag that would reach no job is refused, not dropped.
TEST(SweepPlan, AFlagThatReachesNoJobIsRefused) {
  EXPECT_EQ(usage_error({"--schedules", "1f1b", "--units", "1"}),
            "--units: applies to data-parallel runs; add --strategies or --preset seed-dp");
  EXPECT_EQ(usage_error({"--schedules", "1f1b", "--bucket-mb=4"}),
            "--bucket-mb: applies to data-parallel runs; add --strategies or --preset seed-dp");
  EXPECT_EQ(usage_error({"--strategies", "ddp", "--split", "2,2"}),
            "--split: applies to pipeline runs; add --schedules or --preset seed-pp");
  EXPECT_EQ(usage_error({"--schedules", "1f1b,gpipe", "--chunks", "2"}),
            "--chunks: applies to interleaved-1f1b runs only; add interleaved-1f1b to --schedules");
  EXPECT_EQ(usage_error({"--preset", "seed-pp", "--units", "1", "--strategies", "ddp"}), "");
  EXPECT_EQ(usage_error({"--schedules", "1f1b", "--accumulate", "2"}),
            "--accumulate: applies to data-parallel runs; add --strategies or --preset seed-dp");
}

TEST(SweepPlan, WorldSizesAreCappedAndListsHoldEachItemOnce) {
  EXPECT_EQ(usage_error({"--worlds", "65536", "--strategies", "ddp"}), "");
  EXPECT_EQ(usage_error({"--worlds", "65537"}), "--worlds: 65537 is above the largest allowed, 65536 ranks");
  EXPECT_EQ(usage_error({"--worlds", "2,999999999"}),
            "--worlds: 999999999 is above the largest allowed, 65536 ranks");
  EXPECT_EQ(usage_error({"--worlds", "99999999999999999999"}),
            "--worlds: 99999999999999999999 is above the largest allowed, 65536 ranks");
  EXPECT_EQ(usage_error({"--worlds", "2,2"}), "--worlds: 2 is given twice; give each once");
  EXPECT_EQ(usage_error({"--worlds", "4", "--worlds=4"}), "--worlds: 4 is given twice; give each once");
  EXPECT_EQ(usage_error({"--strategies", "ddp,zero1,ddp"}), "--strategies: 'ddp' is given twice; give each once");
  EXPECT_EQ(usage_error({"--schedules", "1f1b,1f1b"}), "--schedules: '1f1b' is given twice; give each once");
  EXPECT_EQ(usage_error({"--schedules", "1f1b", "--microbatches", "2,4,2"}),
            "--microbatches: 2 is given twice; give each once");
}

}  // namespace
}  // namespace shardscope
