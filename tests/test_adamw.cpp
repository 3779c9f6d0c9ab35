// The multi-tensor AdamW (host::adamw, and so the CpuBackend) against torch.optim.AdamW's
// update rule written in float64 (torch/optim/adamw.py, _single_tensor_adamw):
//   param.mul_(1 - lr * weight_decay)
//   exp_avg.lerp_(grad, 1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   step_size = lr / (1 - beta1 ** step)
//   denom = (exp_avg_sq.sqrt() / sqrt(1 - beta2 ** step)).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-step_size)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/random_data.hpp"
#include "harness/backends/cpu_backend.hpp"
#include "kernels/host_ops.hpp"

namespace shardscope {
namespace {

using testing::all_zero;
using testing::random_floats;

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-7;



// Hyperparameters in double, as torch holds them (and AdamWHyper does).
struct HyperD {
  double lr, beta1, beta2, eps, wd;
};

HyperD widen(const AdamWHyper& h) {
  return {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
}

// mag: the exp_avg recurrence run on |grad|, the size of the terms that m = m + (g - m)(1 - beta1)
// adds. With large gradients m can be a small difference of large terms, and fp32 then
// holds it to rtol * mag, not to rtol * |m| (torch's fp32 kernel as much as ours).
struct RefTensor {
  std::vector<double> p, m, v, mag;
};

RefTensor make_ref(const std::vector<float>& p0) {
  const std::size_t n = p0.size();
  return {std::vector<double>(p0.begin(), p0.end()), std::vector<double>(n, 0.0),
          std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
}

void reference_step(const HyperD& h, RefTensor& t, const std::vector<float>& g, int step) {
  const double bc1 = 1.0 - std::pow(h.beta1, step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, step));
  for (std::size_t i = 0; i < g.size(); ++i) {
    t.p[i] *= 1.0 - h.lr * h.wd;
    t.m[i] += (g[i] - t.m[i]) * (1.0 - h.beta1);
    t.mag[i] = h.beta1 * t.mag[i] + (1.0 - h.beta1) * std::fabs(g[i]);
    t.v[i] = t.v[i] * h.beta2 + (1.0 - h.beta2) * g[i] * g[i];
    const double denom = std::sqrt(t.v[i]) / bc2_sqrt + h.eps;
    t.p[i] -= h.lr / bc1 * t.m[i] / denom;
  }
}

struct Tensor {
  std::vector<float> p, m, v;
};

// |got - ref| <= atol + rtol * max(|ref|, mag) element-wise (mag: see RefTensor).
int count_mismatches(const std::vector<float>& got, const std::vector<double>& ref,
                     const std::string& what, const std::vector<double>* mag = nullptr,
                     double rtol = kRtol) {
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double scale = std::max(std::fabs(ref[i]), mag ? (*mag)[i] : 0.0);
    if (!(std::fabs(got[i] - ref[i]) <= kAtol + rtol * scale)) {
      if (++bad <= 3)
        ADD_FAILURE() << what << "[" << i << "] got " << got[i] << " want " << ref[i];
    }
  }
  return bad;
}

// Five steps over tensors of different sizes in one call, fresh gradients every step.
// `grad_scale` sets the gradients' magnitude: large gradients make exp_avg_sq large, so
// that its comparison is decided by rtol rather than hidden under atol.
// The reference runs with `hd` (by default the backend's fp32 values, widened);
// exp_avg_sq is held to `v_rtol`.
void run_adamw_steps(const AdamWHyper& h, float grad_scale, const std::string& label,
                     const HyperD* ref_hyper = nullptr, double v_rtol = kRtol) {
  std::mt19937 gen(1234);
  const std::vector<std::size_t> sizes = {1, 7, 64, 1000, 4099};
  std::vector<Tensor> ts;
  std::vector<RefTensor> refs;
  for (std::size_t n : sizes) {
    Tensor t{random_floats(n, gen, -1.0f, 1.0f), std::vector<float>(n, 0.0f),
             std::vector<float>(n, 0.0f)};
    ASSERT_FALSE(all_zero(t.p));
    refs.push_back(make_ref(t.p));
    ts.push_back(std::move(t));
  }
  const HyperD hd = ref_hyper ? *ref_hyper : widen(h);
  for (int step = 1; step <= 5; ++step) {
    std::vector<std::vector<float>> grads;
    std::vector<AdamWTensor> list;
    for (std::size_t t = 0; t < ts.size(); ++t) {
      grads.push_back(random_floats(sizes[t], gen, -grad_scale, grad_scale));
      ASSERT_FALSE(all_zero(grads.back()));
    }
    for (std::size_t t = 0; t < ts.size(); ++t) {
      list.push_back({ts[t].p.data(), grads[t].data(), ts[t].m.data(), ts[t].v.data(), sizes[t], step});
      reference_step(hd, refs[t], grads[t], step);
    }
    host::adamw(h, list);
    for (std::size_t t = 0; t < ts.size(); ++t) {
      const std::string where = label + " step " + std::to_string(step) + " tensor " +
                                std::to_string(t) + " (n=" + std::to_string(sizes[t]) + ") ";
      ASSERT_FALSE(all_zero(ts[t].m));
      ASSERT_FALSE(all_zero(ts[t].v));
      EXPECT_EQ(count_mismatches(ts[t].p, refs[t].p, where + "param"), 0);
      EXPECT_EQ(count_mismatches(ts[t].m, refs[t].m, where + "exp_avg", &refs[t].mag), 0);
      EXPECT_EQ(count_mismatches(ts[t].v, refs[t].v, where + "exp_avg_sq", nullptr, v_rtol), 0);
    }
  }
}

TEST(AdamW, FiveStepsMatchTorchFormulaDefaults) { run_adamw_steps(AdamWHyper{}, 1.0f, "defaults"); }

TEST(AdamW, FiveStepsMatchTorchFormulaLargeGradients) {
  run_adamw_steps(AdamWHyper{}, 100.0f, "grad x100");
}

// torch holds its hyperparameters as Python floats (doubles) and hands the fp32 kernels
// float(1 - beta2) = 0.001f, not 1 - 0.999f = 0.000999987 (1.29e-5 relative below). The
// shared kernel takes the per-step scalars computed in double, so exp_avg_sq matches
// torch's defaults written as literals to 1e-5 even with gradients of 100.
TEST(AdamW, FiveStepsAgainstTorchDoubleHyperparameters) {
  const HyperD torch_defaults{1e-3, 0.9, 0.999, 1e-8, 1e-2};
  run_adamw_steps(AdamWHyper{}, 100.0f, "torch doubles", &torch_defaults, 1e-5);
}

TEST(AdamW, FiveStepsMatchTorchFormulaOtherHyper) {
  AdamWHyper h;
  h.lr = 3e-2;
  h.beta1 = 0.8;
  h.beta2 = 0.95;
  h.eps = 1e-6;
  h.weight_decay = 0.1;
  run_adamw_steps(h, 3.0f, "lr 3e-2 betas 0.8/0.95");
}

// Each tensor carries its own step: a zero1 owner or a unit that joined later must use
// its own bias correction, not the list's first one.
TEST(AdamW, PerTensorStep) {
  const AdamWHyper h;
  std::mt19937 gen(99);
  const std::size_t n = 33;
  std::vector<float> g = random_floats(n, gen, -1.0f, 1.0f);
  Tensor a{random_floats(n, gen, -1.0f, 1.0f), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  Tensor b = a;
  RefTensor ra = make_ref(a.p);
  RefTensor rb = ra;
  host::adamw(h, {{a.p.data(), g.data(), a.m.data(), a.v.data(), n, 1},
                  {b.p.data(), g.data(), b.m.data(), b.v.data(), n, 4}});
  reference_step(widen(h), ra, g, 1);
  reference_step(widen(h), rb, g, 4);
  EXPECT_EQ(count_mismatches(a.p, ra.p, "step 1 param"), 0);
  EXPECT_EQ(count_mismatches(b.p, rb.p, "step 4 param"), 0);
  EXPECT_NE(a.p, b.p);
}

// Through the CPU backend with tracked optimizer state.
TEST(AdamW, CpuBackendTrackedState) {
  CpuBackend be;
  const AdamWHyper h;
  std::mt19937 gen(7);
  const std::size_t n = 300;
  const std::vector<float> p0 = random_floats(n, gen, -1.0f, 1.0f);
  const std::vector<float> g = random_floats(n, gen, -1.0f, 1.0f);
  Buffer p = be.alloc(Category::param, n), gb = be.alloc(Category::grad, n);
  Buffer m = be.alloc(Category::optim, n), v = be.alloc(Category::optim, n);
  EXPECT_EQ(be.tracker().current()[Category::optim], static_cast<std::int64_t>(8 * n));
  be.upload(p.data(), p0.data(), n);
  be.upload(gb.data(), g.data(), n);
  be.fill(m.data(), 0.0f, n);
  be.fill(v.data(), 0.0f, n);
  RefTensor ref = make_ref(p0);
  for (int step = 1; step <= 3; ++step) {
    be.adamw(h, {{p.data(), gb.data(), m.data(), v.data(), n, step}});
    reference_step(widen(h), ref, g, step);
  }
  std::vector<float> got(n);
  be.download(got.data(), p.data(), n);
  EXPECT_EQ(count_mismatches(got, ref.p, "backend param"), 0);
}

}  // namespace
}  // namespace shardscope
