// The seed step on one core beside its floor, measured in the same run.
//
// Step: the seed model (8 layers x 256, no activation, sum loss, batch 32 rows, AdamW)
// trained by the registry's ddp at world 1 (self communicator) on the CPU backend, with
// OpenBLAS on one thread; median over the timed steps after warm-up.
//
// Floor: what the step cannot go below on this core.
//   GEMMs  per layer: forward  (B,w) x (w,w)^T   2*B*w*w flops  (no, yes)
//                     weight   (B,w)^T x (B,w)   2*B*w*w flops  (yes, no)
//                     input    (B,w) x (w,w)     2*B*w*w flops  (no, no), not layer 0
//          each at the rate host::gemm reaches on exactly that shape and transposes,
//          timed in a loop over `layers` distinct operand sets (the model's working set).
//   AdamW  reads p, g, m, v and writes p, m, v: 28 bytes per parameter, at the copy
//          bandwidth of this core (memcpy of a buffer the size of p, g, m, v together,
//          counted as bytes read + bytes written).
// Then the step's parts, timed inside an instrumented twin of ddp (same code path:
// ReplicatedStrategy, owning every tensor), and the optimizer kernel alone, so that a bad
// ratio says where the time goes (bench/adamw_kernel compares the optimizer kernel with
// the same math vectorised).
//
// Usage: step_floor [--steps N] [--warmup N]   (defaults 50 and 10)
#include <algorithm>
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
#include "harness/comm/self_comm.hpp"
#include "harness/model/data.hpp"
#include "harness/run/provenance.hpp"
#include "harness/strategies/replicated.hpp"
#include "kernels/host_ops.hpp"
#include "shardscope/strategy.hpp"

#ifdef SHARDSCOPE_WITH_BLAS
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);
#endif

namespace {

using namespace shardscope;
using namespace shardscope::bench;  // Clock, median, escape, ...

// ---- records ---------------------------------------------------------------------------

struct GemmFigure {
  const char* what;
  Trans ta, tb;
  int m, n, k;
  int calls_per_step;
  double ms_per_call = 0.0;  // median
  double gflops() const { return 2.0 * m * n * k / (ms_per_call * 1e6); }
  double ms_per_step() const { return calls_per_step * ms_per_call; }
};

struct StepParts {
  std::vector<double> step, forward, backward, reduce, optimizer;
};

struct Figures {
  ModelConfig model;
  int steps = 0, warmup = 0;
  std::vector<double> ddp_step_ms;  // registry ddp, timed steps
  std::vector<GemmFigure> gemms;
  double copy_gbps = 0.0;           // (read + write) bytes / s / 1e9
  std::int64_t copy_bytes = 0;      // size of the copied buffer
  double adamw_kernel_ms = 0.0;     // backend.adamw alone on the model's P elements
  StepParts parts;                  // instrumented twin
};

// ---- the step through the registry's ddp -----------------------------------------------

RunConfig seed_config(int steps) {
  RunConfig c;
  c.model = ModelConfig{};  // 8 x 256, none, sum, batch 32
  c.strategy = StrategyKind::ddp;
  c.backend = "cpu";
  c.comm = "self";
  c.steps = steps;
  return c;
}

std::vector<double> time_ddp_steps(const RunConfig& cfg, int warmup) {
  CpuBackend backend;
  std::unique_ptr<Communicator> comm = make_self_communicator(&backend);
  StrategyContext ctx{cfg, backend, *comm};
  std::unique_ptr<Strategy> strategy = make_strategy(ctx);
  strategy->setup();
  std::vector<double> ms;
  for (int s = 0; s < warmup + cfg.steps; ++s) {
    strategy->prepare_batch(s);  // host batch: outside the timed region, as the run does
    const auto t0 = Clock::now();
    strategy->step();
    const auto t1 = Clock::now();
    if (s >= warmup) ms.push_back(ms_between(t0, t1));
  }
  return ms;
}

// ---- an instrumented twin of ddp: the same step, its parts timed -----------------------

// Wraps the flat access and stamps the clock where forward ends and backward ends.
class StampingAccess : public BlockAccess {
 public:
  StampingAccess(BlockAccess& inner, int blocks) : inner_(inner), blocks_(blocks) {}
  const float* param(int b, int t) override { return inner_.param(b, t); }
  float* grad(int b, int t) override { return inner_.grad(b, t); }
  void before_forward(int b) override {
    if (b == 0) forward_begin = Clock::now();
  }
  void before_backward(int b) override {
    // Backward's first hook comes after the loss gradient: forward includes the loss.
    if (b == blocks_ - 1) backward_begin = Clock::now();
  }
  void after_backward(int b) override {
    if (b == 0) backward_end = Clock::now();
  }
  Clock::time_point forward_begin, backward_begin, backward_end;

 private:
  BlockAccess& inner_;
  int blocks_;
};

class TimedDdp final : public ReplicatedStrategy {
 public:
  explicit TimedDdp(const StrategyContext& ctx)
      : ReplicatedStrategy(ctx), stamps_(access_, model_->blocks()) {}
  Clock::time_point reduce_begin, optimizer_begin, optimizer_end;
  StampingAccess& stamps() { return stamps_; }

