// Result files: the writability check creates nothing, writes are whole, read errors
// name the file.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "harness/records/json_write.hpp"
#include "harness/report/json_io.hpp"
#include "harness/run/provenance.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;

class JsonIo : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "shardscope-json-io-XXXXXX").string();
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::size_t entries() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }
  std::string dir_;
};

std::string usage_error(const std::string& path) {
  try {
    check_writable(path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return {};
}

TEST_F(JsonIo, CheckWritableCreatesNothing) {
  check_writable(dir_ + "/out.json");
  EXPECT_EQ(entries(), 0u);
  EXPECT_EQ(usage_error(dir_ + "/missing/out.json"),
            "--json FILE: cannot write '" + dir_ + "/missing/out.json': directory '" + dir_ + "/missing' does not exist");
  EXPECT_NE(usage_error(dir_).find("it is a directory"), std::string::npos);
  std::ofstream(dir_ + "/file") << "x";
  EXPECT_NE(usage_error(dir_ + "/file/out.json").find("is not a directory"), std::string::npos);
  if (geteuid() != 0) {  // root writes anywhere
    ASSERT_EQ(chmod(dir_.c_str(), 0500), 0);
    EXPECT_NE(usage_error(dir_ + "/out.json").find("Permission denied"), std::string::npos);
    chmod(dir_.c_str(), 0700);
  }
  try {
    check_writable(dir_ + "/missing/x", "--out DIR");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--out DIR: cannot write", 0), 0u);
  }
}

TEST_F(JsonIo, WriteIsWholeAndLeavesNoTemporary) {
  const std::string path = dir_ + "/r.json";
  std::ofstream(path) << "old";
  write_file_atomic(path, "{\"a\": 1}\n");
  EXPECT_EQ(read_json_file(path)["a"], 1);
  EXPECT_EQ(entries(), 1u);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_NE(st.st_mode & 0044, 0u) << "a result file should be readable like any other";
  EXPECT_THROW(write_file_atomic(dir_ + "/missing/r.json", "{}"), RunError);
  EXPECT_EQ(entries(), 1u);
}

TEST_F(JsonIo, AReplacedFileKeepsItsMode) {
  const std::string path = dir_ + "/private.json";
  std::ofstream(path) << "old";
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  write_file_atomic(path, "{}\n");
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "a private file became readable to others";
  ASSERT_EQ(chmod(path.c_str(), 0640), 0);
  write_file_atomic(path, "{}\n");
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  // Data never inherits setuid, setgid or sticky bits.
  ASSERT_EQ(chmod(path.c_str(), 06755), 0);
  write_file_atomic(path, "{}\n");
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
}

// What the rename at the end would not be allowed to replace is refused before any work:
// a file read-only to us, and another user's file in a sticky directory. Checked as
// "nobody" in a child process when the tests run as root (root may replace anything).
TEST_F(JsonIo, AFileWeMayNotReplaceIsRefusedUpFront) {
  const uid_t nobody = 65534;
  const bool as_root = geteuid() == 0;
  ASSERT_EQ(chmod(dir_.c_str(), as_root ? 01777 : 0700), 0);
  const std::string theirs = dir_ + "/theirs.json";
  if (as_root) {  // root's, writable by anyone: only the sticky bit keeps others from replacing it
    std::ofstream(theirs) << "{}";
    ASSERT_EQ(chmod(theirs.c_str(), 0666), 0);
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (as_root && (setgid(nobody) != 0 || setuid(nobody) != 0)) _exit(10);
    const std::string mine = dir_ + "/read-only.json";
    { std::ofstream(mine) << "{}"; }
    if (chmod(mine.c_str(), 0444) != 0) _exit(11);
    int failures = 0;
    if (usage_error(mine).find("it exists and is read-only to us (mode 0444)") == std::string::npos) failures |= 1;
    try {
      write_file_atomic(mine, "{}");
      failures |= 2;
    } catch (const RunError&) {
    }
    if (as_root && usage_error(theirs).find("belongs to another user in a sticky directory") == std::string::npos)
      failures |= 4;
    _exit(failures);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: read-only not refused by the check, 2: nor by the writer, "
                                       "4: another user's file in a sticky directory not refused, "
                                       "10/11: the child could not set itself up";
  chmod(dir_.c_str(), 0700);
}

// A link someone else planted in a sticky, world-writable directory (/tmp) is not
// followed (the kernel's protected_symlinks would not follow it either): root writing
// sticky/link.json never replaces the file the link points to. Our own link is followed.
TEST_F(JsonIo, AnotherUsersLinkInAStickyDirectoryIsNotFollowed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a link to another user";
  const uid_t nobody = 65534;
  const std::string sticky = dir_ + "/sticky", target = dir_ + "/roots.json";
  ASSERT_TRUE(fs::create_directory(sticky));
  ASSERT_EQ(chmod(sticky.c_str(), 01777), 0);
  std::ofstream(target) << "root's";
  fs::create_symlink(target, sticky + "/link.json");
  ASSERT_EQ(lchown((sticky + "/link.json").c_str(), nobody, nobody), 0);
  EXPECT_EQ(usage_error(sticky + "/link.json"),
            "--json FILE: cannot write '" + sticky + "/link.json': it is a symbolic link of another user's (uid 65534) "
            "in a sticky, world-writable directory ('" + sticky + "'), which shardscope does not follow: remove it "
            "or write elsewhere");
  EXPECT_THROW(write_file_atomic(sticky + "/link.json", "{}\n"), RunError);
  std::ifstream in(target);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "root's");
  // Ours, or in a folder that is not sticky: followed.
  fs::create_symlink(target, sticky + "/mine.json");
  write_file_atomic(sticky + "/mine.json", "{}\n");
  EXPECT_TRUE(fs::is_symlink(sticky + "/mine.json"));
  ASSERT_EQ(chmod(sticky.c_str(), 0777), 0);
  EXPECT_EQ(usage_error(sticky + "/link.json"), "");
}

// Root replacing a user's private file leaves it the user's: same owner, group and mode.
TEST_F(JsonIo, RootReplacingAUsersFileKeepsTheUsersAccess) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to write another user's file";
  const uid_t nobody = 65534;
  const std::string path = dir_ + "/theirs.json";
  std::ofstream(path) << "old";
  ASSERT_EQ(chown(path.c_str(), nobody, nobody), 0);
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  write_file_atomic(path, "{}\n");
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, nobody);
  EXPECT_EQ(st.st_gid, nobody);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

// compare and the sweep read result files: anything but a regular file is refused at
// once (a FIFO would block forever, a device never end), and so is nesting no file of
// ours has, which recursive walks of the parsed document could not survive.
TEST_F(JsonIo, OnlyARegularFileOfSaneDepthIsRead) {
  auto read_error = [](const std::string& path) -> std::string {
    try {
      (void)read_json_file(path);
    } catch (const RunError& e) {
      return e.what();
    }
    return "(read)";
  };
  ASSERT_EQ(mkfifo((dir_ + "/fifo").c_str(), 0644), 0);
  EXPECT_EQ(read_error(dir_ + "/fifo"), "cannot read '" + dir_ + "/fifo': it is not a regular file (a device, FIFO or socket)");
  EXPECT_EQ(read_error(dir_), "cannot read '" + dir_ + "': it is a directory");
  EXPECT_NE(read_error("/dev/zero").find("not a regular file"), std::string::npos);
  const std::string deep = dir_ + "/deep.json";
  std::ofstream(deep) << "{\"a\": " << std::string(300, '[') << std::string(300, ']') << "}";
  EXPECT_EQ(read_error(deep), "'" + deep + "' nests arrays and objects 301 deep; shardscope's files nest at most 256");
  // Brackets inside strings are text, not nesting.
  std::ofstream(deep) << "{\"a\": \"" << std::string(300, '[') << "\\\"\"}";
  EXPECT_EQ(read_error(deep), "(read)");
}

TEST(JsonText, ReplacesBytesThatAreNotUtf8) {
  const nlohmann::json j = {{"command", "shardscope run --json 'r\xff.json'"}};
  const std::string text = json_text(j);
  EXPECT_NE(text.find("r\xef\xbf\xbd.json"), std::string::npos) << text;
  EXPECT_EQ(nlohmann::json::parse(text)["command"], "shardscope run --json 'r\xef\xbf\xbd.json'");
  EXPECT_EQ(nlohmann::json::parse(readable_json(j)), nlohmann::json::parse(text));
}

TEST_F(JsonIo, ReadErrorsNameTheFile) {
  const std::string path = dir_ + "/bad.json";
  std::ofstream(path) << "{\"a\": ";
  try {
    read_json_file(path);
    FAIL();
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + path + "' is not valid JSON"), std::string::npos) << e.what();
  }
  try {
    read_json_file(dir_ + "/none.json");
    FAIL();
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read '" + dir_ + "/none.json'"), std::string::npos);
  }
}

