// The CUDA backend's transformer kernels (kernels/cuda_transformer.hpp, gemm_batched by
// cuBLAS) against the CPU backend's, on seeded random data; shapes not multiples of the
// kernels' block sizes, rows wider than a block's 256 threads, beta both 0 (outputs start
// as NaN: overwritten) and not. Skips without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_vs_cpu.hpp"
#include "kernels/host_ops.hpp"

namespace shardscope::testing {
namespace {

constexpr double kAtol = 1e-6;
constexpr double kRtol = 1e-5;

// Batched GEMM against host::gemm_loops batch by batch: every transpose pair, padded
// leading dimensions, strides beyond the matrices, and B shared (stride 0).
TEST_F(CudaVsCpuTest, GemmBatchedMatchesHostLoops) {
  const int m = 19, n = 13, k = 27, batch = 3;
  const float alpha = 0.8f, beta = 0.4f;
  std::uint32_t seed = 500;
  for (bool shared_b : {false, true}) {
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        SCOPED_TRACE(std::string("ta=") + (ta == Trans::yes ? "T" : "N") +
                     " tb=" + (tb == Trans::yes ? "T" : "N") + (shared_b ? " shared B" : ""));
        const int a_rows = ta == Trans::no ? m : k, a_cols = ta == Trans::no ? k : m;
        const int b_rows = tb == Trans::no ? k : n, b_cols = tb == Trans::no ? n : k;
        const int lda = a_cols + 2, ldb = b_cols + 1, ldc = n + 3;
        const std::int64_t sa = static_cast<std::int64_t>(a_rows) * lda + 5;
        const std::int64_t sb = shared_b ? 0 : static_cast<std::int64_t>(b_rows) * ldb + 7;
        const std::int64_t sc = static_cast<std::int64_t>(m) * ldc + 2;
        const auto a = random_floats(static_cast<std::size_t>(sa * batch), seed++);
        const auto b = random_floats(static_cast<std::size_t>(shared_b ? b_rows * ldb : sb * batch), seed++);
        auto c_ref = random_floats(static_cast<std::size_t>(sc * batch), seed++);
        Buffer da = to_device(a), db = to_device(b), dc = to_device(c_ref);
        backend_->gemm_batched(ta, tb, m, n, k, alpha, da.data(), lda, sa, db.data(), ldb, sb, beta,
                               dc.data(), ldc, sc, batch);
        for (int i = 0; i < batch; ++i) {
          host::gemm_loops(ta, tb, m, n, k, alpha, a.data() + i * sa, lda, b.data() + i * sb, ldb,
                           beta, c_ref.data() + i * sc, ldc);
        }
        const auto c = to_host(dc);
        ASSERT_TRUE(nonzero(c, "C result"));
        EXPECT_TRUE(all_close(c, c_ref, 1e-5, kRtol));
      }
    }
  }
}

TEST_F(CudaVsCpuTest, EmbeddingForwardAndBackwardMatchCpu) {
  const int vocab = 37, dim = 45, rows = 60;
  std::vector<std::int64_t> id_values(rows);
  for (int i = 0; i < rows; ++i) id_values[i] = (i * 7 + i / 3) % vocab;  // repeats; some ids unused
  Twin ids = twin(id_floats_of(id_values));
  Twin table = twin(random_floats(static_cast<std::size_t>(vocab) * dim, 601));
  Twin out = twin(nans(static_cast<std::size_t>(rows) * dim));
  on_both([&](Backend& be, Side s) { be.embedding_forward(out.at(s), ids_of(ids.at(s)), table.at(s), rows, dim); });
  EXPECT_TRUE(same(out, 0.0, 0.0, "embedding out"));  // a gather: exact

  Twin dy = twin(random_floats(static_cast<std::size_t>(rows) * dim, 602));
  for (float beta : {0.0f, 0.5f}) {
    SCOPED_TRACE("beta " + std::to_string(beta));
    const std::size_t n = static_cast<std::size_t>(vocab) * dim;
    Twin dtable = twin(beta == 0.0f ? nans(n) : random_floats(n, 603));
    on_both([&](Backend& be, Side s) {
      be.embedding_backward(dtable.at(s), ids_of(ids.at(s)), dy.at(s), rows, dim, vocab, beta);
    });
    EXPECT_TRUE(same(dtable, kAtol, kRtol, "dtable"));
  }
}

