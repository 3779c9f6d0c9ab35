// `shardscope run` against inputs an adversarial user tries: values that are missing,
// empty or another flag; numbers with signs, spaces or absurd sizes; output paths that
// are devices, FIFOs, links or the same file twice; ranks started with different flags.
// Each is exit 2 with one line naming the flag, creates nothing, and never hangs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using shardscope::testing::env;
using shardscope::testing::shell;

using shardscope::testing::first_line;

bool has_mpirun() {
#ifndef SHARDSCOPE_WITH_MPI
  return false;
#else
  return shell("command -v mpirun >/dev/null") == 0;
#endif
}

class RunInputs : public shardscope::testing::BinaryTest {
 protected:
  // Runs a small model with `flags` in dir_; returns the exit code, stderr's first line in *line.
  int run(const std::string& flags, std::string* line = nullptr) {
    const std::string err = dir_ + "/err.txt";
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --layers 4 --width 16 --batch 8 " +
                         flags + " > /dev/null 2> '" + err + "'");
    if (line) *line = first_line(err);
    return rc;
  }
};

TEST_F(RunInputs, AMissingEmptyRepeatedOrUnwantedValueIsRefusedNamingTheOption) {
  const struct {
    const char* flags;
    const char* names;
  } cases[] = {{"--json --tf32", "--json: needs a value, got the flag '--tf32'"},
               {"--json --width 3", "--json: needs a value, got the flag '--width'"},
               {"--trace --steps 2", "--trace: needs a value"},
               {"--json ''", "--json: empty value"},
               {"--comm ''", "--comm: empty value"},
               {"--backend=", "--backend: empty value"},
               {"--schedule gpipe --split ''", "--split: empty value"},
               // An option given twice, a value given to the switch, a value missing at the end.
               {"--steps 2 --steps 3", "--steps: given more than once; give it once"},
               {"--steps=2 --steps 3", "--steps: given more than once"},
               {"--tf32 --tf32", "--tf32: given more than once"},
               {"--tf32=abc", "--tf32: takes no value, got 'abc'"},
               {"--tf32=", "--tf32: takes no value"},
               {"--tf32=-1", "--tf32: takes no value"},
               {"--steps", "--steps: needs a value"}};
  for (const auto& c : cases) {
    std::string line;
    EXPECT_EQ(run(c.flags, &line), 2) << c.flags;
    EXPECT_EQ(line.rfind(std::string("shardscope: error: ") + c.names, 0), 0u) << c.flags << ": " << line;
  }
  EXPECT_NE(access((dir_ + "/--tf32").c_str(), F_OK), 0) << "a file named after the flag was written";
}

TEST_F(RunInputs, AModelTheRegistryDoesNotHoldIsRefusedNamingTheOnesItDoes) {
  std::string line;
  EXPECT_EQ(run("--model gpt3", &line), 2);
  EXPECT_EQ(line, "shardscope: error: --model: unknown 'gpt3'; allowed: mlp, gpt2, llama");
  EXPECT_EQ(run("--model mlp --steps 1 --emulate 2:1"), 0);
}

TEST_F(RunInputs, NumbersAreDigitsOnlyAndBounded) {
  const char* bad[] = {"--steps ' 5'", "--steps +5", "--seed ' 1'", "--batch 2147483648",
                       "--emulate 2:99999999999", "--emulate 65537:0", "--emulate +2:1",
                       "--bucket-mb 0x10", "--bucket-mb inf", "--bucket-mb 1e3",
                       "--schedule gpipe --microbatches 10001", "--schedule interleaved-1f1b --chunks 1001",
                       "--schedule gpipe --split 2,2,", "--schedule gpipe --split ,2,2"};
  for (const char* flags : bad) {
    std::string line;
    EXPECT_EQ(run(flags, &line), 2) << flags;
    EXPECT_EQ(line.rfind("shardscope: error: --", 0), 0u) << flags << ": " << line;
  }
}

