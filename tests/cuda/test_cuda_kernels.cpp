// Every CUDA backend kernel against the host reference (kernels/host_ops.hpp) on seeded
// random data. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cuda_testbed.hpp"
#include "kernels/host_ops.hpp"

namespace shardscope::testing {
namespace {

const char* trans_name(Trans t) { return t == Trans::yes ? "T" : "N"; }

// op(A)(m,k) op(B)(k,n) with every transpose pair, non-square, tight and padded leading
// dimensions, alpha and beta not 0 or 1 (C starts random, so beta is exercised).
TEST_F(CudaTest, GemmMatchesHostForAllTransposes) {
  const int m = 37, n = 23, k = 51;
  const float alpha = 0.7f, beta = 0.3f;
  std::uint32_t seed = 100;
  for (int pad : {0, 3}) {
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        SCOPED_TRACE(std::string("op(A)=") + trans_name(ta) + " op(B)=" + trans_name(tb) +
                     " pad=" + std::to_string(pad));
        // Stored shapes (row-major): A is (m,k) or (k,m); B is (k,n) or (n,k).
        const int a_rows = ta == Trans::no ? m : k, a_cols = ta == Trans::no ? k : m;
        const int b_rows = tb == Trans::no ? k : n, b_cols = tb == Trans::no ? n : k;
        const int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
        const auto a = random_floats(static_cast<std::size_t>(a_rows) * lda, seed++);
        const auto b = random_floats(static_cast<std::size_t>(b_rows) * ldb, seed++);
        auto c_ref = random_floats(static_cast<std::size_t>(m) * ldc, seed++);
        ASSERT_TRUE(nonzero(a, "A"));
        ASSERT_TRUE(nonzero(b, "B"));
        ASSERT_TRUE(nonzero(c_ref, "C"));
        Buffer da = to_device(a), db = to_device(b), dc = to_device(c_ref);

        backend_->gemm(ta, tb, m, n, k, alpha, da.data(), lda, db.data(), ldb, beta, dc.data(), ldc);
        host::gemm_loops(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c_ref.data(),
                         ldc);
        const auto c = to_host(dc);
        ASSERT_TRUE(nonzero(c, "C result"));
        EXPECT_TRUE(all_close(c, c_ref, 1e-5, 1e-5));
      }
    }
  }
}

// TF32 on: still a GEMM (looser tolerance: 10-bit mantissa inputs), and the flag sticks.
TEST_F(CudaTest, GemmWithTf32StaysClose) {
  const int m = 128, n = 96, k = 256;
  const auto a = random_floats(static_cast<std::size_t>(m) * k, 7);
  const auto b = random_floats(static_cast<std::size_t>(k) * n, 8);
  std::vector<float> c_ref(static_cast<std::size_t>(m) * n, 0.0f);
  Buffer da = to_device(a), db = to_device(b), dc = to_device(c_ref);
  EXPECT_FALSE(backend_->allow_tf32());
  backend_->set_allow_tf32(true);
  EXPECT_TRUE(backend_->allow_tf32());
  backend_->gemm(Trans::no, Trans::no, m, n, k, 1.0f, da.data(), k, db.data(), n, 0.0f, dc.data(), n);
  host::gemm_loops(Trans::no, Trans::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
                   c_ref.data(), n);
  EXPECT_TRUE(all_close(to_host(dc), c_ref, 0.05, 1e-2));
  backend_->set_allow_tf32(false);
  EXPECT_FALSE(backend_->allow_tf32());
}

TEST_F(CudaTest, BiasActivationMatchesHost) {
  const int rows = 67, cols = 45;
  for (Activation act : {Activation::none, Activation::relu}) {
    SCOPED_TRACE(act == Activation::relu ? "relu" : "none");
    auto y_ref = random_floats(static_cast<std::size_t>(rows) * cols, 11);
    const auto bias = random_floats(cols, 12);
    ASSERT_TRUE(nonzero(y_ref, "y"));
    ASSERT_TRUE(nonzero(bias, "bias"));
    Buffer dy = to_device(y_ref), dbias = to_device(bias);
    backend_->bias_activation(dy.data(), dbias.data(), rows, cols, act);
    host::bias_activation(y_ref.data(), bias.data(), rows, cols, act);
    const auto y = to_host(dy);
    ASSERT_TRUE(nonzero(y, "result"));
    EXPECT_TRUE(all_close(y, y_ref, 1e-7, 1e-6));
  }
}

