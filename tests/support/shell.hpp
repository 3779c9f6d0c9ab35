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

// A sweep's stderr without its progress lines ("[2/18] zero1 W=2: done"), which are
// appended to `progress` when given: what is left is what the sweep says went wrong.
inline std::string without_progress(const std::string& text, std::string* progress = nullptr) {
  std::string rest;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string line = text.substr(at, end - at);
    const std::size_t slash = line.find('/'), close = line.find("] ");
    const bool is_progress = line.size() > 1 && line[0] == '[' && slash != std::string::npos &&
                             close != std::string::npos && slash < close &&
                             line.find_first_not_of("0123456789/", 1) == close;
    if (!is_progress) rest += line;
    else if (progress) *progress += line;
    at = end;
  }
  return rest;
}

// The smallest address-space limit (ulimit -v, KiB, to within 4 MiB) under which `bin`
// starts at all (`--version` exits 0): its shared libraries' mappings. A CPU build needs
// about 60 MiB; one linked with CUDA, cuBLAS and NCCL about 950 MiB, so a test that runs
// the binary under a limit sets it this far above what it means to test. 0 when it
// does not start even under 16 GiB.
inline long startup_address_space_kib(const std::string& bin) {
  long lo = 4 * 1024, hi = 16L * 1024 * 1024;  // lo fails, hi starts (checked below)
  const auto starts = [&](long kib) {
    return shell("ulimit -v " + std::to_string(kib) + " && '" + bin + "' --version > /dev/null 2>&1") == 0;
  };
  if (!starts(hi)) return 0;
  while (hi - lo > 4 * 1024) {
    const long mid = lo + (hi - lo) / 2;
    (starts(mid) ? hi : lo) = mid;
  }
  return hi;
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
