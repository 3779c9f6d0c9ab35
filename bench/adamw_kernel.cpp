// The CPU AdamW kernel beside the same math written out lane by lane, and the floor.
//
// host::adamw (what CpuBackend::adamw runs) applies math::adamw_update to locals loaded
// through __restrict pointers, and kernels/host_ops.cpp is built with -fno-math-errno (and
// -march=native unless SHARDSCOPE_NATIVE=OFF): GCC then vectorises it. Without those
// (p, m, v through float& that may alias; sqrtf with its errno branch) the loop stayed
// scalar at ~3.4 ns per parameter on the seed model.
//
// The variants below run the same per-element operations in the same order with the same
// per-step scalars (math::adamw_scalars), 4 and 8 lanes at a time (SSE2, AVX2; no FMA,
// whose single rounding would differ): what the compiler should reach. IEEE sqrt,
// division, multiply and add are correctly rounded at every width, so the results are
// bitwise equal to host::adamw, which the bench checks. All run on the seed model's 16
// tensors (P = 526,336), 28 bytes per parameter (read p, g, m, v; write p, m, v), beside
// the memcpy bandwidth of a buffer the size of p, g, m, v.
//
// Usage: adamw_kernel [--reps N]   (default 200)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "harness/backends/cpu_backend.hpp"
#include "harness/model/data.hpp"
#include "harness/run/provenance.hpp"
#include "kernels/host_ops.hpp"
#include "shardscope/config.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ADAMW_KERNEL_VARIANTS 1
#include <immintrin.h>
#endif
#include "kernels/elementwise.hpp"

namespace {

using namespace shardscope;

#ifdef ADAMW_KERNEL_VARIANTS
// math::adamw_update, lane by lane, in its order of operations:
//   p *= decay;  m += (1 - beta1)*(g - m);  v = v*beta2 + ((1 - beta2)*g)*g;
//   denom = sqrt(v)/bc2_sqrt + eps;  p += (-step_size)*(m/denom)
// The tail goes through math::adamw_update itself.
#define ADAMW_KERNEL_LANES(V, W, set1, load, store, add, sub, mul, div, sqrt)                  \
  const V decay = set1(s.decay), one_b1 = set1(s.one_minus_beta1), b2 = set1(s.beta2),         \
          one_b2 = set1(s.one_minus_beta2), c2 = set1(s.bc2_sqrt), eps = set1(s.eps),          \
          neg_step = set1(-s.step_size);                                                       \
  std::size_t i = 0;                                                                           \
  for (; i + W <= n; i += W) {                                                                 \
    const V gi = load(g + i);                                                                  \
    V pi = mul(load(p + i), decay);                                                            \
    V mi = load(m + i);                                                                        \
    mi = add(mi, mul(one_b1, sub(gi, mi)));                                                    \
    const V vi = add(mul(load(v + i), b2), mul(mul(one_b2, gi), gi));                          \
    const V denom = add(div(sqrt(vi), c2), eps);                                               \
    pi = add(pi, mul(neg_step, div(mi, denom)));                                               \
    store(p + i, pi);                                                                          \
    store(m + i, mi);                                                                          \
    store(v + i, vi);                                                                          \
  }                                                                                            \
  for (; i < n; ++i) math::adamw_update(p[i], g[i], m[i], v[i], s);

__attribute__((noinline)) void adamw_lanes_sse2(const math::AdamWScalars& s, float* p,
                                                const float* g, float* m, float* v,
                                                std::size_t n) {
  ADAMW_KERNEL_LANES(__m128, 4, _mm_set1_ps, _mm_loadu_ps, _mm_storeu_ps, _mm_add_ps, _mm_sub_ps,
                     _mm_mul_ps, _mm_div_ps, _mm_sqrt_ps)
}

__attribute__((noinline, target("avx2"))) void adamw_lanes_avx2(const math::AdamWScalars& s,
                                                                float* p, const float* g,
                                                                float* m, float* v, std::size_t n) {
  ADAMW_KERNEL_LANES(__m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps,
                     _mm256_sub_ps, _mm256_mul_ps, _mm256_div_ps, _mm256_sqrt_ps)
}
#undef ADAMW_KERNEL_LANES
#endif

using namespace shardscope::bench;  // Clock, median, escape, ...
using FlatKernel = void (*)(const math::AdamWScalars&, float*, const float*, float*, float*,
                            std::size_t);

struct State {
  std::vector<float> p, g, m, v;
};

State fresh_state(std::size_t n) {
  return {random_floats(n, 11), random_floats(n, 12), std::vector<float>(n, 0.0f),
          std::vector<float>(n, 0.0f)};
}

std::vector<AdamWTensor> tensors(const ModelConfig& mc, State& s, int step) {
  std::vector<AdamWTensor> list;
  for (int t = 0; t < mc.param_tensors(); ++t) {
    const std::int64_t off = tensor_offset(mc, t);
    list.push_back({s.p.data() + off, s.g.data() + off, s.m.data() + off, s.v.data() + off,
                    static_cast<std::size_t>(mc.tensor_elems(t)), step});
  }
  return list;
}

struct Figure {
  std::string what;
  bool ran = false;
  std::string why_not;
  double ms = 0.0;
  bool bitwise_equal = true;  // against host::adamw after every step
};

// `kernel` null: the backend's own adamw. Otherwise the flat kernel per tensor, with the
// per-step scalars host::adamw uses (math::adamw_scalars, in double, per tensor).
Figure measure(const std::string& what, const ModelConfig& mc, int reps, FlatKernel kernel) {
  Figure f;
  f.what = what;
  f.ran = true;
  CpuBackend backend;
  const std::size_t n = static_cast<std::size_t>(mc.params());
  State s = fresh_state(n), ref = fresh_state(n);
  const AdamWHyper h;
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const int step = r + 1;
    const std::vector<AdamWTensor> list = tensors(mc, s, step);
    const auto t0 = Clock::now();
    if (kernel == nullptr) {
      backend.adamw(h, list);
    } else {
      for (const AdamWTensor& t : list) {
        const math::AdamWScalars sc =
            math::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, t.step);
        kernel(sc, t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.n);
      }
    }
    escape(s.p.data());
    ms.push_back(ms_since(t0));
    host::adamw(h, tensors(mc, ref, step));
  }
  f.ms = median(ms);
  f.bitwise_equal = s.p == ref.p && s.m == ref.m && s.v == ref.v;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 200;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  const ModelConfig mc;  // the seed model: 8 x 256
  const double p = static_cast<double>(mc.params());
  const double bytes = 28.0 * p;

  std::vector<Figure> figures;
  figures.push_back(measure("host::adamw (CpuBackend)", mc, reps, nullptr));
