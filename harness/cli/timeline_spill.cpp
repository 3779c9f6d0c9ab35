#include "harness/cli/timeline_spill.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "harness/records/json_read.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/json_parse.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// The rank (data parallel) or stage (pipeline) records of a run, or nullptr.
json* records_of(json& run) {
  if (!run.is_object()) return nullptr;
  const auto it = run.find(run.contains("stages") ? "stages" : "ranks");
  return it != run.end() && it->is_array() ? &*it : nullptr;
}

}  // namespace

TimelineSpill::TimelineSpill(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd_ < 0) throw RunError("cannot create '" + path_ + "': " + std::strerror(errno));
}

TimelineSpill::~TimelineSpill() { ::close(fd_); }

void TimelineSpill::take(json& doc) {
  if (!doc.is_object() || !doc.contains("runs") || !doc["runs"].is_array()) return;
  for (json& run : doc["runs"]) {
    json* records = records_of(run);
    if (!records) continue;
    for (json& record : *records) {
      if (!record.is_object() || !record.contains("timeline")) continue;
      const std::string text = json_text(record["timeline"]);
      for (std::size_t done = 0; done < text.size();) {
        const ssize_t n = ::pwrite(fd_, text.data() + done, text.size() - done, end_ + static_cast<off_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw RunError("cannot write '" + path_ + "': " + std::strerror(n < 0 ? errno : ENOSPC));
        done += static_cast<std::size_t>(n);
      }
      pieces_.emplace_back(end_, static_cast<std::int64_t>(text.size()));
      end_ += static_cast<std::int64_t>(text.size());
      record.erase("timeline");
      record[kField] = pieces_.size() - 1;
    }
  }
}

json TimelineSpill::restore(const json& record) const {
  json whole = record;
  const auto it = whole.is_object() ? whole.find(kField) : whole.end();
  if (it == whole.end()) return whole;
  const auto& [offset, size] = pieces_.at(it->get<std::size_t>());
  std::string text(static_cast<std::size_t>(size), '\0');
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::pread(fd_, text.data() + done, text.size() - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw RunError("cannot read '" + path_ + "': " + std::strerror(n < 0 ? errno : EIO));
    done += static_cast<std::size_t>(n);
  }
  whole.erase(it);
  whole["timeline"] = parse_json_text(text, path_);
  return whole;
}

TimelineSource TimelineSpill::timelines_of(const json& doc) const {
  return [this, &doc](std::size_t run, std::size_t member) -> std::optional<TimelineRecord> {
    const json& r = doc.at("runs").at(run);
    const json& record = r.at(r.contains("stages") ? "stages" : "ranks").at(member);
    const json whole = restore(record);
    const auto it = whole.find("timeline");
    if (it == whole.end()) return std::nullopt;
    return read_timeline_record(*it, path_);
  };
}

json TimelineSpill::restore_run(const json& run) const {
  json whole = run;
  if (json* records = records_of(whole))
    for (json& record : *records) record = restore(record);
  return whole;
}

}  // namespace shardscope