 protected:
  BlockAccess& access() override { return stamps_; }
  bool owns(int) const override { return true; }
  int owner(int) const override { return 0; }
  void reduce_gradients() override {
    reduce_begin = Clock::now();
    ReplicatedStrategy::reduce_gradients();
  }
  void optimizer_step(int step) override {
    optimizer_begin = Clock::now();
    update_owned(step);
    optimizer_end = Clock::now();
  }

 private:
  StampingAccess stamps_;
};

StepParts time_step_parts(const RunConfig& cfg, int warmup) {
  CpuBackend backend;
  std::unique_ptr<Communicator> comm = make_self_communicator(&backend);
  StrategyContext ctx{cfg, backend, *comm};
  TimedDdp strategy(ctx);
  strategy.setup();
  StepParts p;
  for (int s = 0; s < warmup + cfg.steps; ++s) {
    strategy.prepare_batch(s);
    const auto t0 = Clock::now();
    strategy.step();
    const auto t1 = Clock::now();
    if (s < warmup) continue;
    const StampingAccess& a = strategy.stamps();
    p.step.push_back(ms_between(t0, t1));
    p.forward.push_back(ms_between(a.forward_begin, a.backward_begin));
    p.backward.push_back(ms_between(a.backward_begin, a.backward_end));
    p.reduce.push_back(ms_between(strategy.reduce_begin, strategy.optimizer_begin));
    p.optimizer.push_back(ms_between(strategy.optimizer_begin, strategy.optimizer_end));
  }
  return p;
}

// ---- the floor's rates -----------------------------------------------------------------

// Median time of one call of the shape, over `reps` passes through `layers` distinct
// operand sets (A, B, C per layer, as the model holds one weight per layer).
void time_gemm(GemmFigure& g, int layers, int reps) {
  const auto rows = [](Trans t, int r, int c) { return t == Trans::no ? r : c; };
  const int a_rows = rows(g.ta, g.m, g.k), a_cols = rows(g.ta, g.k, g.m);
  const int b_rows = rows(g.tb, g.k, g.n), b_cols = rows(g.tb, g.n, g.k);
  std::vector<std::vector<float>> a, b, c;
  for (int l = 0; l < layers; ++l) {
    a.push_back(random_floats(static_cast<std::size_t>(a_rows) * a_cols, 3 * l));
    b.push_back(random_floats(static_cast<std::size_t>(b_rows) * b_cols, 3 * l + 1));
    c.emplace_back(static_cast<std::size_t>(g.m) * g.n, 0.0f);
  }
  std::vector<double> per_call;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int l = 0; l < layers; ++l) {
      host::gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a[l].data(), a_cols, b[l].data(), b_cols, 0.0f,
                 c[l].data(), g.n);
      escape(c[l].data());
    }
    per_call.push_back(ms_between(t0, Clock::now()) / layers);
  }
  g.ms_per_call = median(per_call);
}

// backend.adamw on the model's tensors (16 tensors, P elements), as ddp calls it.
double adamw_kernel_ms(const ModelConfig& m, int reps) {
  CpuBackend backend;
  const std::size_t p = static_cast<std::size_t>(m.params());
  std::vector<float> param = random_floats(p, 11), grad = random_floats(p, 12);
  std::vector<float> exp_avg(p, 0.0f), exp_avg_sq(p, 0.0f);
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    std::vector<AdamWTensor> list;
    for (int t = 0; t < m.param_tensors(); ++t) {
      const std::int64_t off = tensor_offset(m, t);
      list.push_back({param.data() + off, grad.data() + off, exp_avg.data() + off,
                      exp_avg_sq.data() + off, static_cast<std::size_t>(m.tensor_elems(t)), r + 1});
    }
    const auto t0 = Clock::now();
    backend.adamw(AdamWHyper{}, list);
    escape(param.data());
    ms.push_back(ms_between(t0, Clock::now()));
  }
  return median(ms);
}

// ---- printing --------------------------------------------------------------------------