TEST_F(CudaTest, ReluBackwardMatchesHost) {
  const std::size_t n = 10007;
  auto dz_ref = random_floats(n, 21);
  const auto a = random_floats(n, 22);  // about half positive
  ASSERT_TRUE(nonzero(dz_ref, "dz"));
  ASSERT_TRUE(nonzero(a, "a"));
  Buffer ddz = to_device(dz_ref), da = to_device(a);
  backend_->relu_backward(ddz.data(), da.data(), n);
  host::relu_backward(dz_ref.data(), a.data(), n);
  const auto dz = to_host(ddz);
  ASSERT_TRUE(nonzero(dz, "result"));
  EXPECT_TRUE(all_close(dz, dz_ref, 0.0, 0.0));  // a select: exact
}

TEST_F(CudaTest, BiasGradMatchesHost) {
  const int rows = 129, cols = 70;
  const auto dz = random_floats(static_cast<std::size_t>(rows) * cols, 31);
  ASSERT_TRUE(nonzero(dz, "dz"));
  Buffer ddz = to_device(dz);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    float beta;
    std::vector<float> db0;
    const char* what;
  };
  const std::vector<Case> cases = {
      {0.5f, random_floats(cols, 32), "beta 0.5 accumulates"},
      {1.0f, random_floats(cols, 33), "beta 1 accumulates"},
      {0.0f, std::vector<float>(cols, nan), "beta 0 overwrites (NaN before)"},
  };
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.what);
    auto db_ref = cs.db0;
    Buffer ddb = to_device(cs.db0);
    backend_->bias_grad(ddb.data(), ddz.data(), rows, cols, cs.beta);
    host::bias_grad(db_ref.data(), dz.data(), rows, cols, cs.beta);
    const auto db = to_host(ddb);
    ASSERT_TRUE(nonzero(db, "result"));
    // The host sums in fp32, the kernel in double.
    EXPECT_TRUE(all_close(db, db_ref, 1e-4, 1e-5));
  }
}

