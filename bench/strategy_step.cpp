// Step time and communication of every data-parallel strategy on the seed model, one
// process per rank over MPI (run it under mpirun -np 2).
//
// For ddp, zero1, zero2 (units all, units 1) and zero3 (units all, units 1) on the seed
// model (8 layers x 256, no activation, sum loss, batch 32 rows per rank, AdamW), CPU
// backend, one OpenBLAS thread per rank:
//   step ms  the median over timed steps (after warm-up) of the step's slowest rank; every
//            step starts after a barrier, as `shardscope run` times it
//   comm ms  the median of the ledger's time inside collectives, slowest rank; then per
//            collective (waiting for the other rank included)
//   bytes    the ledger's payload bytes per rank per step (nccl-tests' sizes: the full
//            buffer for all-reduce, world x shard for reduce-scatter and all-gather), of
//            the last step, per collective and in total, beside the closed form
//            predict_data_parallel(cfg, world, rank).comm_bytes
// Rank 0 prints. A configuration that throws is printed as skipped with its reason.
//
// Usage: mpirun -np 2 strategy_step [--steps N] [--warmup N]   (defaults 20 and 5)
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "harness/backends/cpu_backend.hpp"
#include "harness/comm/mpi_env.hpp"
#include "harness/run/provenance.hpp"
#include "shardscope/check.hpp"
#include "shardscope/predict.hpp"
#include "shardscope/strategy.hpp"

#ifdef SHARDSCOPE_WITH_MPI
#include <mpi.h>
#endif

namespace {

using namespace shardscope;
using namespace shardscope::bench;  // Clock, median, escape, ...

struct Variant {
  const char* strategy;
  int layers_per_unit;  // 0 = all
};

// One configuration's figures, as rank 0 holds them after the reductions.
struct Row {
  Variant v;
  bool skipped = false;
  std::string reason;
  int units = 1;
  double step_ms = 0.0, step_min_ms = 0.0, step_max_ms = 0.0;  // slowest rank per step
  double comm_ms = 0.0;                                         // slowest rank, median
  std::array<double, kCollKindCount> kind_ms{};                 // the same per collective
  std::int64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0, broadcast = 0;  // rank 0
  std::int64_t total = 0;  // rank 0, every collective
  std::int64_t total_other = 0;  // the other ranks' largest total (equal by symmetry)
  std::int64_t predicted = 0;    // rank 0's closed form
};

#ifdef SHARDSCOPE_WITH_MPI
// Element-wise maximum over ranks, in place.
void max_over_ranks(std::vector<double>& v) {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX,
                          MPI_COMM_WORLD));
}

std::int64_t max_over_other_ranks(std::int64_t mine, int rank) {
  long long in = rank == 0 ? -1 : static_cast<long long>(mine), out = 0;
  MPI_CHECK(MPI_Allreduce(&in, &out, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD));
  return static_cast<std::int64_t>(out);
}
#endif

Row measure(const Variant& v, Backend& backend, Communicator& comm, int steps, int warmup) {
  Row row;
  row.v = v;
  RunConfig cfg;
  cfg.model = ModelConfig{};  // 8 x 256, none, sum, batch 32
  cfg.strategy = parse_strategy(v.strategy);
  cfg.layers_per_unit = v.layers_per_unit;
  cfg.backend = "cpu";
  cfg.comm = "mpi";
  cfg.steps = warmup + steps;

  std::vector<double> step_ms, comm_ms;
  std::array<std::vector<double>, kCollKindCount> kind_ms;
  int ok = 1;
  try {
    StrategyContext ctx{cfg, backend, comm};
    std::unique_ptr<Strategy> strategy = make_strategy(ctx);
    strategy->setup();
    row.units = strategy->units();
    for (int s = 0; s < cfg.steps; ++s) {
      strategy->prepare_batch(s);
      backend.synchronize();
      comm.barrier();
      const auto t0 = Clock::now();
      strategy->step();
      backend.synchronize();
      const auto t1 = Clock::now();
      if (s < warmup) continue;
      step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      double in_comm = 0.0;
      for (int k = 0; k < kCollKindCount; ++k) {
        in_comm += comm.ledger().by_kind[k].ms;
        kind_ms[k].push_back(comm.ledger().by_kind[k].ms);
      }
      comm_ms.push_back(in_comm);
    }
    const CommLedger& l = comm.ledger();  // reset at each step's start: the last step's
    row.all_reduce = l[CollKind::all_reduce].bytes;
    row.reduce_scatter = l[CollKind::reduce_scatter].bytes;
    row.all_gather = l[CollKind::all_gather].bytes;
    row.broadcast = l[CollKind::broadcast].bytes;
    row.total = l.total_bytes();
    row.predicted = predict_data_parallel(cfg, comm.world(), comm.rank()).comm_total();
  } catch (const std::exception& e) {
    ok = 0;
    row.reason = e.what();
  }
#ifdef SHARDSCOPE_WITH_MPI
  // Every rank must agree that the configuration ran before the reductions below.
  int all_ok = ok;
  MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (!all_ok) {
    row.skipped = true;
    if (row.reason.empty()) row.reason = "another rank failed";
    return row;
  }
  max_over_ranks(step_ms);
  max_over_ranks(comm_ms);
  for (auto& k : kind_ms) max_over_ranks(k);
  row.total_other = max_over_other_ranks(row.total, comm.rank());
#else
  if (!ok) {
    row.skipped = true;
    return row;
  }
#endif
  row.step_ms = median(step_ms);
  row.step_min_ms = *std::min_element(step_ms.begin(), step_ms.end());
  row.step_max_ms = *std::max_element(step_ms.begin(), step_ms.end());
  row.comm_ms = median(comm_ms);
  for (int k = 0; k < kCollKindCount; ++k) row.kind_ms[k] = median(kind_ms[k]);
  return row;
}

