#include "harness/cli/plan_overhead.hpp"

#include <optional>
#include <variant>

#include "harness/cli/compare.hpp"
#include "harness/report/record_label.hpp"
#include "shardscope/check.hpp"

namespace shardscope {

PlanOverhead read_plan_overhead(const std::string& path) {
  constexpr const char* kFlag = "--overhead";
  ResultDocument doc;
  try {
    doc = read_result_file(path, kFlag);
  } catch (const UsageError& e) {
    const std::string why = e.what();
    throw UsageError(why.rfind(kFlag, 0) == 0 ? why : std::string(kFlag) + ": " + why);
  }
  std::optional<PlanOverhead> most;
  const auto consider = [&](const AllocatorFigures& a, const std::string& whose) {
    if (!a.outside_pool_bytes || (most && *a.outside_pool_bytes <= most->bytes)) return;
    most = PlanOverhead{path, *a.outside_pool_bytes, a.outside_pool_source.value_or("an unnamed source"), whose};
  };
  for (const RunRecord& run : doc.runs) {
    if (const auto* dp = std::get_if<DataParallelRun>(&run))
      for (const RankRecord& r : dp->ranks) consider(r.allocator, run_label(*dp) + ", rank " + std::to_string(r.rank));
    else if (const auto* pp = std::get_if<PipelineRun>(&run))
      for (const StageRecord& s : pp->stages) consider(s.allocator, run_label(*pp) + ", stage " + std::to_string(s.stage));
  }
  if (!most)
    throw UsageError(std::string(kFlag) + ": '" + path +
                     "' records no outside_pool_bytes for any rank or stage (a cpu run measures none); give the "
                     "--json of a --backend cuda run");
  return *most;
}

}  // namespace shardscope
