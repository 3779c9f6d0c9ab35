// host_memory_available (the memory a run can have, docs/design.md §6) and format_bytes.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "harness/memory/host_memory.hpp"
#include "shardscope/format.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kGiB = std::int64_t{1} << 30;
constexpr std::int64_t kMiB = std::int64_t{1} << 20;

// MemTotal or MemAvailable of this machine, read here independently of the code under test.
std::int64_t meminfo(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string k, unit;
  long long v = 0;
  while (in >> k >> v >> unit)
    if (k == key + ":") return static_cast<std::int64_t>(v) * 1024;
  return -1;
}

TEST(HostMemory, ThisMachine) {
  const HostMemory hm = host_memory_available();
  EXPECT_GT(hm.available, 0) << hm.how;
  EXPECT_FALSE(hm.how.empty());
  EXPECT_NE(hm.how.find("MemAvailable"), std::string::npos) << hm.how;
  EXPECT_NE(hm.how.find("cgroup"), std::string::npos) << hm.how;
  const std::int64_t total = meminfo("MemTotal");
  ASSERT_GT(total, 0);
  EXPECT_LE(hm.available, total) << hm.how;
  // It is a minimum with MemAvailable (which moves a little between two reads).
  EXPECT_LE(hm.available, meminfo("MemAvailable") + 256 * kMiB) << hm.how;
}

// A fake machine under a temporary root: /proc/meminfo, /proc/self/{cgroup,mountinfo}
// and a cgroup tree.
class FakeRoot {
 public:
  FakeRoot() {
    std::string tmpl = (fs::temp_directory_path() / "shardscope-hostmem-XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = made;
  }
  ~FakeRoot() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  FakeRoot(const FakeRoot&) = delete;
  FakeRoot& operator=(const FakeRoot&) = delete;

  void write(const std::string& rel, const std::string& text) const {
    const fs::path p = fs::path(root_) / rel.substr(1);
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void meminfo_available(std::int64_t bytes) const {
    write("/proc/meminfo", "MemTotal:       32000000 kB\nMemFree:         1000 kB\nMemAvailable:   " +
                               std::to_string(bytes / 1024) + " kB\n");
  }
  const std::string& path() const { return root_; }

 private:
  std::string root_;
};

const char* kMountinfoV2 =
    "24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n";
const char* kMountinfoV1 =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

// What is mapped now (VmSize), read here independently of the code under test.
std::int64_t vm_size() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) * 1024;
  return -1;
}

// Under an address-space limit (ulimit -v) what is left is the limit less what is mapped
// and, with OpenBLAS, less the 128 MiB buffer it maps at its first call: a run that fits
// beside what is mapped but not beside that buffer is refused, where OpenBLAS would
// otherwise retry its allocation forever. Checked in a child: the limit is for good.
TEST(HostMemory, TheAddressSpaceLimitLeavesRoomForOpenBlasBuffer) {
#ifndef SHARDSCOPE_WITH_BLAS
  GTEST_SKIP() << "built without OpenBLAS";
#else
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::int64_t mapped = vm_size();
    const rlimit cap{static_cast<rlim_t>(mapped + 300 * kMiB), static_cast<rlim_t>(mapped + 300 * kMiB)};
    if (mapped <= 0 || setrlimit(RLIMIT_AS, &cap) != 0) _exit(10);
    int failures = 0;
    HostMemory hm = host_memory_available();
    // 300 MiB less the buffer; what the call itself maps (a few pages) may come off too.
    if (hm.available > 172 * kMiB || hm.available < 160 * kMiB) failures |= 1;
    if (hm.how.find(" mapped and 128.00 MiB for OpenBLAS's buffer: ") == std::string::npos) failures |= 2;
    const rlimit tight{static_cast<rlim_t>(mapped + 100 * kMiB), static_cast<rlim_t>(mapped + 300 * kMiB)};
    if (setrlimit(RLIMIT_AS, &tight) != 0) _exit(11);
    if (host_memory_available().available != 0) failures |= 4;
    _exit(failures);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the limit less VmSize less 128 MiB is not what is left, 2: the message does "
                                       "not name the buffer, 4: 100 MiB of room was not 0 for a 128 MiB buffer, "
                                       "10/11: the child could not set its limit";
#endif
}