// A bucket cap below the smallest double is still a number >= 0: a cap below any
// tensor, one bucket per tensor (it was refused as "not a number").
TEST_F(RunInputs, ABucketCapBelowTheSmallestDoubleIsOneBucketPerTensor) {
  const std::string tiny = "0." + std::string(400, '0') + "1";
  ASSERT_EQ(run("--bucket-mb " + tiny + " --json r.json"), 0);
  std::ifstream in(dir_ + "/r.json");
  const nlohmann::json rank = nlohmann::json::parse(in)["runs"][0]["ranks"][0];
  EXPECT_EQ(rank["comm"]["all_reduce"]["calls"], 8);  // 4 layers, 2 tensors each
  std::string line;
  EXPECT_EQ(run("--bucket-mb 1" + std::string(400, '0'), &line), 2);
  EXPECT_NE(line.find("is above the largest allowed, 1000000 MiB"), std::string::npos) << line;
}

TEST_F(RunInputs, CheckpointIsNoneFullEveryKOrAttentionAndNeverAPipelines) {
  std::string line;
  EXPECT_EQ(run("--checkpoint every:0", &line), 2);
  EXPECT_NE(line.find("--checkpoint"), std::string::npos) << line;
  EXPECT_EQ(run("--checkpoint sometimes", &line), 2);
  EXPECT_NE(line.find("allowed: none, full, every:K (K >= 1), attention"), std::string::npos) << line;
  // The MLP has no attention: refused, naming it.
  EXPECT_EQ(run("--checkpoint attention", &line), 2);
  EXPECT_EQ(line, "shardscope: error: --checkpoint attention: the MLP has no attention to recompute; allowed with "
                  "--model gpt2|llama, or give --checkpoint none, full or every:K");
  // A transformer's record says it, and holds its prediction.
  ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --model gpt2 --layers 2 --hidden 16 --heads 2 " +
                  "--vocab 11 --seq 8 --batch 2 --attention math --checkpoint attention --strategy zero3 --units 1 " +
                  "--emulate 2:1 --steps 2 --json a.json > /dev/null 2>&1"),
            0);
  std::ifstream in(dir_ + "/a.json");
  const nlohmann::json run_ = nlohmann::json::parse(in)["runs"][0];
  EXPECT_EQ(run_["model"]["checkpoint"], "attention");
  const nlohmann::json& rank = run_["ranks"][0];
  EXPECT_EQ(rank["peak"]["total"], rank["predicted"]["peak_total"]);
  EXPECT_EQ(rank["resting"], rank["predicted"]["resting"]);
  // A pipeline's stages checkpoint under gpipe, 1f1b and interleaved-1f1b; the zero-bubble
  // split of a checkpointed stage is refused by name.
  EXPECT_EQ(run("--checkpoint full --schedule gpipe --emulate 2:0 --steps 2"), 0);
  EXPECT_EQ(run("--checkpoint full --schedule zb-h1 --emulate 2:0", &line), 2);
  EXPECT_NE(line.find("--checkpoint full and --schedule zb-h1"), std::string::npos) << line;
  EXPECT_EQ(run("--checkpoint every:2 --strategy zero3 --emulate 2:1 --steps 2"), 0);
}

// A plan of every strategy and schedule under --checkpoint plans the data-parallel ones
// (their model line says so) and the pipelines that checkpoint (gpipe, 1f1b), and lists the
// zero-bubble ones as skipped with the reason.
TEST_F(RunInputs, APlanUnderCheckpointPlansPipelinesAndSkipsTheZeroBubbleOnes) {
  const std::string out = dir_ + "/plan.txt";
  ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' plan --layers 4 --width 16 --worlds 2 " +
                  "--checkpoint full --strategies ddp,zero3 --schedules gpipe,1f1b,zb-h1 > '" + out + "' 2>&1"),
            0);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("checkpoint full"), std::string::npos) << text;
  EXPECT_NE(text.find("zero3"), std::string::npos) << text;
  EXPECT_NE(text.find("pipeline, predicted per stage"), std::string::npos) << text;
  EXPECT_NE(text.find("  1f1b "), std::string::npos) << text;
  EXPECT_NE(text.find("--checkpoint full and --schedule zb-h1"), std::string::npos) << text;
}

