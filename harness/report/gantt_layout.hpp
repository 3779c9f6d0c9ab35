// Where each pipeline stage's F/B/W actions sit in time, for the report's Gantt charts
// (html_pipeline.cpp). Pure: reads the stages' records, draws nothing.
//
// Measured: the spans named like actions ("F(m=2)", "B(m=0, chunk 1)") of each stage's
// last "step" span. The ranks' clocks share the run's start only to a barrier's skew,
// which on an oversubscribed machine reaches milliseconds; where the spans show a
// message received before it was sent, the stage's clock is shifted by the least amount
// that puts every F after the F it consumes on the previous stage (F(m,k-1) ends before
// F(m,k) starts) while keeping every B before the B that consumes it (B(m,k) ends before
// B(m,k-1) starts); when the two bounds cross, midway. Stage 0 is never shifted.
//
// Replayed: each stage runs its action_ms list in order, an action starting when its
// stage is free and its inputs are done (F(m,k) after F(m,k-1); B(m,k) after F(m,k) and
// B(m,k+1); W(m,k) after B(m,k); virtual stage k = chunk * S + stage), messages free.
// An action whose input never comes is laid after its stage's previous one.
#pragma once

#include <vector>

#include "harness/records/result.hpp"

namespace shardscope {

struct GanttAction {
  char kind = 0;  // 'F', 'B', 'W'
  int microbatch = 0;
  int chunk = 0;
  double start_ms = 0.0, end_ms = 0.0;
};

struct GanttStage {
  std::vector<GanttAction> actions;
  double from_ms = 0.0, to_ms = 0.0;  // the window the stage's idle time is counted in
  double clock_shift_ms = 0.0;        // added to every time the stage recorded (measured)
};

struct GanttLayout {
  enum class Source { none, measured, replayed };
  Source source = Source::none;
  std::vector<GanttStage> stages;  // in the order given
  double from_ms = 0.0, to_ms = 0.0;  // all stages' windows
  bool shifted = false;               // some stage's clock was shifted
};

// `timelines[s]` is stage s's timeline (null: none recorded); Source::none unless every
// stage has action spans.
GanttLayout measured_layout(const std::vector<const TimelineRecord*>& timelines);

// `stages[s]` is stage s's record; Source::none unless every stage has an action_ms list.
GanttLayout replayed_layout(const std::vector<const StageRecord*>& stages);

}  // namespace shardscope
