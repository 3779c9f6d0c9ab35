#include "harness/report/json_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string_view>
#include <vector>

#include "harness/common/signals_held.hpp"
#include "harness/report/json_parse.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

// The directory part of `path` ("." when there is none; "/" for "/x").
std::string directory_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Whether `inner` is `outer` or lies below it (both resolved).
bool is_within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

// Deeper than any file shardscope writes (about 8 levels) by far, and shallow enough
// that recursive walks of a parsed document (comparison, printing) cannot exhaust the
// stack on a hostile one.
constexpr std::size_t kMaxJsonDepth = 256;

// How deep arrays and objects nest in JSON text, strings skipped (a linear scan; the
// parser checks everything else).
std::size_t nesting_depth(const std::string& text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// Creates "<dir>/.<name>.XXXXXX" and returns its descriptor (-1 and errno on failure).
int make_temp_beside(const std::string& path, std::string* temp_path) {
  std::string templ = directory_of(path) + "/." + base_name_of(path) + ".XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  const int fd = mkstemp(buf.data());
  if (fd >= 0) *temp_path = buf.data();
  return fd;
}

// Writes all of `data`; false with errno set on failure.
bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// The file that writing `path` replaces: `path`, or what a symbolic link there points
// to (the link stays a link). Empty, with `reason` set, when that is not a regular file
// or a new one: a device such as /dev/null, a FIFO, a socket or a directory would be
// replaced by the rename, so they are refused.
std::string write_target(const std::string& path, std::string* reason) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return path;  // a new file
  std::string target = path;
  if (S_ISLNK(st.st_mode)) {
    // In a sticky, world-writable directory (/tmp) anyone may plant a link where we are
    // told to write: follow it only when its owner is us or the directory's owner, as the
    // kernel's protected_symlinks does for open(). We resolve the link ourselves and
    // rename onto its target, which the kernel's check never sees.
    struct stat dir {};
    const uid_t me = ::geteuid();
    if (st.st_uid != me && ::stat(directory_of(path).c_str(), &dir) == 0 && (dir.st_mode & S_ISVTX) != 0 &&
        (dir.st_mode & S_IWOTH) != 0 && st.st_uid != dir.st_uid) {
      *reason = "it is a symbolic link of another user's (uid " + std::to_string(st.st_uid) +
                ") in a sticky, world-writable directory ('" + directory_of(path) +
                "'), which shardscope does not follow: remove it or write elsewhere";
      return {};
    }
    char* real = ::realpath(path.c_str(), nullptr);
    if (real == nullptr) {
      *reason = "it is a symbolic link to a missing file";
      return {};
    }
    target = real;
    std::free(real);
    if (::stat(target.c_str(), &st) != 0) return target;
  }
  if (S_ISDIR(st.st_mode)) {
    *reason = "it is a directory";
    return {};
  }
  if (!S_ISREG(st.st_mode)) {
    *reason = "it exists and is not a regular file (a device, FIFO or socket); shardscope writes regular files";
    return {};
  }
  // The rename would replace a file we may not write: refuse, as `>` in a shell would.
  if (::faccessat(AT_FDCWD, target.c_str(), W_OK, AT_EACCESS) != 0 && errno == EACCES) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    *reason = std::string("it exists and is read-only to us (mode ") + mode + "): make it writable or remove it";
    return {};
  }
  // In a sticky directory (/tmp) only the file's or the directory's owner may replace
  // it, which the rename at the end would find out after the run.
  struct stat dir {};
  const uid_t me = ::geteuid();
  if (me != 0 && st.st_uid != me && ::stat(directory_of(target).c_str(), &dir) == 0 &&
      (dir.st_mode & S_ISVTX) != 0 && dir.st_uid != me) {
    *reason = "it belongs to another user in a sticky directory ('" + directory_of(target) +
              "'), where only its owner may replace it";
    return {};
  }
  return target;
}

