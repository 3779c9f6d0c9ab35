// A run under an address-space limit (ulimit -v) that leaves room for the model but not
// for the 128 MiB buffer OpenBLAS maps at its first call: refused with exit 3 and the
// figures, where OpenBLAS would retry its allocation forever at 100 % CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "support/shell.hpp"

namespace shardscope {
namespace {

class AddressSpace : public testing::BinaryTest {
 protected:
  // `shardscope run ARGS` under `ulimit -v kib`, stopped after 60 s (exit 124).
  // `env` goes before the binary: "env -u OPENBLAS_NUM_THREADS" runs it as a user would.
  int run_limited(std::int64_t kib, const std::string& args, const std::string& env = "") {
    return testing::shell("cd '" + dir_ + "' && ulimit -v " + std::to_string(kib) + " && timeout 60 " + env + " '" +
                          bin_ + "' run " + args + " > out.txt 2> err.txt");
  }
  std::string err() const {
    std::ifstream in(dir_ + "/err.txt");
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
};

// "49.61 MiB" (format_bytes_short) in bytes, rounded up to the next KiB.
std::int64_t short_bytes(const std::string& number, const std::string& unit) {
  const double scale = unit == "GiB" ? 1 << 30 : unit == "MiB" ? 1 << 20 : unit == "KiB" ? 1 << 10 : 1;
  return static_cast<std::int64_t>(std::stod(number) * scale) + 1024;
}

TEST_F(AddressSpace, NoRoomForOpenBlasBufferIsRefusedNotSpun) {
#ifndef SHARDSCOPE_WITH_BLAS
  GTEST_SKIP() << "built without OpenBLAS";
#else
  const std::string args = "--width 1024";
  // A limit nothing fits in (64 MiB above what the binary needs to start: its libraries
  // map about 60 MiB on a CPU build, about 950 MiB with CUDA): the refusal names what is
  // mapped and the predicted peak.
  const long startup = testing::startup_address_space_kib(bin_);
  ASSERT_GT(startup, 0) << "the binary does not start even under 16 GiB";
  ASSERT_EQ(run_limited(startup + 64 * 1024, args), 3) << err();
  std::smatch m;
  const std::string first = err();
  ASSERT_TRUE(std::regex_search(first, m, std::regex(R"(predicted peak ([0-9,]+) B)"))) << first;
  const std::int64_t peak = std::stoll(std::regex_replace(m[1].str(), std::regex(","), ""));
  ASSERT_TRUE(std::regex_search(first, m, std::regex(R"(with ([0-9.]+) (B|KiB|MiB|GiB) mapped and 128.00 MiB for OpenBLAS's buffer)")))
      << first;
  const std::int64_t mapped = short_bytes(m[1].str(), m[2].str());
  ASSERT_GT(peak, 0);
  // Room for what is mapped and the model, 64 MiB short of the buffer: refused at once.
  EXPECT_EQ(run_limited((mapped + peak + (64 << 20)) / 1024, args), 3) << err();
  EXPECT_NE(err().find("exceeds the memory this process can have"), std::string::npos) << err();
  EXPECT_NE(err().find("for OpenBLAS's buffer"), std::string::npos) << err();
  // Room for the buffer too, and some to spare: it runs.
  EXPECT_EQ(run_limited((mapped + peak + (256 << 20)) / 1024, args), 0) << err();
  // Without OPENBLAS_NUM_THREADS=1 OpenBLAS would start a thread per core, each mapping a
  // buffer of its own whenever it got to it, racing the check: the run takes one thread
  // and the same figures hold, every time.
  for (int trial = 0; trial < 4; ++trial) {
    EXPECT_EQ(run_limited((mapped + peak + (64 << 20)) / 1024, args, "env -u OPENBLAS_NUM_THREADS"), 3)
        << "trial " << trial << ": " << err();
    EXPECT_NE(err().find("for OpenBLAS's buffer"), std::string::npos) << err();
  }
  EXPECT_EQ(run_limited((mapped + peak + (256 << 20)) / 1024, args, "env -u OPENBLAS_NUM_THREADS"), 0) << err();
#endif
}

}  // namespace
}  // namespace shardscope
