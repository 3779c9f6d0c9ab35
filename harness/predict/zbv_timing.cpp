// zbv's list positions and rounds (zbv_timing.hpp): each phase a formula.
#include "harness/predict/zbv_timing.hpp"

#include <algorithm>

namespace shardscope {

ZbvTiming::Phases ZbvTiming::phases(i64 s) const {
  Phases ph{};
  ph.b = 2 * (S_ - s) - 1;
  ph.c = 2 * S_ - 1;
  ph.d = 5 * S_ - 3 * s - 1;
  ph.t6 = M_ - 2 * S_ + s + 1;  // iterations that still run an F0
  ph.e = ph.d + 6 * ph.t6 + 5 * (M_ - S_ - ph.t6);
  ph.f = ph.e + 2 * s;
  ph.g = ph.f + 2 * (S_ - s);
  ph.h = ph.g + s;
  return ph;
}

ZbvTiming::Op ZbvTiming::at(i64 s, i64 p) const {
  const Phases ph = phases(s);
  if (p < ph.b) return {F, 0, p};
  if (p < ph.c) {
    const i64 j = (p - ph.b) / 2;
    return (p - ph.b) % 2 == 0 ? Op{F, 1, j} : Op{F, 0, ph.b + j};
  }
  if (p < ph.d) {
    const i64 j = (p - ph.c) / 3;
    switch ((p - ph.c) % 3) {
      case 0: return {F, 1, s + j};
      case 1: return {B, 1, j};
      default: return {W, 1, j};
    }
  }
  if (p < ph.e) {
    const bool six = p < ph.d + 6 * ph.t6;
    const i64 t = six ? (p - ph.d) / 6 : ph.t6 + (p - ph.d - 6 * ph.t6) / 5;
    i64 o = six ? (p - ph.d) % 6 : (p - ph.d - 6 * ph.t6) % 5 + 1;  // offsets of a six-action iteration
    switch (o) {
      case 0: return {F, 0, 2 * S_ - s - 1 + t};
      case 1: return {B, 0, t};
      case 2: return {W, 0, t};
      case 3: return {F, 1, S_ + t};
      case 4: return {B, 1, S_ - s + t};
      default: return {W, 1, S_ - s + t};
    }
  }
  if (p < ph.f) {
    const i64 j = (p - ph.e) / 2;
    return (p - ph.e) % 2 == 0 ? Op{B, 0, M_ - S_ + j} : Op{B, 1, M_ - s + j};
  }
  if (p < ph.g) {
    const i64 j = (p - ph.f) / 2;
    return (p - ph.f) % 2 == 0 ? Op{B, 0, M_ - S_ + s + j} : Op{W, 0, M_ - S_ + j};
  }
  if (p < ph.h) return {W, 1, M_ - s + (p - ph.g)};
  return {W, 0, M_ - s + (p - ph.h)};
}

ZbvTiming::i64 ZbvTiming::position(i64 s, Kind kind, int chunk, i64 m) const {
  const Phases ph = phases(s);
  const i64 T = M_ - S_;
  auto steady = [&](i64 t, i64 six_offset) {  // offset in a six-action iteration
    return iteration_start(ph, t) + six_offset - (t < ph.t6 ? 0 : 1);
  };
  if (chunk == 0) {
    switch (kind) {
      case F:
        if (m < ph.b) return m;
        if (m < 2 * S_ - s - 1) return ph.b + 2 * (m - ph.b) + 1;
        return ph.d + 6 * (m - (2 * S_ - s - 1));
      case B:
        if (m < T) return steady(m, 1);
        if (m < T + s) return ph.e + 2 * (m - T);
        return ph.f + 2 * (m - T - s);
      case W:
        if (m < T) return steady(m, 2);
        if (m < M_ - s) return ph.f + 2 * (m - T) + 1;
        return ph.h + (m - (M_ - s));
    }
  }
  switch (kind) {
    case F:
      if (m < s) return ph.b + 2 * m;
      if (m < S_) return ph.c + 3 * (m - s);
      return steady(m - S_, 3);
    case B:
      if (m < S_ - s) return ph.c + 3 * m + 1;
      if (m < M_ - s) return steady(m - (S_ - s), 4);
      return ph.e + 2 * (m - (M_ - s)) + 1;
    case W:
      if (m < S_ - s) return ph.c + 3 * m + 2;
      if (m < M_ - s) return steady(m - (S_ - s), 5);
      return ph.g + (m - (M_ - s));
  }
  return 0;
}

ZbvTiming::i64 ZbvTiming::count_before(i64 s, Kind kind, int chunk, i64 p) const {
  // Positions of one (kind, chunk) grow with the micro-batch: the first m at or past p.
  i64 lo = 0, hi = M_;
  while (lo < hi) {
    const i64 mid = (lo + hi) / 2;
    if (position(s, kind, chunk, mid) < p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

ZbvTiming::i64 ZbvTiming::send_step(i64 s, i64 consumer_round) const {
  return std::min(consumer_round - s, steps());
}

ZbvTiming::Consumer ZbvTiming::consumer(i64 s, Kind kind, int chunk, i64 m) const {
  i64 to = -1;
  if (kind == F) to = chunk == 0 ? (s + 1 < S_ ? s + 1 : -1) : s - 1;  // F1 of stage 0: the loss
  if (kind == B) to = chunk == 0 ? s - 1 : (s + 1 < S_ ? s + 1 : -1);  // B0 of stage 0: no input gradient
  if (to < 0 || kind == W) return {};
  return {to, position(to, kind, chunk, m)};
}

}  // namespace shardscope