TEST_F(CudaTest, LossMatchesHost) {
  const int rows = 33, cols = 77;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const float scale = 0.25f;
  const auto y = random_floats(n, 41);
  const auto target = random_floats(n, 42, 0.5f, 1.5f);
  ASSERT_TRUE(nonzero(y, "y"));
  ASSERT_TRUE(nonzero(target, "target"));
  Buffer dy_in = to_device(y), dtarget = to_device(target);
  for (Loss kind : {Loss::sum, Loss::mse}) {
    SCOPED_TRACE(kind == Loss::mse ? "mse" : "sum");
    std::vector<float> grad_ref(n, 0.0f), loss_ref(1, 0.0f);
    host::loss(kind, y.data(), target.data(), grad_ref.data(), loss_ref.data(), rows, cols, scale);
    Buffer dgrad = backend_->alloc(Category::temp, n);
    Buffer dloss = backend_->alloc(Category::temp, 1);
    backend_->loss(kind, dy_in.data(), dtarget.data(), dgrad.data(), dloss.data(), rows, cols, scale);
    const auto grad = to_host(dgrad);
    const auto value = to_host(dloss);
    ASSERT_TRUE(nonzero(grad, "dy"));
    ASSERT_TRUE(nonzero(value, "loss"));
    EXPECT_TRUE(all_close(value, loss_ref, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(grad, grad_ref, 0.0, 1e-7));

    // dy == nullptr: the value alone (forward).
    backend_->fill(dloss.data(), 0.0f, 1);
    backend_->loss(kind, dy_in.data(), dtarget.data(), nullptr, dloss.data(), rows, cols, scale);
    EXPECT_TRUE(all_close(to_host(dloss), loss_ref, 1e-6, 1e-6));

    // loss_out == nullptr: the gradient alone (backward); for sum, y may be null too.
    backend_->fill(dgrad.data(), 0.0f, n);
    const float* y_arg = kind == Loss::sum ? nullptr : dy_in.data();
    const float* t_arg = kind == Loss::sum ? nullptr : dtarget.data();
    backend_->loss(kind, y_arg, t_arg, dgrad.data(), nullptr, rows, cols, scale);
    EXPECT_TRUE(all_close(to_host(dgrad), grad_ref, 0.0, 1e-7));
  }
}

// Several tensors of different sizes (chunk edges, one empty, more tensors than one
// launch takes), each with its own step, 5 steps, against host::adamw.
TEST_F(CudaTest, FusedAdamWMatchesHostOverFiveSteps) {
  std::vector<std::size_t> sizes = {1, 3, 255, 256, 257, 4095, 4096, 4097, 12289, 70001, 0};
  while (sizes.size() < 45) sizes.push_back(17 + 131 * sizes.size());  // > 32: two launches
  struct Host {
    std::vector<float> p, m, v, g;
  };
  std::vector<Host> h(sizes.size());
  std::vector<Buffer> dp, dm, dv, dg;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    h[i].p = random_floats(sizes[i], 500 + static_cast<std::uint32_t>(i));
    h[i].m.assign(sizes[i], 0.0f);  // torch starts exp_avg and exp_avg_sq at zero
    h[i].v.assign(sizes[i], 0.0f);
    dp.push_back(to_device(h[i].p, Category::param));
    dm.push_back(to_device(h[i].m, Category::optim));
    dv.push_back(to_device(h[i].v, Category::optim));
    dg.push_back(backend_->alloc(Category::grad, sizes[i]));
  }
  const AdamWHyper hyper;
  for (int step = 1; step <= 5; ++step) {
    std::vector<AdamWTensor> dev, ref;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      h[i].g = random_floats(sizes[i], 1000 * step + static_cast<std::uint32_t>(i));
      if (sizes[i] > 0) backend_->upload(dg[i].data(), h[i].g.data(), sizes[i]);
      const int t = step + static_cast<int>(i % 3);  // per-tensor step counts
      dev.push_back({dp[i].data(), dg[i].data(), dm[i].data(), dv[i].data(), sizes[i], t});
      ref.push_back({h[i].p.data(), h[i].g.data(), h[i].m.data(), h[i].v.data(), sizes[i], t});
    }
    backend_->adamw(hyper, dev);
    host::adamw(hyper, ref);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    SCOPED_TRACE("tensor " + std::to_string(i) + " of " + std::to_string(sizes[i]) + " floats");
    const auto p = to_host(dp[i]), m = to_host(dm[i]), v = to_host(dv[i]);
    ASSERT_TRUE(nonzero(m, "exp_avg"));
    ASSERT_TRUE(nonzero(v, "exp_avg_sq"));
    EXPECT_TRUE(all_close(p, h[i].p, 1e-6, 1e-5)) << "param";
    EXPECT_TRUE(all_close(m, h[i].m, 1e-7, 1e-5)) << "exp_avg";
    EXPECT_TRUE(all_close(v, h[i].v, 1e-9, 1e-5)) << "exp_avg_sq";
  }
}

TEST_F(CudaTest, CopyFillScaleAddMatchHost) {
  const std::size_t n = 100003;
  const auto x = random_floats(n, 61), y = random_floats(n, 62);
  ASSERT_TRUE(nonzero(x, "x"));
  ASSERT_TRUE(nonzero(y, "y"));
  Buffer dx = to_device(x), dy = to_device(y);
  Buffer dz = backend_->alloc(Category::temp, n);

  backend_->copy(dz.data(), dx.data(), n);
  EXPECT_TRUE(all_close(to_host(dz), x, 0.0, 0.0)) << "copy";

  backend_->scale(dz.data(), -1.5f, n);
  std::vector<float> ref = x;
  for (float& r : ref) r *= -1.5f;
  EXPECT_TRUE(all_close(to_host(dz), ref, 0.0, 0.0)) << "scale";

  backend_->add(dz.data(), dy.data(), n);
  for (std::size_t i = 0; i < n; ++i) ref[i] += y[i];
  EXPECT_TRUE(all_close(to_host(dz), ref, 0.0, 0.0)) << "add";

  backend_->fill(dz.data(), 3.25f, n);
  EXPECT_TRUE(all_close(to_host(dz), std::vector<float>(n, 3.25f), 0.0, 0.0)) << "fill";
}

TEST_F(CudaTest, UploadDownloadRoundTrip) {
  const auto x = random_floats(4099, 71);
  ASSERT_TRUE(nonzero(x, "x"));
  Buffer d = to_device(x);
  EXPECT_TRUE(all_close(to_host(d), x, 0.0, 0.0));
}

}  // namespace
}  // namespace shardscope::testing