TEST_F(CudaVsCpuTest, PositionsMatchCpu) {
  const int batch = 3, seq = 21, dim = 40;
  const std::size_t n = static_cast<std::size_t>(batch) * seq * dim;
  Twin x = twin(random_floats(n, 611));
  Twin pos = twin(random_floats(static_cast<std::size_t>(seq) * dim, 612));
  on_both([&](Backend& be, Side s) { be.add_positions(x.at(s), pos.at(s), batch, seq, dim); });
  EXPECT_TRUE(same(x, 0.0, 0.0, "x + pos"));  // one addition each: exact

  Twin dy = twin(random_floats(n, 613));
  for (float beta : {0.0f, 0.5f}) {
    SCOPED_TRACE("beta " + std::to_string(beta));
    const std::size_t np = static_cast<std::size_t>(seq) * dim;
    Twin dpos = twin(beta == 0.0f ? nans(np) : random_floats(np, 614));
    on_both([&](Backend& be, Side s) { be.positions_backward(dpos.at(s), dy.at(s), batch, seq, dim, beta); });
    EXPECT_TRUE(same(dpos, kAtol, kRtol, "dpos"));
  }
}

// dim 200 (fewer than a block's threads, not a multiple of 32) and 1030 (several per thread).
TEST_F(CudaVsCpuTest, LayerNormMatchesCpu) {
  const int rows = 33;
  std::uint32_t seed = 620;
  for (int dim : {200, 1030}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const std::size_t n = static_cast<std::size_t>(rows) * dim;
    Twin x = twin(random_floats(n, seed++, -2.0f, 3.0f));
    Twin gamma = twin(random_floats(dim, seed++, 0.5f, 1.5f));
    Twin bias = twin(random_floats(dim, seed++));
    Twin y = twin(nans(n)), mean = twin(nans(rows)), rstd = twin(nans(rows));
    on_both([&](Backend& be, Side s) {
      be.layer_norm_forward(y.at(s), mean.at(s), rstd.at(s), x.at(s), gamma.at(s), bias.at(s), rows, dim, 1e-5f);
    });
    EXPECT_TRUE(same(y, 1e-5, kRtol, "y"));
    EXPECT_TRUE(same(mean, 1e-6, kRtol, "mean"));
    EXPECT_TRUE(same(rstd, 0.0, kRtol, "rstd"));

    Twin dy = twin(random_floats(n, seed++));
    for (float beta : {0.0f, 0.7f}) {
      SCOPED_TRACE("beta " + std::to_string(beta));
      Twin dx = twin(nans(n));
      Twin dgamma = twin(beta == 0.0f ? nans(dim) : random_floats(dim, seed++));
      Twin dbias = twin(beta == 0.0f ? nans(dim) : random_floats(dim, seed++));
      on_both([&](Backend& be, Side s) {
        be.layer_norm_backward(dx.at(s), dgamma.at(s), dbias.at(s), dy.at(s), x.at(s), mean.at(s), rstd.at(s),
                               gamma.at(s), rows, dim, beta);
      });
      EXPECT_TRUE(same(dx, 1e-5, kRtol, "dx"));
      EXPECT_TRUE(same(dgamma, 1e-5, kRtol, "dgamma"));
      EXPECT_TRUE(same(dbias, 1e-5, kRtol, "dbias"));
    }
  }
}

TEST_F(CudaVsCpuTest, RmsNormMatchesCpu) {
  const int rows = 29;
  std::uint32_t seed = 640;
  for (int dim : {200, 1030}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const std::size_t n = static_cast<std::size_t>(rows) * dim;
    Twin x = twin(random_floats(n, seed++, -2.0f, 3.0f));
    Twin gamma = twin(random_floats(dim, seed++, 0.5f, 1.5f));
    Twin y = twin(nans(n)), rstd = twin(nans(rows));
    on_both([&](Backend& be, Side s) { be.rms_norm_forward(y.at(s), rstd.at(s), x.at(s), gamma.at(s), rows, dim, 1e-6f); });
    EXPECT_TRUE(same(y, 1e-5, kRtol, "y"));
    EXPECT_TRUE(same(rstd, 0.0, kRtol, "rstd"));

    Twin dy = twin(random_floats(n, seed++));
    for (float beta : {0.0f, 0.7f}) {
      SCOPED_TRACE("beta " + std::to_string(beta));
      Twin dx = twin(nans(n));
      Twin dgamma = twin(beta == 0.0f ? nans(dim) : random_floats(dim, seed++));
      on_both([&](Backend& be, Side s) {
        be.rms_norm_backward(dx.at(s), dgamma.at(s), dy.at(s), x.at(s), rstd.at(s), gamma.at(s), rows, dim, beta);
      });
      EXPECT_TRUE(same(dx, 1e-5, kRtol, "dx"));
      EXPECT_TRUE(same(dgamma, 1e-5, kRtol, "dgamma"));
    }
  }
}

