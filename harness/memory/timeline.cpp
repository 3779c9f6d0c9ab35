// The memory timeline's recording and its bounds (include/shardscope/timeline.hpp).
#include "shardscope/timeline.hpp"

#include <algorithm>
#include <chrono>

namespace shardscope {
namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// A limit below 4 samples (2 spans) leaves nothing to merge into; it is raised to that.
Timeline::Timeline(std::size_t sample_limit, std::size_t span_limit)
    : sample_limit_(std::max<std::size_t>(sample_limit, 4)),
      span_limit_(std::max<std::size_t>(span_limit, 2)),
      origin_ns_(steady_ns()) {}

void Timeline::restart(const CategoryBytes& state, Phase phase, const Place& place) {
  origin_ns_ = steady_ns();
  start_state_ = state;
  samples_.clear();
  spans_.clear();
  open_.clear();
  marks_.assign(1, PhaseMark{0, phase, place});
  dropped_marks_ = 0;
  events_ = 0;
  merged_ = 0;
  dropped_spans_ = 0;
}

std::int64_t Timeline::now_ns() const { return steady_ns() - origin_ns_; }

void Timeline::record(Category c, std::int64_t delta, const CategoryBytes& after) {
  TimelineSample& s = samples_.emplace_back();
  s.t_ns = now_ns();
  s.bytes = after;
  s.delta = delta;
  s.category = c;
  ++events_;
  if (samples_.size() >= sample_limit_) coalesce();
}

// Pairs (0,1), (2,3), ... of every sample but the last each become the member with the
// larger total (the earlier on a tie, as the tracker keeps the first instant of a
// peak); the last sample, the current state, is kept as it is.
void Timeline::coalesce() {
  const std::size_t n = samples_.size();
  if (n < 3) return;
  std::size_t out = 0;
  std::size_t i = 0;
  for (; i + 1 < n - 1; i += 2) {
    const TimelineSample& a = samples_[i];
    const TimelineSample& b = samples_[i + 1];
    samples_[out++] = b.bytes.total() > a.bytes.total() ? b : a;
    ++merged_;
  }
  for (; i < n; ++i) samples_[out++] = samples_[i];  // the unpaired one, and the last
  samples_.resize(out);
}

void Timeline::mark(Phase phase, const Place& place) {
  if (!marks_.empty() && marks_.back().phase == phase && marks_.back().place == place) return;
  if (marks_.size() >= span_limit_) {
    const std::size_t drop = marks_.size() / 2;
    marks_.erase(marks_.begin(), marks_.begin() + static_cast<std::ptrdiff_t>(drop));
    dropped_marks_ += static_cast<std::int64_t>(drop);
  }
  marks_.push_back({now_ns(), phase, place});
}

void Timeline::push_span(const char* name, std::int64_t bytes) {
  TimelineSpan& s = open_.emplace_back();
  s.name = name != nullptr ? name : "";
  s.start_ns = now_ns();
  s.depth = static_cast<int>(open_.size()) - 1;
  s.bytes = bytes;
}

std::int64_t Timeline::clock_ns() { return steady_ns(); }

void Timeline::add_track_span(const char* track, const char* name, std::int64_t bytes, std::int64_t start_clock_ns,
                              std::int64_t end_clock_ns) {
  TimelineSpan s;
  s.name = name != nullptr ? name : "";
  s.start_ns = start_clock_ns - origin_ns_;
  s.end_ns = std::max(end_clock_ns, start_clock_ns) - origin_ns_;
  s.bytes = bytes;
  s.track = track != nullptr ? track : "";
  spans_.push_back(std::move(s));
  drop_old_spans();
}

void Timeline::pop_span() {
  if (open_.empty()) return;
  open_.back().end_ns = now_ns();
  spans_.push_back(std::move(open_.back()));
  open_.pop_back();
  drop_old_spans();
}

void Timeline::drop_old_spans() {
  if (spans_.size() > span_limit_) {
    const std::size_t drop = spans_.size() / 2;
    spans_.erase(spans_.begin(), spans_.begin() + static_cast<std::ptrdiff_t>(drop));
    dropped_spans_ += static_cast<std::int64_t>(drop);
  }
}

}  // namespace shardscope