#ifdef ADAMW_KERNEL_VARIANTS
  figures.push_back(measure("4 lanes (SSE2)", mc, reps, adamw_lanes_sse2));
  if (__builtin_cpu_supports("avx2")) {
    figures.push_back(measure("8 lanes (AVX2)", mc, reps, adamw_lanes_avx2));
  } else {
    figures.push_back({"8 lanes (AVX2)", false, "this CPU has no AVX2"});
  }
#else
  figures.push_back({"4 and 8 lanes", false, "the variants need x86-64 and GCC or Clang"});
#endif
  const double gbps = copy_gbps(4 * static_cast<std::size_t>(mc.params()), reps);

  std::printf("adamw_kernel: CPU %s\n", cpu_description().c_str());
  std::printf("seed model: P = %.0f parameters in %d tensors; 28 B x P = %.2f MB per step; "
              "median of %d steps\n\n", p, mc.param_tensors(), bytes / 1e6, reps);
  std::printf("%-28s %9s %9s %8s %14s\n", "kernel", "ms", "GB/s", "ns/param", "bitwise equal");
  for (const Figure& f : figures) {
    if (!f.ran) {
      std::printf("%-28s skipped: %s\n", f.what.c_str(), f.why_not.c_str());
      continue;
    }
    std::printf("%-28s %9.3f %9.1f %8.3f %14s\n", f.what.c_str(), f.ms, bytes / (f.ms * 1e6),
                f.ms * 1e6 / p, f.bitwise_equal ? "yes" : "NO");
  }
  std::printf("%-28s %9.3f %9.1f %8.3f %14s\n", "floor: memcpy bandwidth", bytes / (gbps * 1e6),
              gbps, bytes / (gbps * 1e6) * 1e6 / p, "-");
  return 0;
}
