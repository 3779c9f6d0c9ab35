// A sweep's rank timelines kept on disk, from when a job's result is read until the
// sweep's files are written, so that the sweep holds one run's timelines at a time, not
// every rank's: a timeline at its limits (50,000 memory rows, 20,000 spans and marks)
// takes about 50 MB parsed, 4 MB as text.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/report/trace.hpp"

namespace shardscope {

class TimelineSpill {
 public:
  // The record field that stands for a timeline on disk: its number in the file.
  static constexpr const char* kField = "timeline_spill";

  // Creates `path` (in the sweep's scratch folder, which removes it); throws RunError.
  explicit TimelineSpill(std::string path);
  ~TimelineSpill();
  TimelineSpill(const TimelineSpill&) = delete;
  TimelineSpill& operator=(const TimelineSpill&) = delete;

  // Moves the "timeline" of every rank and stage record of `doc`'s runs to the file,
  // leaving kField in its place. Throws RunError when the file cannot be written.
  void take(nlohmann::json& doc);

  // A rank or stage record with its timeline back in place of kField (a copy of it when
  // it has none). Throws RunError.
  nlohmann::json restore(const nlohmann::json& record) const;

  // `run` with every record's timeline back. Throws RunError.
  nlohmann::json restore_run(const nlohmann::json& run) const;

  // The timelines of `doc` (whose records take() emptied) one record at a time, as the
  // trace reads them: run and member are indexes into doc["runs"] and its ranks or stages.
  TimelineSource timelines_of(const nlohmann::json& doc) const;

  // The timelines' text on disk, in bytes.
  std::int64_t bytes() const { return end_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::int64_t end_ = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces_;  // (offset, size) per timeline
};

}  // namespace shardscope