TEST(HostMemory, CgroupV2LimitBelowMemAvailable) {
  FakeRoot r;
  r.meminfo_available(20 * kGiB);
  r.write("/proc/self/mountinfo", kMountinfoV2);
  r.write("/proc/self/cgroup", "0::/job/rank0\n");
  r.write("/sys/fs/cgroup/memory.stat", "anon 0\n");
  r.write("/sys/fs/cgroup/job/cgroup.procs", "");
  r.write("/sys/fs/cgroup/job/memory.max", std::to_string(8 * kGiB) + "\n");
  r.write("/sys/fs/cgroup/job/memory.current", std::to_string(3 * kGiB) + "\n");
  r.write("/sys/fs/cgroup/job/memory.stat", "anon 1\ninactive_file " + std::to_string(kGiB) + "\n");
  r.write("/sys/fs/cgroup/job/rank0/cgroup.procs", "1\n");
  r.write("/sys/fs/cgroup/job/rank0/memory.max", "max\n");
  r.write("/sys/fs/cgroup/job/rank0/memory.current", std::to_string(kGiB) + "\n");
  const HostMemory hm = host_memory_available_at(r.path());
  // The parent's limit binds: 8 GiB - 3 GiB used + 1 GiB reclaimable cache.
  EXPECT_EQ(hm.available, 6 * kGiB) << hm.how;
  EXPECT_NE(hm.how.find("MemAvailable 20.00 GiB"), std::string::npos) << hm.how;
  EXPECT_NE(hm.how.find("cgroup v2 limit 8.00 GiB"), std::string::npos) << hm.how;
}

TEST(HostMemory, CgroupV2NoLimitUsesMemAvailable) {
  FakeRoot r;
  r.meminfo_available(5 * kGiB);
  r.write("/proc/self/mountinfo", kMountinfoV2);
  r.write("/proc/self/cgroup", "0::/\n");
  r.write("/sys/fs/cgroup/cgroup.procs", "1\n");
  r.write("/sys/fs/cgroup/memory.stat", "anon 0\n");
  const HostMemory hm = host_memory_available_at(r.path());
  EXPECT_EQ(hm.available, 5 * kGiB) << hm.how;
  EXPECT_NE(hm.how.find("cgroup v2 limit none"), std::string::npos) << hm.how;
}

TEST(HostMemory, CgroupV2LimitAboveMemAvailable) {
  FakeRoot r;
  r.meminfo_available(2 * kGiB);
  r.write("/proc/self/mountinfo", kMountinfoV2);
  r.write("/proc/self/cgroup", "0::/ctr\n");
  r.write("/sys/fs/cgroup/ctr/cgroup.procs", "1\n");
  r.write("/sys/fs/cgroup/ctr/memory.max", std::to_string(64 * kGiB) + "\n");
  r.write("/sys/fs/cgroup/ctr/memory.current", std::to_string(kGiB) + "\n");
  const HostMemory hm = host_memory_available_at(r.path());
  EXPECT_EQ(hm.available, 2 * kGiB) << hm.how;
}

// Hybrid layout (as on the build machine): v1 memory controller, empty unified tree.
TEST(HostMemory, CgroupV1Limit) {
  FakeRoot r;
  r.meminfo_available(20 * kGiB);
  r.write("/proc/self/mountinfo", kMountinfoV1);
  r.write("/proc/self/cgroup", "4:memory:/box/abc\n1:cpu:/\n0::/\n");
  r.write("/sys/fs/cgroup/unified/cgroup.procs", "1\n");
  r.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  r.write("/sys/fs/cgroup/memory/memory.usage_in_bytes", std::to_string(10 * kGiB) + "\n");
  r.write("/sys/fs/cgroup/memory/box/abc/cgroup.procs", "1\n");
  r.write("/sys/fs/cgroup/memory/box/abc/memory.limit_in_bytes", std::to_string(4 * kGiB) + "\n");
  r.write("/sys/fs/cgroup/memory/box/abc/memory.usage_in_bytes", std::to_string(kGiB) + "\n");
  r.write("/sys/fs/cgroup/memory/box/abc/memory.stat",
          "inactive_file 1\ntotal_inactive_file " + std::to_string(512 * kMiB) + "\n");
  const HostMemory hm = host_memory_available_at(r.path());
  EXPECT_EQ(hm.available, 3 * kGiB + 512 * kMiB) << hm.how;
  EXPECT_NE(hm.how.find("cgroup v1 limit 4.00 GiB"), std::string::npos) << hm.how;
}

