// A rank's memory timeline (issue 6): every tracked allocation and free with its time,
// category and signed bytes, every change of the marked phase/place (the phase of an
// event is the mark in force at its time), plus the profiler ranges (spans) the code
// pushes. Filled by the Tracker when recording is on; rendered
// by harness/run/records.cpp (the rank record's "timeline") and harness/report/trace.cpp
// (Chrome trace events).
//
// Times are steady-clock nanoseconds since restart() (the run's start: every rank
// restarts right after a barrier, so ranks of one job share an origin). On CUDA an event's
// time is when the host issued the stream-ordered allocation or free.
//
// Bounded: at most `sample_limit` samples and `span_limit` finished spans are kept.
// Past the sample limit, adjacent pairs of samples are merged, the one with the larger
// total kept (the earlier on a tie), halving the count: the peak survives every merge,
// older parts of the run get coarser, and the latest sample is always the current
// state. Past the span limit, the older half of the finished spans (or of the marks)
// is dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/category.hpp"

namespace shardscope {

// The state after one event (or, once coalesced, after the event kept of a merged run).
struct TimelineSample {
  std::int64_t t_ns = 0;     // since restart()
  CategoryBytes bytes;       // current bytes per category after the event
  std::int64_t delta = 0;    // the event's signed bytes: + alloc, - free
  Category category = Category::temp;
};

// Where the caller's marked phase or place changed (Tracker::mark), whether or not
// memory moved then: the optimizer's fused update allocates nothing, yet is a phase.
struct PhaseMark {
  std::int64_t t_ns = 0;
  Phase phase = Phase::setup;
  Place place;
};

// The track of a non-blocking collective's span (--overlap on): from its post to when it
// was seen complete, beside the ranges the step's compute pushes.
inline constexpr const char* kCommunicationTrack = "communication";

// A profiler range: [start_ns, end_ns], nested `depth` deep (0 = outermost). A span of
// a track (`track` not empty: kCommunicationTrack) is not nested in the ranges; its
// spans may overlap the ranges and each other, and have depth 0.
struct TimelineSpan {
  std::string name;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  int depth = 0;
  std::int64_t bytes = -1;  // payload of a collective or p2p range; -1 when none
  std::string track;        // empty: the ranges
};

class Timeline {
 public:
  static constexpr std::size_t kDefaultSampleLimit = 50'000;
  static constexpr std::size_t kDefaultSpanLimit = 20'000;

  explicit Timeline(std::size_t sample_limit = kDefaultSampleLimit,
                    std::size_t span_limit = kDefaultSpanLimit);

  // Forgets everything and starts the clock now; `state` is the bytes held at this
  // instant (the first row of the rendered memory series), `phase` and `place` what is
  // under way (the first mark, at 0).
  void restart(const CategoryBytes& state, Phase phase = Phase::setup, const Place& place = {});

  // One event; `after` is the tracker's state once the event is counted. Out of line
  // (timeline.cpp): a clock read and an append, amortised O(1) with coalescing.
  void record(Category c, std::int64_t delta, const CategoryBytes& after);

  // What the caller does from now on; recorded when it differs from the last mark.
  void mark(Phase phase, const Place& place);

  void push_span(const char* name, std::int64_t bytes);
  void pop_span();  // ignored when no span is open
  // A finished span of `track`, its ends given on the steady clock (clock_ns()).
  void add_track_span(const char* track, const char* name, std::int64_t bytes, std::int64_t start_clock_ns,
                      std::int64_t end_clock_ns);
  // The steady clock in ns (not since restart): what add_track_span takes.
  static std::int64_t clock_ns();

  // Nanoseconds since restart().
  std::int64_t now_ns() const;

  const CategoryBytes& start_state() const { return start_state_; }
  const std::vector<TimelineSample>& samples() const { return samples_; }
  // Finished spans in the order they ended (parents after their children).
  const std::vector<TimelineSpan>& spans() const { return spans_; }
  // Changes of phase or place in time order; past `span_limit` marks the older half is
  // dropped, as for spans.
  const std::vector<PhaseMark>& marks() const { return marks_; }
  std::int64_t dropped_marks() const { return dropped_marks_; }
  std::size_t open_spans() const { return open_.size(); }
  std::int64_t events() const { return events_; }          // recorded since restart()
  std::int64_t merged_events() const { return merged_; }   // events folded into a neighbour
  bool coalesced() const { return merged_ > 0; }
  std::int64_t dropped_spans() const { return dropped_spans_; }
  std::size_t sample_limit() const { return sample_limit_; }
  std::size_t span_limit() const { return span_limit_; }

 private:
  void coalesce();
  void drop_old_spans();  // past span_limit_, the older half

  std::size_t sample_limit_;
  std::size_t span_limit_;
  std::int64_t origin_ns_ = 0;  // steady clock at restart()
  CategoryBytes start_state_;
  std::vector<TimelineSample> samples_;
  std::vector<TimelineSpan> spans_;
  std::vector<TimelineSpan> open_;
  std::vector<PhaseMark> marks_;
  std::int64_t dropped_marks_ = 0;
  std::int64_t events_ = 0;
  std::int64_t merged_ = 0;
  std::int64_t dropped_spans_ = 0;
};

}  // namespace shardscope