void print(const Figures& f) {
  const ModelConfig& m = f.model;
  const double p = static_cast<double>(m.params());
  std::printf("step_floor: CPU %s\n", cpu_description().c_str());
#ifdef SHARDSCOPE_WITH_BLAS
  std::printf("OpenBLAS %s, core %s, 1 thread\n", openblas_get_config(), openblas_get_corename());
#endif
  const char* env_threads = std::getenv("OPENBLAS_NUM_THREADS");
  std::printf("OPENBLAS_NUM_THREADS=%s\n", env_threads ? env_threads : "(unset)");
  std::printf("model %d x %d, batch %d, activation none, loss sum, AdamW; P = %.0f parameters\n",
              m.layers, m.width, m.batch, p);
  std::printf("ddp, world 1 (self), cpu backend; %d timed steps after %d warm-up\n\n", f.steps,
              f.warmup);

  double gemm_floor = 0.0, flops = 0.0;
  std::printf("%-22s %-12s %6s %10s %9s %11s\n", "GEMM", "(m,n,k)", "calls", "us/call", "GFLOP/s",
              "ms/step");
  for (const GemmFigure& g : f.gemms) {
    char shape[32];
    std::snprintf(shape, sizeof(shape), "(%d,%d,%d)", g.m, g.n, g.k);
    std::printf("%-22s %-12s %6d %10.2f %9.1f %11.3f\n", g.what, shape, g.calls_per_step,
                g.ms_per_call * 1e3, g.gflops(), g.ms_per_step());
    gemm_floor += g.ms_per_step();
    flops += 2.0 * g.m * g.n * g.k * g.calls_per_step;
  }
  const double adam_bytes = 28.0 * p;
  const double adam_floor = adam_bytes / (f.copy_gbps * 1e6);
  const double floor = gemm_floor + adam_floor;
  std::printf("GEMM total: %.1f MFLOP per step at %.1f GFLOP/s -> %.3f ms\n", flops / 1e6,
              flops / (gemm_floor * 1e6), gemm_floor);
  std::printf("copy bandwidth: memcpy of %.1f MiB: %.1f GB/s (read + write)\n",
              static_cast<double>(f.copy_bytes) / (1 << 20), f.copy_gbps);
  std::printf("AdamW: 28 B x P = %.2f MB at %.1f GB/s -> %.3f ms\n\n", adam_bytes / 1e6,
              f.copy_gbps, adam_floor);

  const double step = median(f.ddp_step_ms);
  std::printf("step (ddp, median of %zu): %.3f ms   min %.3f ms\n", f.ddp_step_ms.size(), step,
              minimum(f.ddp_step_ms));
  std::printf("floor (GEMM + AdamW bytes): %.3f ms\n", floor);
  std::printf("ratio step / floor: %.2fx\n\n", step / floor);

  const StepParts& s = f.parts;
  const double tf = median(s.forward), tb = median(s.backward), tr = median(s.reduce),
               to = median(s.optimizer), ts = median(s.step);
  const double rest = ts - tf - tb - tr - to;
  std::printf("breakdown (instrumented twin of ddp, medians; step %.3f ms):\n", ts);
  std::printf("  %-34s %8s %8s\n", "part", "ms", "floor ms");
  std::printf("  %-34s %8.3f %8.3f\n", "forward + loss (8 GEMMs)", tf,
              f.gemms[0].ms_per_step());
  std::printf("  %-34s %8.3f %8.3f\n", "backward (15 GEMMs, bias grads)", tb,
              f.gemms[1].ms_per_step() + f.gemms[2].ms_per_step());
  std::printf("  %-34s %8.3f %8.3f\n", "gradient reduce (identity, scale)", tr, 0.0);
  std::printf("  %-34s %8.3f %8.3f\n", "optimizer (AdamW)", to, adam_floor);
  std::printf("  %-34s %8.3f %8.3f\n", "rest (batch upload, allocs, marks)", rest, 0.0);
  std::printf("AdamW kernel alone: %.3f ms = %.1f GB/s of its 28 B x P (%.2f ns per parameter)\n",
              f.adamw_kernel_ms, adam_bytes / (f.adamw_kernel_ms * 1e6),
              f.adamw_kernel_ms * 1e6 / p);
}

int parse_flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::max(1, std::atoi(argv[i + 1]));
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  try {
#ifdef SHARDSCOPE_WITH_BLAS
    openblas_set_num_threads(1);  // CpuBackend does it too; the GEMM loops below run first
#endif
    Figures f;
    f.steps = parse_flag(argc, argv, "--steps", 50);
    f.warmup = parse_flag(argc, argv, "--warmup", 10);
    const RunConfig cfg = seed_config(f.steps);
    f.model = cfg.model;
    const ModelConfig& m = f.model;
    const int b = m.batch, w = m.width;

    f.ddp_step_ms = time_ddp_steps(cfg, f.warmup);

    f.gemms = {
        {"forward x W^T", Trans::no, Trans::yes, b, w, w, m.layers},
        {"weight grad dy^T x", Trans::yes, Trans::no, w, w, b, m.layers},
        {"input grad dy W", Trans::no, Trans::no, b, w, w, m.layers - 1},
    };
    for (GemmFigure& g : f.gemms) time_gemm(g, m.layers, 400);

    // p, g, m, v: the bytes AdamW streams through, as one buffer.
    const std::size_t copy_floats = 4 * static_cast<std::size_t>(m.params());
    f.copy_bytes = static_cast<std::int64_t>(copy_floats * sizeof(float));
    f.copy_gbps = copy_gbps(copy_floats, 200);
    f.adamw_kernel_ms = adamw_kernel_ms(m, 100);
    f.parts = time_step_parts(cfg, f.warmup);

    print(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_floor: %s\n", e.what());
    return 3;
  }
  return 0;
}
