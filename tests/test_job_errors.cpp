// Reading a failed sweep job's stderr: the rank mpirun names, the job's own error line.
#include <gtest/gtest.h>

#include "harness/cli/job_errors.hpp"

namespace shardscope {
namespace {

// As Open MPI 4.1.4 writes them (captured on this machine).
const char* kExitCode =
    "shardscope: error: bad config\n"
    "--------------------------------------------------------------------------\n"
    "Primary job  terminated normally, but 1 process returned\n"
    "a non-zero exit code. Per user-direction, the job has been aborted.\n"
    "--------------------------------------------------------------------------\n"
    "--------------------------------------------------------------------------\n"
    "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
    "the job to be terminated. The first process to do so was:\n"
    "\n"
    "  Process name: [[29871,1],1]\n"
    "  Exit code:    3\n"
    "--------------------------------------------------------------------------\n";
const char* kSignal =
    "--------------------------------------------------------------------------\n"
    "mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed).\n"
    "--------------------------------------------------------------------------\n";
const char* kAbort =
    "--------------------------------------------------------------------------\n"
    "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD\n"
    "with errorcode 3.\n"
    "--------------------------------------------------------------------------\n";

TEST(JobErrors, FindsTheRankMpirunNames) {
  EXPECT_EQ(failed_rank(kExitCode), 1);
  EXPECT_EQ(failed_rank(kSignal), 2);
  EXPECT_EQ(failed_rank(kAbort), 3);
  EXPECT_EQ(failed_rank("shardscope: error: rank 5: out of memory\n"), 5);
  EXPECT_EQ(failed_rank("something else\n"), -1);
}

TEST(JobErrors, OneLineMessages) {
  EXPECT_EQ(failure_message(kExitCode, "ddp W=2", -1, "exited with code 3"), "rank 1: bad config (ddp W=2)");
  EXPECT_EQ(failure_message(kSignal, "ddp W=4", -1, "exited with code 137"),
            "rank 2: exited on signal 9 (Killed) (ddp W=4)");
  EXPECT_EQ(failure_message(kAbort, "zero1 W=4", -1, "exited with code 3"), "rank 3: called MPI_Abort (zero1 W=4)");
  EXPECT_EQ(failure_message("shardscope: error: rank 1: out of memory: needs 9 B, has 8 B\n", "zero3 W=2", -1, "x"),
            "rank 1: out of memory: needs 9 B, has 8 B (zero3 W=2)");
  EXPECT_EQ(failure_message("warming up\nSegmentation fault\n", "ddp W=1", -1, "killed by signal 11"),
            "ddp W=1: Segmentation fault");
  EXPECT_EQ(failure_message("", "ddp W=1", -1, "killed by signal 11 (Segmentation fault)"),
            "ddp W=1: killed by signal 11 (Segmentation fault)");
  EXPECT_EQ(failure_message("", "ddp W=2", 1, "exited with code 3"), "rank 1: exited with code 3 (ddp W=2)");
}

// mpirun failing on its own: its first line is the cause, the rest advice.
TEST(JobErrors, ALaunchersOwnFailureQuotesItsFirstLine) {
  const char* slots =
      "--------------------------------------------------------------------------\n"
      "There are not enough slots available in the system to satisfy the 4\n"
      "slots that were requested by the application:\n"
      "\n"
      "  /bin/true\n"
      "\n"
      "launch.\n"
      "--------------------------------------------------------------------------\n";
  EXPECT_EQ(launcher_failure_message(slots, "ddp W=4", "exited with code 1"),
            "ddp W=4: mpirun exited with code 1 (no rank reported an error): \"There are not enough slots available in "
            "the system to satisfy the 4\"");
  EXPECT_EQ(launcher_failure_message("mpirun: Error: unknown option \"--bogus\"\nType 'mpirun --help' for usage.\n",
                                     "zero1 W=2", "exited with code 2"),
            "zero1 W=2: mpirun exited with code 2 (no rank reported an error): \"mpirun: Error: unknown option "
            "\"--bogus\"\"");
  EXPECT_EQ(launcher_failure_message("", "ddp W=2", "killed by signal 9 (Killed)"),
            "ddp W=2: mpirun killed by signal 9 (Killed) (no rank reported an error)");
}

TEST(JobErrors, TheJobsOwnErrorText) {
  EXPECT_EQ(shardscope_error_text("noise\nshardscope: error: --units 1: needs zero2 or zero3\n"),
            "--units 1: needs zero2 or zero3");
  EXPECT_EQ(shardscope_error_text("nothing here\n"), "");
}

}  // namespace
}  // namespace shardscope
