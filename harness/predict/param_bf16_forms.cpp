// GPT-2's bf16 module under FSDP1's MixedPrecision in closed form (param_bf16_forms.hpp has
// the symbols and the account, in the order harness/model/gpt2_param_bf16.cpp allocates).
#include "harness/predict/param_bf16_forms.hpp"

#include <string>

#include "harness/strategies/partition.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

struct Bf16Sizes {
  i64 N = 0, T = 0, b = 0, p = 0, lambda = 0, A = 0;
  bool flash = true;
};

Bf16Sizes bf16_sizes(const TransformerShape& s, int batch) {
  const TokenSizes z = token_sizes(s, batch);
  return {z.N, z.T, z.a / 2, z.F / 2, z.lambda / 2, z.A, z.flash};
}

// A block's activations beside its input, its output included; under --checkpoint attention
// (flash and math alike) the core's own saves are not kept: qkv and y stay, 8N + 8b + 2p.
i64 block_k(const Bf16Sizes& z, bool recompute_attention = false) {
  if (recompute_attention) return 8 * z.N + 8 * z.b + 2 * z.p;
  return 8 * z.N + (z.flash ? 8 : 11) * z.b + z.A + 2 * z.p;
}

}  // namespace

SavedForm gpt2_saved_after_forward_param_bf16(const TransformerShape& shape, int batch,
                                              const CheckpointPolicy& checkpoint) {
  const Bf16Sizes z = bf16_sizes(shape, batch);
  const int w = checkpoint.wrapped_of(shape.layers);  // each saves its input alone
  const i64 L = shape.layers - w;
  // A block saves its input and K less its output.
  const bool ra = checkpoint.attention();
  const i64 block = block_k(z, ra);
  const int storages = ra ? 12 : z.flash ? 13 : 15;
  SavedForm f;
  f.bytes = 8 * z.N + 8 * z.T + L * block + w * z.b + z.b + 4 * z.N + z.b + z.lambda + 8 * z.N + 2;
  f.tensors = 9 + static_cast<int>(L) * storages + w;
  return f;
}

StepBlocks gpt2_param_bf16_blocks(const TransformerShape& shape, int batch, const CheckpointPolicy& checkpoint) {
  const Bf16Sizes z = bf16_sizes(shape, batch);
  TokenSizes t = token_sizes(shape, batch);
  t.a = z.b;
  t.lambda = z.lambda;
  StepBlocks blocks(t);
  const i64 N = z.N, b = z.b, p = z.p, A = z.A, X = 16 * N;
  blocks.base = 8 * z.T + b;
  const bool ra = checkpoint.attention();
  blocks.K = block_k(z, ra);
  blocks.final_held = 4 * N + b;
  blocks.loss_weight = 2;
  blocks.checkpoint = checkpoint;
  const bool flash = z.flash;
  const i64 K = blocks.K;
  blocks.recompute = [=](PeakWalk& walk, i64 S, i64 pu, i64 gu, const std::string& where) {
    walk.consider(X + 2 * b, S + K - b, pu, gu, Phase::backward, where, true);
  };
  // --checkpoint attention, math: the core's forward under its checkpoint, from S (ln_1's
  // statistics and output 4N + b and the saved qkv 3b beside it): the fp32 head-major q, k, v
  // (temp 6b), the probabilities A beside the head-major output (temp 2b), the fp32 output
  // (2b) once they are freed, then the bf16 y (b) with the head-major copies still held.
  if (ra && !flash)
    blocks.forward_attention = [=](PeakWalk& walk, i64 S, i64 pu, i64 gu, const std::string& where) {
      const i64 Q = S + 4 * N + 4 * b;
      walk.consider(X + 8 * b, Q + A, pu, gu, Phase::forward, where);
      walk.consider(X + 8 * b, Q + 2 * b, pu, gu, Phase::forward, where);
      walk.consider(X + 6 * b, Q + 3 * b, pu, gu, Phase::forward, where);
    };
  blocks.backward = [=](PeakWalk& walk, i64 A4, i64 pu, i64 gu, const std::string& where) {
    auto at = [&](i64 temp, i64 act, bool dy_live = false) {
      walk.consider(temp, act, pu, gu, Phase::backward, where, dy_live);
    };
    at(X + b + p, A4, true);
    at(X + 2 * b + p, A4 - 2 * p, true);
    at(X + 3 * b, A4 - 2 * p - b, true);
    const i64 R = A4 - 2 * p - 2 * b - 4 * N;  // S + 4N + b + H
    at(X + 2 * b, R);
    if (ra) {
      // --checkpoint attention: H = 4b (qkv and y); y freed once c_proj is done, then the
      // core re-run on the saved qkv.
      const i64 low = R - 4 * b;  // S + 4N + b
      if (flash) {
        at(X + 2 * b, R - b + A);      // the re-run's log-sum-exp
        at(X + 2 * b, R + A);          // and its bf16 output
        at(X + 5 * b, R + A);          // d qkv
      } else {
        const i64 Rq = R - b;          // qkv held
        at(X + 4 * b, Rq);             // d y's fp32 upcast
        at(X + 3 * b, Rq + 6 * b);     // q, k, v again, fp32 head-major (d y freed)
        at(X + 5 * b, Rq + 6 * b);     // d out head-major
        at(X + 3 * b, Rq + 6 * b + A); // the probabilities again (d out token-major freed)
        at(X + 3 * b + A, Rq + 6 * b + A);  // dP
        at(X + 5 * b + A, Rq + 6 * b + A);  // dv
        at(X + 5 * b + A, Rq + 4 * b);      // dq (v and the probabilities released)
        at(X + 7 * b + A, Rq + 4 * b);      // dk
        at(X + 10 * b, low);                // d qkv (q, k and the checkpoint's qkv released)
      }
      at(X + 5 * b, low);
      at(X + 3 * b, low - b);
      return;
    }
    const i64 low = R - (flash ? 4 * b : 7 * b) - A;  // S + 4N + b: ln_1's statistics and output
    if (flash) {
      at(X + 5 * b, R);
    } else {
      at(X + 4 * b, R - b);
      at(X + 5 * b, R - b);
      at(X + 3 * b + A, R - b);
      at(X + 5 * b + A, R - b);
      at(X + 5 * b + A, low + 4 * b);
      at(X + 7 * b + A, low + 4 * b);
      at(X + 10 * b, low);
    }
    at(X + 5 * b, low);
    at(X + 3 * b, low - b);
  };
  return blocks;
}

void make_units_bf16(StepUnits& g, const RunConfig& cfg, int world) {
  if (!cfg.model.param_bf16 || g.bytes.empty()) return;
  const std::vector<Unit> units = fsdp_units(cfg.model, cfg.layers_per_unit, world, cfg.mesh.tp);
  g.bf16 = true;
  g.cast_bytes.clear();
  g.reduce_bytes.clear();
  for (std::size_t u = 0; u < units.size(); ++u) {
    g.bytes[u] = 2 * units[u].padded;
    g.grad_bytes[u] = 2 * units[u].padded;
    g.cast_bytes.push_back(2 * units[u].shard);
    g.reduce_bytes.push_back(4 * units[u].padded);
  }
}

}  // namespace shardscope