TEST(Provenance, HasEveryFieldAndNullsForNoDevice) {
  const nlohmann::json p = to_json(provenance("shardscope run --layers 8", "", "", ""));
  for (const char* key : {"git", "command", "host", "cpu", "gpu", "blas", "mpi", "nccl", "cuda"})
    EXPECT_TRUE(p.contains(key)) << key;
  EXPECT_EQ(p["command"], "shardscope run --layers 8");
  EXPECT_TRUE(p["gpu"].is_null());
  EXPECT_TRUE(p["cuda"].is_null());
  EXPECT_TRUE(p["nccl"].is_null());
  EXPECT_FALSE(p["git"].get<std::string>().empty());
  EXPECT_NE(p["cpu"].get<std::string>().find("core"), std::string::npos) << p["cpu"];
#if defined(SHARDSCOPE_WITH_BLAS)
  EXPECT_NE(p["blas"].get<std::string>().find("OpenBLAS"), std::string::npos) << p["blas"];
#else
  EXPECT_EQ(p["blas"], "none (loops)");
#endif
#if defined(SHARDSCOPE_WITH_MPI)
  EXPECT_TRUE(p["mpi"].is_string());
  EXPECT_EQ(p["mpi"].get<std::string>().find('\n'), std::string::npos);
  EXPECT_EQ(p["mpi"].get<std::string>().find('\0'), std::string::npos);
#else
  EXPECT_TRUE(p["mpi"].is_null());
#endif
  EXPECT_EQ(provenance("x", "NVIDIA H200", "13.0", "2.28.9").gpu, "NVIDIA H200");
}

TEST(Provenance, CommandLineQuoting) {
  const char* argv[] = {"shardscope", "run", "--json", "my results.json", "--split", "4,4", "it's"};
  EXPECT_EQ(join_command_line(7, argv), "shardscope run --json 'my results.json' --split 4,4 'it'\\''s'");
}

}  // namespace
}  // namespace shardscope