TEST(HostMemory, CgroupV1Unlimited) {
  FakeRoot r;
  r.meminfo_available(7 * kGiB);
  r.write("/proc/self/mountinfo", kMountinfoV1);
  r.write("/proc/self/cgroup", "4:memory:/\n0::/\n");
  r.write("/sys/fs/cgroup/memory/cgroup.procs", "1\n");
  r.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  r.write("/sys/fs/cgroup/memory/memory.usage_in_bytes", "12345\n");
  const HostMemory hm = host_memory_available_at(r.path());
  EXPECT_EQ(hm.available, 7 * kGiB) << hm.how;
  EXPECT_NE(hm.how.find("cgroup v1 limit none"), std::string::npos) << hm.how;
}

TEST(HostMemory, NoCgroupMounted) {
  FakeRoot r;
  r.meminfo_available(kGiB);
  const HostMemory hm = host_memory_available_at(r.path());
  EXPECT_EQ(hm.available, kGiB) << hm.how;
  EXPECT_NE(hm.how.find("no memory cgroup"), std::string::npos) << hm.how;
}

TEST(HostMemory, OverCommittedCgroupLeavesZero) {
  FakeRoot r;
  r.meminfo_available(8 * kGiB);
  r.write("/proc/self/mountinfo", kMountinfoV2);
  r.write("/proc/self/cgroup", "0::/c\n");
  r.write("/sys/fs/cgroup/c/cgroup.procs", "1\n");
  r.write("/sys/fs/cgroup/c/memory.max", std::to_string(kGiB) + "\n");
  r.write("/sys/fs/cgroup/c/memory.current", std::to_string(kGiB + 4096) + "\n");
  EXPECT_EQ(host_memory_available_at(r.path()).available, 0);
}

TEST(FormatBytes, Cases) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(4), "4 B");
  EXPECT_EQ(format_bytes(1023), "1,023 B");
  EXPECT_EQ(format_bytes(1024), "1,024 B (1.00 KiB)");
  EXPECT_EQ(format_bytes(123456), "123,456 B (120.56 KiB)");
  EXPECT_EQ(format_bytes(8421440), "8,421,440 B (8.03 MiB)");
  EXPECT_EQ(format_bytes(10526784), "10,526,784 B (10.04 MiB)");
  EXPECT_EQ(format_bytes(2105348), "2,105,348 B (2.01 MiB)");
  EXPECT_EQ(format_bytes(std::int64_t{1} << 30), "1,073,741,824 B (1.00 GiB)");
  EXPECT_EQ(format_bytes(std::int64_t{3} << 40), "3,298,534,883,328 B (3.00 TiB)");
  EXPECT_EQ(format_bytes(-2048), "-2,048 B (-2.00 KiB)");
  EXPECT_EQ(format_bytes(-5), "-5 B");
  EXPECT_EQ(format_bytes(INT64_MAX), "9,223,372,036,854,775,807 B (8.00 EiB)");
  EXPECT_EQ(format_bytes(INT64_MIN), "-9,223,372,036,854,775,808 B (-8.00 EiB)");
}

TEST(FormatBytes, Short) {
  EXPECT_EQ(format_bytes_short(512), "512 B");
  EXPECT_EQ(format_bytes_short(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes_short(8421440), "8.03 MiB");
}

}  // namespace
}  // namespace shardscope
