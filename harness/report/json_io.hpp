// Result files on disk (docs/design.md §6): written whole or not at all, read with the file's
// name in every error.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/common/json_text.hpp"  // json_text, which every writer here uses

namespace shardscope {

// Checks, before any work, that `path` can be written: its directory exists, is a
// directory and lets us create a file there (probed with a temporary that is removed
// at once), and `path` is new or a regular file we may replace (a symbolic link counts
// as the file it points to, unless it is another user's in a sticky, world-writable
// directory such as /tmp and not the directory owner's: such a link is refused, as the
// kernel's protected_symlinks would; a directory, device, FIFO or socket is refused, and
// so is a file read-only to us, or another user's in a sticky directory). Creates
// nothing permanent.
// Throws UsageError("<flag>: cannot write '<path>': <reason>"), flag "--json FILE"
// unless the caller names another (the sweep says "--out DIR").
void check_writable(const std::string& path, const std::string& flag = "--json FILE");

// `path` as outputs are compared: absolute, what exists of it resolved (links, "..",
// "."), normal, without a trailing '/'.
std::filesystem::path resolved_path(const std::string& path);

// Checks, creating nothing, that directory `dir` (of `flag`) is one we can write each
// of `files` in (check_writable), or one that can be made: its nearest existing
// ancestor is a directory that takes a new folder (probed with a temporary one, removed
// at once). Returns the folders that would be made (resolved_path), outermost first.
std::vector<std::filesystem::path> check_dir_usable(const std::string& dir, const std::string& flag,
                                                    const std::vector<std::string>& files);

// check_writable(path, flag), unless the file's folder is one of `made`, the folders a
// run will make before writing it (check_dir_usable's answer): probing one that does
// not exist yet would fail, and making it was checked already.
void check_writable_in(const std::string& path, const std::string& flag, const std::vector<std::filesystem::path>& made);

// Refuses (UsageError) two outputs that name one file, which would leave only the last
// one written: `outputs` holds (flag, path) pairs, paths compared after making them
// absolute and resolving what exists of them (links, "..", "."). Empty paths are skipped.
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

// Refuses (UsageError) a folder outputs are written in (`folders`: flag, path) that is,
// or lies inside, the path of an output file (`files`: flag, path): the folder would
// take the file's place, or the file the folder's. Paths compared as above; empty ones
// are skipped.
void check_folders_apart(const std::vector<std::pair<std::string, std::string>>& folders,
                         const std::vector<std::pair<std::string, std::string>>& files);

// Writes `content` to a temporary file in the same directory, fsyncs it and renames
// it over `path` (over the file a symbolic link there points to), so readers see the
// old file or the whole new one. SIGINT, SIGTERM, SIGHUP and SIGQUIT are held off
// meanwhile, so no signal leaves a temporary behind. The new file gets the replaced
// file's mode, owner and group (as far as we may give them: root replacing a user's
// file leaves it the user's), or 0666 minus the umask when there was none. Refuses what check_writable refuses. On failure removes the temporary and
// throws RunError("cannot write '<path>': <reason>").
void write_file_atomic(const std::string& path, const std::string& content);

// Takes each piece of the file's text, in order.
using TextSink = std::function<void(std::string_view)>;

// write_file_atomic with the content given piece by piece: `produce` hands each piece to
// the sink it gets, and only the piece in hand need be in memory. What `produce` throws
// (after the temporary is removed) goes on to the caller; the file is then untouched.
void write_file_atomic_streamed(const std::string& path, const std::function<void(const TextSink&)>& produce);

// A document as people (and diffs) read it: objects and arrays indented two spaces per
// level, except that an array or object holding only scalars (numbers, strings,
// booleans, nulls) goes on one line: a timeline's memory row or span is one line. For
// the rank timelines of a sweep this is about a third of nlohmann's dump(2).
std::string readable_json(const nlohmann::json& j);

// Parses a JSON file. Throws RunError naming the file when it is not a regular file,
// cannot be read or parsed (naming the field too: parse_json_text), or nests deeper than
// any file shardscope writes (256 levels).
nlohmann::json read_json_file(const std::string& path);

}  // namespace shardscope