// Forward into a fresh tensor, backward in place on dy (dx == dy), and mul in place.
TEST_F(CudaVsCpuTest, ElementwiseMatchCpu) {
  const std::size_t n = 5003;
  Twin x = twin(random_floats(n, 660, -6.0f, 6.0f));
  Twin y = twin(nans(n));
  Twin g = twin(random_floats(n, 661));
  on_both([&](Backend& be, Side s) { be.gelu_tanh_forward(y.at(s), x.at(s), n); });
  EXPECT_TRUE(same(y, kAtol, kRtol, "gelu"));
  on_both([&](Backend& be, Side s) { be.gelu_tanh_backward(g.at(s), g.at(s), x.at(s), n); });
  EXPECT_TRUE(same(g, kAtol, kRtol, "gelu backward"));

  Twin z = twin(nans(n));
  Twin h = twin(random_floats(n, 662));
  on_both([&](Backend& be, Side s) { be.silu_forward(z.at(s), x.at(s), n); });
  EXPECT_TRUE(same(z, kAtol, kRtol, "silu"));
  on_both([&](Backend& be, Side s) { be.silu_backward(h.at(s), h.at(s), x.at(s), n); });
  EXPECT_TRUE(same(h, kAtol, kRtol, "silu backward"));

  on_both([&](Backend& be, Side s) { be.mul(z.at(s), z.at(s), y.at(s), n); });
  EXPECT_TRUE(same(z, kAtol, kRtol, "mul"));
}

// Two heads of a fused row (ld wider than heads * head_dim), forward then inverse; the
// inverse of the forward gives back x.
TEST_F(CudaVsCpuTest, RopeMatchesCpuAndInverts) {
  const int batch = 2, seq = 13, heads = 3, head_dim = 16, ld = 3 * heads * head_dim + 4;
  const std::size_t n = static_cast<std::size_t>(batch) * seq * ld;
  const auto x0 = random_floats(n, 670);
  Twin x = twin(x0);
  on_both([&](Backend& be, Side s) { be.rope(x.at(s), ld, batch, seq, heads, head_dim, 10000.0f, false); });
  EXPECT_TRUE(same(x, kAtol, kRtol, "rope"));
  EXPECT_FALSE(all_close(cuda_values(x), x0, 1e-6, 0.0));  // it did rotate
  on_both([&](Backend& be, Side s) { be.rope(x.at(s), ld, batch, seq, heads, head_dim, 10000.0f, true); });
  EXPECT_TRUE(same(x, kAtol, kRtol, "rope inverse"));
  EXPECT_TRUE(all_close(cuda_values(x), x0, 1e-5, 1e-5));
}

// seq 37 and 300 (a row longer than the block): the probabilities, then the backward.
TEST_F(CudaVsCpuTest, SoftmaxMatchesCpu) {
  const int count = 5;
  std::uint32_t seed = 680;
  for (int seq : {37, 300}) {
    SCOPED_TRACE("seq " + std::to_string(seq));
    const std::size_t n = static_cast<std::size_t>(count) * seq * seq;
    Twin p = twin(random_floats(n, seed++, -4.0f, 4.0f));
    on_both([&](Backend& be, Side s) { be.causal_softmax_forward(p.at(s), count, seq, 0.35f); });
    EXPECT_TRUE(same(p, kAtol, kRtol, "p"));
    Twin dp = twin(random_floats(n, seed++));
    on_both([&](Backend& be, Side s) {
      be.softmax_backward(dp.at(s), p.at(s), static_cast<std::int64_t>(count) * seq, seq);
    });
    EXPECT_TRUE(same(dp, kAtol, kRtol, "dp"));
  }
}

TEST_F(CudaVsCpuTest, PermuteHeadsMatchesCpu) {
  const int batch = 2, seq = 11, heads = 3, head_dim = 8, ld = 3 * heads * head_dim;
  const std::size_t tokens = static_cast<std::size_t>(batch) * seq * ld;
  const std::size_t packed = static_cast<std::size_t>(batch) * seq * heads * head_dim;
  Twin src = twin(random_floats(tokens, 690));
  Twin hm = twin(nans(packed));
  on_both([&](Backend& be, Side s) { be.permute_heads(hm.at(s), src.at(s) + heads * head_dim, ld, batch, seq, heads, head_dim, true); });
  EXPECT_TRUE(same(hm, 0.0, 0.0, "head-major"));
  Twin back = twin(nans(tokens));  // columns outside the heads stay NaN on both
  on_both([&](Backend& be, Side s) { be.permute_heads(back.at(s), hm.at(s), ld, batch, seq, heads, head_dim, false); });
  const auto got = cuda_values(back), ref = cpu_values(back);
  EXPECT_TRUE(all_close(got, ref, 0.0, 0.0));
}

