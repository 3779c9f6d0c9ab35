// The report's charts (html_report.cpp assembles the page): each returns HTML holding
// inline SVG, for one group of runs that share world, model and setup (group_runs).
// They render the records; a run without a timeline gets a "no timeline recorded" panel
// instead of its time chart.
#pragma once

#include <string>
#include <vector>

#include "harness/records/result.hpp"

namespace shardscope::html {

// Data parallel: per run a cluster of bars, two per rank (R: at rest after the step, P:
// at the peak), stacked by category, the predicted total marked as a black tick, the
// peak's phase and place named under the cluster. One y scale for the group.
std::string data_parallel_bars(const std::vector<const DataParallelRun*>& runs);

// Data parallel: per run and rank, bytes by category over the run (stacked areas from
// timeline.memory), the peak instant and the predicted peak marked, the phases as a
// strip under the axis. Ranks whose bytes change identically share one chart. One y
// scale for the group, so that strategies compare by eye.
std::string data_parallel_timelines(const std::vector<const DataParallelRun*>& runs);

// Pipeline: per run a Gantt of each stage's F/B/W actions on measured time (spans named
// "F(m=..)"), bubbles shaded; without spans, the measured action times (action_ms)
// replayed with free communication. Under it each stage's live activation bytes over
// the same window (timeline.memory). One activation scale for the group.
std::string pipeline_charts(const std::vector<const PipelineRun*>& runs);

}  // namespace shardscope::html