// Gives the new file at `fd` the replaced file's owner, group and permissions (never its
// setuid, setgid or sticky bits: this is data), or 0666 minus the umask when there was
// none: root replacing a user's 0600 file leaves it the user's. An owner we may not give
// (we are not root) is kept as it is, and then the group too when we may not give it.
bool take_over_access(int fd, const std::string& target) {
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    struct stat mine {};
    if (::fstat(fd, &mine) == 0 && (mine.st_uid != st.st_uid || mine.st_gid != st.st_gid) &&
        ::fchown(fd, st.st_uid, st.st_gid) != 0)
      (void)::fchown(fd, static_cast<uid_t>(-1), st.st_gid);
    return ::fchmod(fd, st.st_mode & 0777) == 0;
  }
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return ::fchmod(fd, 0666 & ~mask) == 0;
}

bool flat(const nlohmann::json& j) {
  for (const auto& v : j)
    if (v.is_structured()) return false;
  return true;
}

void append_readable(const nlohmann::json& j, int indent, std::string& out) {
  if (!j.is_structured() || j.empty()) {
    out += json_text(j);
    return;
  }
  const bool object = j.is_object();
  out += object ? '{' : '[';
  const bool one_line = flat(j);
  const std::string pad(static_cast<std::size_t>(indent + 2), ' ');
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) out += ',';
    first = false;
    if (one_line) {
      if (it != j.begin()) out += ' ';
    } else {
      out += '\n';
      out += pad;
    }
    if (object) {
      out += json_text(nlohmann::json(it.key()));
      out += ": ";
    }
    append_readable(*it, indent + 2, out);
  }
  if (!one_line) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent), ' ');
  }
  out += object ? '}' : ']';
}

}  // namespace

std::string readable_json(const nlohmann::json& j) {
  std::string out;
  append_readable(j, 0, out);
  return out;
}

void check_writable(const std::string& path, const std::string& flag) {
  auto fail = [&](const std::string& reason) {
    throw UsageError(flag + ": cannot write '" + path + "': " + reason);
  };
  if (path.empty()) fail("the name is empty");
  if (path.back() == '/') fail("it names a directory");
  std::string reason;
  const std::string target = write_target(path, &reason);
  if (target.empty()) fail(reason);
  const std::string dir = directory_of(target);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) fail("directory '" + dir + "' does not exist");
    fail("directory '" + dir + "': " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) fail("'" + dir + "' is not a directory");
  // access() answers for the real uid and ignores read-only mounts: probe instead.
  std::string probe;
  const int fd = make_temp_beside(target, &probe);
  if (fd < 0) fail(std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

std::filesystem::path resolved_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::path(path);
  p = p.lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();  // "dir/" -> "dir"
  return p;
}

std::vector<std::filesystem::path> check_dir_usable(const std::string& dir, const std::string& flag,
                                                    const std::vector<std::string>& files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) throw UsageError(flag + ": '" + dir + "' exists and is not a directory");
    for (const std::string& file : files) check_writable((fs::path(dir) / file).string(), flag);
    return {};
  }
  std::vector<fs::path> made;
  fs::path up = resolved_path(dir);
  while (up.has_relative_path() && !fs::exists(up, ec)) {
    made.insert(made.begin(), up);
    up = up.parent_path();
  }
  auto fail = [&](const std::string& why) { throw UsageError(flag + ": cannot create '" + dir + "': " + why); };
  if (!fs::is_directory(up, ec)) fail("'" + up.string() + "' is not a directory");
  std::string probe = (up / ".shardscope-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr) fail(std::string(std::strerror(errno)) + " in '" + up.string() + "'");
  ::rmdir(probe.c_str());
  return made;
}

void check_writable_in(const std::string& path, const std::string& flag, const std::vector<std::filesystem::path>& made) {
  const bool folder_made = std::find(made.begin(), made.end(), resolved_path(path).parent_path()) != made.end();
  if (!folder_made || path.empty() || path.back() == '/') check_writable(path, flag);
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  std::vector<std::pair<std::string, std::filesystem::path>> seen;  // flag, resolved path
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    const std::filesystem::path resolved = resolved_path(path);
    for (const auto& [other, other_path] : seen)
      if (other_path == resolved)
        throw UsageError(other + " and " + flag + " name the same file '" + path + "': give each its own");
    seen.emplace_back(flag, resolved);
  }
}