void print(const std::vector<Row>& rows, int world, int steps, int warmup) {
  std::printf("strategy_step: CPU %s\n", cpu_description().c_str());
  std::printf("seed model 8 x 256, batch 32 per rank, none, sum, AdamW; cpu backend, mpi, world %d\n",
              world);
  std::printf("%d timed steps after %d warm-up; ms: median (min-max) of the slowest rank per step\n",
              steps, warmup);
  std::printf("bytes: per rank per step, ledger (rank 0) and closed form\n\n");
  std::printf("%-8s %5s %2s %8s %17s %8s %10s %10s %10s %10s %10s %10s %5s\n", "strategy",
              "units", "U", "step ms", "(min-max)", "comm ms", "all_reduce", "red_scat", "all_gather",
              "broadcast", "ledger", "predicted", "match");
  for (const Row& r : rows) {
    const std::string units = r.v.layers_per_unit == 0 ? "all" : std::to_string(r.v.layers_per_unit);
    if (r.skipped) {
      std::printf("%-8s %5s skipped: %s\n", r.v.strategy, units.c_str(), r.reason.c_str());
      continue;
    }
    char range[40];
    std::snprintf(range, sizeof(range), "(%.3f-%.3f)", r.step_min_ms, r.step_max_ms);
    const bool match = r.total == r.predicted && (world == 1 || r.total_other == r.total);
    std::printf("%-8s %5s %2d %8.3f %17s %8.3f %10lld %10lld %10lld %10lld %10lld %10lld %5s\n",
                r.v.strategy, units.c_str(), r.units, r.step_ms, range, r.comm_ms,
                static_cast<long long>(r.all_reduce), static_cast<long long>(r.reduce_scatter),
                static_cast<long long>(r.all_gather), static_cast<long long>(r.broadcast),
                static_cast<long long>(r.total),
                static_cast<long long>(r.predicted), match ? "yes" : "NO");
    if (world > 1 && r.total_other != r.total)
      std::printf("         other ranks' ledger total differs: %lld\n",
                  static_cast<long long>(r.total_other));
  }
  std::printf("\ncomm ms per collective (median over steps of the slowest rank)\n");
  std::printf("%-8s %5s %10s %10s %10s %10s\n", "strategy", "units", "all_reduce", "red_scat",
              "all_gather", "broadcast");
  for (const Row& r : rows) {
    if (r.skipped) continue;
    const std::string units = r.v.layers_per_unit == 0 ? "all" : std::to_string(r.v.layers_per_unit);
    std::printf("%-8s %5s %10.3f %10.3f %10.3f %10.3f\n", r.v.strategy, units.c_str(),
                r.kind_ms[static_cast<int>(CollKind::all_reduce)],
                r.kind_ms[static_cast<int>(CollKind::reduce_scatter)],
                r.kind_ms[static_cast<int>(CollKind::all_gather)],
                r.kind_ms[static_cast<int>(CollKind::broadcast)]);
  }
}

int parse_flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::max(1, std::atoi(argv[i + 1]));
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiSession mpi(&argc, &argv, /*force=*/true);
    if (!mpi.active()) {
      std::fprintf(stderr, "strategy_step: skipped: this build has no MPI (run it under mpirun -np 2)\n");
      return 0;
    }
    const int steps = parse_flag(argc, argv, "--steps", 20);
    const int warmup = parse_flag(argc, argv, "--warmup", 5);
    CpuBackend backend;  // one OpenBLAS thread: each rank owns one core
    std::unique_ptr<Communicator> comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
    const std::vector<Variant> variants = {
        {"ddp", 0}, {"zero1", 0}, {"zero2", 0}, {"zero2", 1}, {"zero3", 0}, {"zero3", 1}};
    std::vector<Row> rows;
    for (const Variant& v : variants) rows.push_back(measure(v, backend, *comm, steps, warmup));
    if (mpi.rank() == 0) print(rows, comm->world(), steps, warmup);
    if (mpi.world() < 2 && mpi.rank() == 0)
      std::printf("\nworld 1: start it under mpirun -np 2 to measure communication\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strategy_step: %s\n", e.what());
    return 3;
  }
  return 0;
}
