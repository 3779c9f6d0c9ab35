// The tracker's cost: every allocation of every rank goes through Tracker::on_alloc and
// on_free, so they must be negligible beside the allocation itself (budget: 100 ns per
// pair). Prints ns per on_alloc/on_free pair without and with the timeline recording
// (a clock read and an append per event, coalescing past its limit), then ns per
// Backend alloc/free pair through CpuBackend (which adds aligned_alloc/free and the
// Buffer), both ways, and the machine.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "bench/bench_common.hpp"
#include "harness/backends/cpu_backend.hpp"
#include "harness/run/provenance.hpp"
#include "shardscope/tracker.hpp"

namespace {

using namespace shardscope::bench;  // Clock, median, escape, ...

constexpr std::array<shardscope::Category, 4> kCats = {
    shardscope::Category::activation, shardscope::Category::temp, shardscope::Category::comm,
    shardscope::Category::param_unsharded};

// Best of `reps` timings of `iters` alloc/free pairs, in ns per pair.
template <class F>
double best_ns_per_pair(int reps, std::int64_t iters, F&& body) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    body(iters);
    const auto t1 = Clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() /
                              static_cast<double>(iters));
  }
  return best;
}

}  // namespace

int main() {
  using namespace shardscope;
  std::printf("tracker_bench: CPU %s\n", cpu_description().c_str());

  // A live baseline (so on_alloc compares against a real peak), then pairs cycling
  // through categories and sizes, as a layer loop does.
  for (const bool timeline : {false, true}) {
    Tracker tracker;
    tracker.set_recording(timeline);
    tracker.on_alloc(Category::param, 1 << 20, 1 << 20);
    const std::int64_t iters = timeline ? 2'000'000 : 20'000'000;
    const double tracker_ns = best_ns_per_pair(5, iters, [&](std::int64_t n) {
      for (std::int64_t i = 0; i < n; ++i) {
        const Category c = kCats[static_cast<std::size_t>(i) & 3];
        const std::int64_t bytes = 4096 + ((i & 7) << 6);
        tracker.on_alloc(c, bytes, bytes);
        escape(&tracker);
        tracker.on_free(c, bytes, bytes);
        escape(&tracker);
      }
    });
    std::printf("tracker on_alloc+on_free pair, timeline %s: %.2f ns (best of 5 x %lldM, 4 categories)",
                timeline ? "on " : "off", tracker_ns, static_cast<long long>(iters / 1'000'000));
    if (timeline)
      std::printf("; %zu samples kept of %lld events (limit %zu)", tracker.timeline().samples().size(),
                  static_cast<long long>(tracker.timeline().events()), tracker.timeline().sample_limit());
    std::printf("\n");
    if (tracker.live_allocations() != 1) return 1;  // also keeps the tracker observable
  }

  // Through the backend: Backend::alloc (tracker + aligned_alloc) and ~Buffer (tracker + free).
  for (const bool timeline : {false, true}) {
    CpuBackend be;
    be.tracker().set_recording(timeline);
    Buffer keep = be.alloc(Category::param, 1 << 18);
    const std::array<std::size_t, 4> counts = {64, 1024, 4096, 65536};  // 256 B .. 256 KiB
    for (std::size_t count : counts) {
      const double backend_ns = best_ns_per_pair(5, 1'000'000, [&](std::int64_t iters) {
        for (std::int64_t i = 0; i < iters; ++i) {
          Buffer b = be.alloc(kCats[static_cast<std::size_t>(i) & 3], count);
          escape(b.data());
        }
      });
      std::printf("CpuBackend alloc+free pair, timeline %s, %zu floats (%zu B): %.2f ns\n",
                  timeline ? "on " : "off", count, count * sizeof(float), backend_ns);
    }
    if (be.tracker().live_allocations() != 1) return 1;
  }
  return 0;
}