void check_folders_apart(const std::vector<std::pair<std::string, std::string>>& folders,
                         const std::vector<std::pair<std::string, std::string>>& files) {
  for (const auto& [dir_flag, dir] : folders) {
    if (dir.empty()) continue;
    const std::filesystem::path folder = resolved_path(dir);
    for (const auto& [file_flag, file] : files) {
      if (file.empty()) continue;
      const std::filesystem::path target = resolved_path(file);
      if (!is_within(folder, target)) continue;
      throw UsageError(dir_flag + ": '" + dir + "' " +
                       (folder == target ? "is the file " : "lies inside '" + file + "', the file ") + file_flag +
                       " writes: give each its own");
    }
  }
}

void write_file_atomic(const std::string& where, const std::string& content) {
  write_file_atomic_streamed(where, [&](const TextSink& sink) { sink(content); });
}

void write_file_atomic_streamed(const std::string& where, const std::function<void(const TextSink&)>& produce) {
  std::string reason;
  const std::string path = write_target(where, &reason);
  if (path.empty()) throw RunError("cannot write '" + where + "': " + reason);
  const SignalsHeld held;
  std::string temp;
  const int fd = make_temp_beside(path, &temp);
  if (fd < 0) throw RunError("cannot write '" + path + "': " + std::strerror(errno));
  bool fd_open = true;  // until the close below
  auto fail = [&](const char* step) {
    const int err = errno;
    if (fd_open) ::close(fd);
    ::unlink(temp.c_str());
    throw RunError("cannot write '" + path + "': " + step + ": " + std::strerror(err));
  };
  // mkstemp makes the file 0600 and ours; a result file belongs to, and reads like, the
  // one it replaces, or reads like any new file.
  if (!take_over_access(fd, path)) fail("chmod");
  try {
    produce([&](std::string_view piece) {
      if (!write_all(fd, piece.data(), piece.size()))
        throw RunError("cannot write '" + path + "': write: " + std::strerror(errno));
    });
  } catch (...) {  // a failed write, or what the producer threw: no temporary is left
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  if (::fsync(fd) != 0) fail("fsync");
  fd_open = false;
  if (::close(fd) != 0) fail("close");
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("rename");
  // Make the rename itself durable; failing here loses nothing already visible.
  const int dir_fd = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

nlohmann::json read_json_file(const std::string& path) {
  // Only a regular file: a FIFO would block the read forever, a device never end. Opened
  // without blocking and then checked, so that nothing swapped in meanwhile can block.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw RunError("cannot read '" + path + "': " + std::strerror(errno));
  struct stat st {};
  std::string refusal;
  if (::fstat(fd, &st) != 0) refusal = std::strerror(errno);
  else if (S_ISDIR(st.st_mode)) refusal = "it is a directory";
  else if (!S_ISREG(st.st_mode)) refusal = "it is not a regular file (a device, FIFO or socket)";
  std::string doc;
  char buf[1 << 16];
  while (refusal.empty()) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) doc.append(buf, static_cast<std::size_t>(n));
    else if (n == 0) break;
    else if (errno != EINTR) refusal = std::string("read failed: ") + std::strerror(errno);
  }
  ::close(fd);
  if (!refusal.empty()) throw RunError("cannot read '" + path + "': " + refusal);
  const std::size_t depth = nesting_depth(doc);
  if (depth > kMaxJsonDepth)
    throw RunError("'" + path + "' nests arrays and objects " + std::to_string(depth) + " deep; shardscope's files nest at most " +
                   std::to_string(kMaxJsonDepth));
  return parse_json_text(doc, path);
}

}  // namespace shardscope
