// Small helpers for tests that drive the real binary through a shell.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace shardscope::testing {

// The environment variable `name`, or "" when unset.
inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Runs `cmd` with /bin/sh; its exit code, or -1 when it did not exit normally.
inline int shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The first line of a file ("" when it cannot be read).
inline std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A test that drives the shardscope binary (SHARDSCOPE_BIN, which ctest sets; skipped
// without it) in a fresh folder of its own under /tmp, removed with its contents after.
class BinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = env("SHARDSCOPE_BIN");
    if (bin_.empty()) GTEST_SKIP() << "run through ctest (SHARDSCOPE_BIN unset)";
    char tmpl[] = "/tmp/shardscope-test-XXXXXX";
    dir_ = mkdtemp(tmpl) ? tmpl : "";
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    if (!dir_.empty()) shell("rm -rf '" + dir_ + "'");
  }
  std::string bin_, dir_;
};

}  // namespace shardscope::testing
