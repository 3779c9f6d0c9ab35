// The memory tracker: every allocation of a rank goes through it (docs/design.md §1, §5).
//
// It keeps current and peak bytes per category and in total, the breakdown by
// category at the instant of the peak, and the phase and place the caller marked at
// that instant. Two figures are kept: requested bytes (what tables show, identical on
// every backend) and bytes rounded to the allocator's granularity (equal to the CUDA
// pool's UsedMem* after a sync).
//
// With recording on (set_recording), every event also goes to the rank's Timeline
// (shardscope/timeline.hpp) with its time and the phase/place marked; recording only
// reads the tracker's figures, never changes them.
#pragma once

#include <cstdint>

#include "shardscope/category.hpp"
#include "shardscope/timeline.hpp"

namespace shardscope {

struct PeakRecord {
  std::int64_t total = 0;
  CategoryBytes by_category;
  Phase phase = Phase::setup;
  Place place;
};

class Tracker {
 public:
  // Hot path: a few adds and a compare, plus a clock read and an append when recording
  // (bench/tracker_bench measures both).
  void on_alloc(Category c, std::int64_t bytes, std::int64_t rounded_bytes) {
    current_[c] += bytes;
    current_total_ += bytes;
    rounded_current_ += rounded_bytes;
    ++live_allocations_;
    if (rounded_current_ > rounded_peak_) rounded_peak_ = rounded_current_;
    if (current_total_ > peak_.total) capture_peak();
    if (recording_) timeline_.record(c, bytes, current_);
  }
  void on_free(Category c, std::int64_t bytes, std::int64_t rounded_bytes) {
    current_[c] -= bytes;
    current_total_ -= bytes;
    rounded_current_ -= rounded_bytes;
    --live_allocations_;
    if (recording_) timeline_.record(c, -bytes, current_);
  }

  // Marks what the caller is doing; recorded with a new peak, and on the timeline.
  void mark(Phase phase, Place place = {}) {
    phase_ = phase;
    place_ = place;
    if (recording_) timeline_.mark(phase, place);
  }
  Phase phase() const { return phase_; }
  Place place() const { return place_; }

  // Starts a new measurement window (a step): the peak becomes the current state.
  void reset_peak() {
    capture_peak();
    rounded_peak_ = rounded_current_;
  }

  const CategoryBytes& current() const { return current_; }
  std::int64_t current_total() const { return current_total_; }
  const PeakRecord& peak() const { return peak_; }
  std::int64_t rounded_current() const { return rounded_current_; }
  std::int64_t rounded_peak() const { return rounded_peak_; }
  std::int64_t live_allocations() const { return live_allocations_; }

  // Timeline recording, off by default (runs turn it on: --timeline on). Turning it on
  // restarts the timeline: its clock starts now, from the current state.
  void set_recording(bool on) {
    if (on && !recording_) timeline_.restart(current_, phase_, place_);
    recording_ = on;
  }
  bool recording() const { return recording_; }
  const Timeline& timeline() const { return timeline_; }
  Timeline& timeline() { return timeline_; }
  // Profiler ranges (Backend::range_push/range_pop), kept as spans while recording.
  void push_span(const char* name, std::int64_t bytes) {
    if (recording_) timeline_.push_span(name, bytes);
  }
  void pop_span() {
    if (recording_) timeline_.pop_span();
  }
  // A finished span of a track (Timeline::add_track_span), kept while recording.
  void add_track_span(const char* track, const char* name, std::int64_t bytes, std::int64_t start_clock_ns,
                      std::int64_t end_clock_ns) {
    if (recording_) timeline_.add_track_span(track, name, bytes, start_clock_ns, end_clock_ns);
  }

 private:
  void capture_peak() {
    peak_.total = current_total_;
    peak_.by_category = current_;
    peak_.phase = phase_;
    peak_.place = place_;
  }

  CategoryBytes current_;
  std::int64_t current_total_ = 0;
  std::int64_t rounded_current_ = 0;
  std::int64_t rounded_peak_ = 0;
  std::int64_t live_allocations_ = 0;
  PeakRecord peak_;
  Phase phase_ = Phase::setup;
  Place place_;
  bool recording_ = false;
  Timeline timeline_;
};

}  // namespace shardscope