// cols 50 and 1000 (wider than the block); nll and the gradient in place on the log-probs.
TEST_F(CudaVsCpuTest, CrossEntropyMatchesCpu) {
  const int rows = 23;
  std::uint32_t seed = 700;
  for (int cols : {50, 1000}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    const std::size_t n = static_cast<std::size_t>(rows) * cols;
    std::vector<std::int64_t> target_values(rows);
    for (int i = 0; i < rows; ++i) target_values[i] = (i * 13 + 5) % cols;
    Twin targets = twin(id_floats_of(target_values));
    Twin logits = twin(random_floats(n, seed++, -5.0f, 5.0f));
    Twin logprobs = twin(nans(n));
    on_both([&](Backend& be, Side s) { be.log_softmax_forward(logprobs.at(s), logits.at(s), rows, cols); });
    EXPECT_TRUE(same(logprobs, 1e-5, kRtol, "logprobs"));
    Twin loss = twin(nans(1));
    on_both([&](Backend& be, Side s) {
      be.nll_loss_forward(loss.at(s), logprobs.at(s), ids_of(targets.at(s)), rows, cols, 0.5f);
    });
    EXPECT_TRUE(same(loss, 0.0, kRtol, "loss"));
    on_both([&](Backend& be, Side s) {
      be.cross_entropy_backward(logprobs.at(s), logprobs.at(s), ids_of(targets.at(s)), rows, cols, 0.5f);
    });
    EXPECT_TRUE(same(logprobs, 1e-7, kRtol, "dlogits"));
  }
}

// The vocabulary-parallel pieces (tensor parallelism): a rank's rows [first, first +
// count) of the table and columns of the logits, ids and targets inside and outside them.
TEST_F(CudaVsCpuTest, VocabularyParallelPiecesMatchCpu) {
  const int vocab = 40, count = 10, dim = 45, rows = 60;
  const std::int64_t first = 20;
  std::vector<std::int64_t> id_values(rows);
  for (int i = 0; i < rows; ++i) id_values[i] = (i * 7 + i / 3) % vocab;
  Twin ids = twin(id_floats_of(id_values));
  Twin table = twin(random_floats(static_cast<std::size_t>(count) * dim, 801));
  Twin out = twin(nans(static_cast<std::size_t>(rows) * dim));
  on_both([&](Backend& be, Side s) {
    be.vocab_embedding_forward(out.at(s), ids_of(ids.at(s)), table.at(s), rows, dim, first, count);
  });
  EXPECT_TRUE(same(out, 0.0, 0.0, "vocab embedding out"));
  Twin dy = twin(random_floats(static_cast<std::size_t>(rows) * dim, 802));
  for (float beta : {0.0f, 1.0f}) {
    const std::size_t n = static_cast<std::size_t>(count) * dim;
    Twin dtable = twin(beta == 0.0f ? nans(n) : random_floats(n, 803));
    on_both([&](Backend& be, Side s) {
      be.vocab_embedding_backward(dtable.at(s), ids_of(ids.at(s)), dy.at(s), rows, dim, first, count, beta);
    });
    EXPECT_TRUE(same(dtable, kAtol, kRtol, "vocab dtable"));
  }
  for (int cols : {50, 1000}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    const std::size_t n = static_cast<std::size_t>(rows) * cols;
    std::vector<std::int64_t> target_values(rows);
    for (int i = 0; i < rows; ++i) target_values[i] = (i * 13 + 5) % (3 * cols);  // a third in [cols, 2 cols)
    Twin targets = twin(id_floats_of(target_values));
    Twin logits = twin(random_floats(n, 810, -5.0f, 5.0f));
    Twin mx = twin(nans(rows)), sum = twin(nans(rows)), logprobs = twin(nans(n)), loss = twin(nans(1));
    on_both([&](Backend& be, Side s) { be.row_max(mx.at(s), logits.at(s), rows, cols); });
    EXPECT_TRUE(same(mx, 0.0, 0.0, "row max"));
    on_both([&](Backend& be, Side s) { be.row_sum_exp(sum.at(s), logits.at(s), mx.at(s), rows, cols); });
    EXPECT_TRUE(same(sum, 1e-6, kRtol, "row sum exp"));
    on_both([&](Backend& be, Side s) {
      be.log_softmax_given(logprobs.at(s), logits.at(s), mx.at(s), sum.at(s), rows, cols);
    });
    EXPECT_TRUE(same(logprobs, 1e-5, kRtol, "logprobs"));
    on_both([&](Backend& be, Side s) {
      be.vocab_nll_loss_forward(loss.at(s), logprobs.at(s), ids_of(targets.at(s)), rows, cols, cols, 0.5f);
    });
    EXPECT_TRUE(same(loss, 0.0, kRtol, "loss"));
    on_both([&](Backend& be, Side s) {
      be.vocab_cross_entropy_backward(logprobs.at(s), logprobs.at(s), ids_of(targets.at(s)), rows, cols, cols, 0.5f);
    });
    EXPECT_TRUE(same(logprobs, 1e-7, kRtol, "dlogits"));
  }
}

}  // namespace
}  // namespace shardscope::testing
