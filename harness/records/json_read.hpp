// A shardscope/1 document read back into the records of result.hpp, checked once, at
// the edge: after this no printer meets a field of the wrong type.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "harness/records/result.hpp"

namespace shardscope {

// Reads `doc`, the content of file `source`. Throws UsageError naming the file, the run
// (index and label) and the field's path, and saying what was expected:
//   'a.json': runs[0] (zero2 W=2 units=1): ranks[1].resting.total is "x", not a byte count
//   'a.json': runs[4] (gpipe S=2 M=2 chunks=1): stages[1].step_ms is missing; expected ...
// Every field the writer (json_write.cpp) writes must be there with its type; byte
// figures and counts are whole numbers from 0 to 2^63 - 1 (1.5 and 2^70 are refused),
// times finite numbers. Fields a file written by an earlier version leaves out
// (local_rank and device) may be absent; keys nothing reads are passed over.
ResultDocument read_result(const nlohmann::json& doc, const std::string& source);

// One rank's or stage's record alone (what a rank sends rank 0); `source` names it.
RankRecord read_rank_record(const nlohmann::json& record, const std::string& source);
StageRecord read_stage_record(const nlohmann::json& record, const std::string& source);
// A record's "timeline" alone (a sweep keeps them on disk until it writes its files).
TimelineRecord read_timeline_record(const nlohmann::json& timeline, const std::string& source);

}  // namespace shardscope