TEST_F(RunInputs, HugePipelinesAreRefusedAtOnce) {
  // Each of these once built a schedule of billions of actions (memory, minutes).
  const char* huge[] = {"--layers 100000 --batch 10000000 --schedule gpipe --emulate 65536:0",
                        "--layers 100000 --batch 10000000 --schedule gpipe --microbatches 10000 --emulate 1000:0",
                        "--schedule gpipe --microbatches 1000 --emulate 2:0",
                        "--layers 65536 --batch 1 --schedule gpipe --microbatches 1 --emulate 65536:0"};
  for (const char* flags : huge) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string line;
    const std::string err = dir_ + "/err.txt";
    EXPECT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --width 4 " + flags + " > /dev/null 2> '" +
                    err + "'"),
              2)
        << flags;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0) << flags;
    EXPECT_EQ(first_line(err).rfind("shardscope: error: ", 0), 0u) << flags;
  }
}

TEST_F(RunInputs, OutputsMustBeRegularFilesAndDistinct) {
  ASSERT_EQ(mkfifo((dir_ + "/fifo").c_str(), 0644), 0);
  ASSERT_EQ(mknod((dir_ + "/null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0 || geteuid() != 0, true);
  std::string line;
  EXPECT_EQ(run("--json fifo", &line), 2);
  EXPECT_NE(line.find("not a regular file"), std::string::npos) << line;
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  if (geteuid() == 0) {
    EXPECT_EQ(run("--trace null", &line), 2);
    ASSERT_EQ(stat((dir_ + "/null").c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device node was replaced";
  }
  // A symbolic link is written through: the link stays, its file gets the document.
  ASSERT_EQ(symlink("real.json", (dir_ + "/link.json").c_str()), 0);
  { std::ofstream(dir_ + "/real.json") << "{}"; }
  EXPECT_EQ(run("--json link.json"), 0);
  ASSERT_EQ(lstat((dir_ + "/link.json").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_NE(first_line(dir_ + "/real.json").find('{'), std::string::npos);
  std::ifstream real(dir_ + "/real.json");
  const std::string text((std::istreambuf_iterator<char>(real)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("shardscope/1"), std::string::npos);
  // Two outputs, one file.
  EXPECT_EQ(run("--json same.json --trace ./same.json", &line), 2);
  EXPECT_NE(line.find("name the same file"), std::string::npos) << line;
  EXPECT_NE(access((dir_ + "/same.json").c_str(), F_OK), 0);
  // A file named as the --csv folder, or lying inside it: refused before the run, and
  // no folder made (it used to train, make b.json/ and then fail to write b.json).
  EXPECT_EQ(run("--json b.json --csv b.json", &line), 2);
  EXPECT_NE(line.find("--csv DIR: 'b.json' is the file --json FILE writes"), std::string::npos) << line;
  EXPECT_EQ(run("--trace t.json --csv t.json/csv", &line), 2);
  EXPECT_NE(line.find("lies inside 't.json', the file --trace FILE writes"), std::string::npos) << line;
  EXPECT_NE(access((dir_ + "/b.json").c_str(), F_OK), 0);
  EXPECT_NE(access((dir_ + "/t.json").c_str(), F_OK), 0);
}

// A file name is bytes: one that is not UTF-8 still gets its file, and the JSON that
// quotes the command line stays valid (the bad byte becomes U+FFFD there).
TEST_F(RunInputs, AFileNameThatIsNotUtf8StillGivesValidJson) {
  ASSERT_EQ(run("--json ok.json --trace 't\xff.json'"), 0);
  const std::string odd = dir_ + "/t\xff.json";
  ASSERT_EQ(access(odd.c_str(), F_OK), 0);
  std::ifstream trace(odd);
  EXPECT_TRUE(nlohmann::json::accept(trace));
  std::ifstream in(dir_ + "/ok.json");
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_NE(doc["provenance"]["command"].get<std::string>().find("t\xef\xbf\xbd.json"), std::string::npos)
      << doc["provenance"]["command"];
}

// A --json or --trace inside the --csv folder a run is about to make is fine, as in a
// sweep; one in a folder nothing makes is refused before the run.
TEST_F(RunInputs, OutputsMayLieInTheCsvFolderTheRunMakes) {
  ASSERT_EQ(run("--csv made --trace made/t.json --json made/r.json"), 0);
  for (const char* f : {"made/t.json", "made/r.json", "made/data_parallel.csv", "made/pipeline.csv"})
    EXPECT_EQ(access((dir_ + "/" + f).c_str(), F_OK), 0) << f;
  std::string line;
  EXPECT_EQ(run("--csv made2 --json made2/sub/r.json", &line), 2);
  EXPECT_NE(line.find("directory 'made2/sub' does not exist"), std::string::npos) << line;
  EXPECT_NE(access((dir_ + "/made2").c_str(), F_OK), 0);
}

TEST_F(RunInputs, ARefusedRunCreatesNoDirectory) {
  std::string line;
  EXPECT_EQ(run("--schedule gpipe --microbatches 9 --csv newdir/csv", &line), 2);
  EXPECT_NE(line.find("--microbatches 9 exceeds --batch 8"), std::string::npos) << line;
  EXPECT_NE(access((dir_ + "/newdir").c_str(), F_OK), 0) << "newdir was created";
}

TEST_F(RunInputs, RanksStartedWithDifferentFlagsAllExitTwoPromptly) {
  if (!has_mpirun()) GTEST_SKIP() << "no MPI in this build or no mpirun";
  const std::string small = " run --backend cpu --layers 2 --width 16 --batch 4";
  const struct {
    const char* rank1;
    const char* names;
  } cases[] = {{" --strategy zero9", "rank 1: --strategy: unknown 'zero9'"},
               {" --help", "flags differ across ranks"},
               // Valid on their own, refused only on rank 1: caught before any collective.
               {" --schedule gpipe --microbatches 9", "flags differ across ranks"}};
  for (const auto& c : cases) {
    const std::string err = dir_ + "/err.txt";
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = shell("timeout -k 5 60 mpirun --oversubscribe -np 1 '" + bin_ + "'" + small + " : -np 1 '" + bin_ +
                         "'" + small + c.rank1 + " > /dev/null 2> '" + err + "'");
    EXPECT_EQ(rc, 2) << c.rank1;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0) << c.rank1;
    std::ifstream in(err);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(all.find(std::string("shardscope: error: ") + c.names), std::string::npos) << c.rank1 << ": " << all;
  }
}

// An interrupted run says so in one line and exits 128 + the signal; a signal that
// lands while a result file is written waits until the file is whole, so no temporary
// is left and the file parses.
TEST_F(RunInputs, AnInterruptedRunSaysSoAndLeavesNoHalfFile) {
  const std::string cmd = "cd '" + dir_ + "' && exec '" + bin_ +
                          "' run --layers 8 --width 64 --batch 8 --steps 3000 --json big.json > /dev/null 2> err.txt";
  int caught_writing = 0;
  for (int attempt = 0; attempt < 6 && caught_writing == 0; ++attempt) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait for the writer's temporary (.big.json.XXXXXX) to appear, then interrupt.
    bool writing = false;
    for (int i = 0; i < 20000 && !writing; ++i) {
      // (check_writable's probe is an empty temporary of the same name: wait for content.)
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dir_))
        if (e.path().filename().string().rfind(".big.json.", 0) == 0) {
          const auto size = std::filesystem::file_size(e.path(), ec);  // gone meanwhile: an error
          if (!ec && size > 0) writing = true;
        }
      if (!writing) usleep(500);
    }
    kill(pid, SIGINT);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (!writing) continue;
    ++caught_writing;
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 130);
    EXPECT_EQ(first_line(dir_ + "/err.txt"), "shardscope: error: rank 0: interrupted by SIGINT");
    for (const auto& e : std::filesystem::directory_iterator(dir_))
      EXPECT_NE(e.path().filename().string().rfind(".big.json.", 0), 0u) << "a temporary was left: " << e.path();
    std::ifstream in(dir_ + "/big.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\"schema\": \"shardscope/1\""), std::string::npos);
    EXPECT_TRUE(!text.empty() && text.back() == '\n') << "the file is not whole";
  }
  if (caught_writing == 0) GTEST_SKIP() << "the write was never caught in the act on this machine";
}

}  // namespace
