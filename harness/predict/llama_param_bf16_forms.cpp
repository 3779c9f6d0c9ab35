// Llama's bf16 module in closed form (param_bf16_forms.hpp has the symbols and the account,
// in the order harness/model/llama_param_bf16.cpp allocates and frees).
#include <string>

#include "harness/predict/param_bf16_forms.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

struct Sizes {
  i64 N = 0, b = 0, p = 0, q2 = 0, c2 = 0, Q = 0, A = 0, V = 0;
  i64 R = 0;  // --checkpoint attention: the core's own save (A) not kept
  bool flash = true;
  i64 H() const { return flash ? 2 * q2 + 2 * c2 + A : 3 * Q + A + q2; }  // the attention's saves
  i64 sv() const { return 6 * b + 8 * N + H() - R + 4 * p; }                 // a layer's saves
  i64 final_held() const { return 3 * b + 4 * N; }  // the final norm's upcast, rstd and output
};

Sizes sizes(const TransformerShape& s, int batch, bool recompute_attention = false) {
  const TokenSizes z = token_sizes(s, batch);
  Sizes x;
  x.N = z.N;
  x.b = z.a / 2;
  x.p = z.F / 2;
  x.q2 = 2 * z.N * s.heads * s.head_dim;
  x.c2 = 2 * z.N * s.kv_heads * s.head_dim;
  x.Q = 2 * x.q2;
  x.A = z.A;
  x.V = s.vocab;
  x.flash = z.flash;
  x.R = recompute_attention ? x.A : 0;
  return x;
}

}  // namespace

SavedForm llama_saved_after_forward_param_bf16(const TransformerShape& shape, int batch,
                                               const CheckpointPolicy& checkpoint) {
  const Sizes z = sizes(shape, batch, checkpoint.attention());
  const int w = checkpoint.wrapped_of(shape.layers);  // each saves its bf16 input alone
  const i64 L = shape.layers - w;
  SavedForm f;
  f.bytes = 8 * z.N + L * z.sv() + w * z.b + z.final_held() + 4 * z.N * z.V + 8 * z.N + 4;
  f.tensors = 7 + (checkpoint.attention() ? 14 : 15) * static_cast<int>(L) + w;
  return f;
}

StepBlocks llama_param_bf16_blocks(const TransformerShape& shape, int batch, const CheckpointPolicy& checkpoint) {
  const Sizes z = sizes(shape, batch, checkpoint.attention());
  TokenSizes t = token_sizes(shape, batch);
  t.a = z.b;
  t.lambda = 2 * z.N * z.V;  // the bf16 dlogits the final block's backward starts from
  StepBlocks blocks(t);
  const i64 N = z.N, b = z.b, p = z.p, q2 = z.q2, c2 = z.c2, Q = z.Q, A = z.A, R = z.R, X = 16 * N;
  const i64 sv = z.sv(), fh = z.final_held(), H = z.H(), lam = 4 * N * z.V, lam2 = 2 * N * z.V;
  const bool flash = z.flash;
  const int L = shape.layers;
  blocks.base = 0;  // x0 is temp (or its checkpoint's save, counted at block 1)
  blocks.K = sv;
  blocks.final_held = fh;
  blocks.loss_weight = 4;
  blocks.checkpoint = checkpoint;
  blocks.stream_temp = true;

  // A layer's forward from T0 (temp, X and its input when not saved) and A0 (activation, its
  // saved input when wrapped): out_t / out_a its output's bytes by category.
  auto forward = [=](PeakWalk& walk, i64 T0, i64 A0, i64 out_t, i64 out_a, i64 pu, i64 gu, Phase phase,
                     const std::string& where, bool dy_live) {
    auto at = [&](i64 temp, i64 act) { walk.consider(temp, act, pu, gu, phase, where, dy_live); };
    const i64 n1 = A0 + 3 * b + 4 * N;  // the input norm's upcast, rstd and output
    if (flash) {
      at(T0, n1 + 2 * q2 + 2 * c2 + A);               // the output and lse (then freed under R)
    } else {
      at(T0 + q2 + 2 * c2, n1 + 3 * Q);               // bf16 q, k, v beside their fp32 copies
      at(T0 + Q, n1 + 3 * Q + A);                     // the head-major output beside the probabilities
      at(T0 + Q, n1 + 3 * Q + A - R + Q);             // (those freed under R) and its fp32 copy
      at(T0, n1 + 3 * Q + A - R + Q + q2);            // the bf16 output beside the fp32 copy
    }
    at(T0 + b + out_t, A0 + sv + out_a);              // the output beside x_mid
  };
  blocks.forward_block = [=](PeakWalk& walk, int j, i64 S, i64 pu, i64 gu, const std::string& where) {
    const bool wrapped = checkpoint.wraps(j - 1), next_wrapped = j < L && checkpoint.wraps(j);
    forward(walk, X + (wrapped ? 0 : b), S + (wrapped ? b : 0), next_wrapped ? 0 : b, next_wrapped ? b : 0, pu, gu,
            Phase::forward, where, false);
  };
  // A wrapped layer's re-run: its forward beside dy, S with its saved input; the output temp.
  blocks.recompute = [=](PeakWalk& walk, i64 S, i64 pu, i64 gu, const std::string& where) {
    forward(walk, X + b, S, b, 0, pu, gu, Phase::backward, where, true);
  };
  blocks.loss = [=](PeakWalk& walk, i64 S, i64 pu, i64 gu, const std::string& fwd, const std::string& bwd) {
    walk.consider(X + b + lam2, S + fh, pu, gu, Phase::forward, fwd);                 // the logits beside the input
    walk.consider(X + lam2 + 4 + lam, S + fh + lam + 4, pu, gu, Phase::forward, fwd);  // their fp32 upcast
    walk.consider(X + lam, S + fh + lam + 4, pu, gu, Phase::backward, bwd);           // fp32 dlogits
    walk.consider(X + lam + lam2, S + fh, pu, gu, Phase::backward, bwd);              // bf16 dlogits beside
  };
  blocks.backward = [=](PeakWalk& walk, i64 A4, i64 pu, i64 gu, const std::string& where) {
    auto at = [&](i64 temp, i64 act, bool dy_live = false) {
      walk.consider(temp, act, pu, gu, Phase::backward, where, dy_live);
    };
    at(X + b + p, A4, true);                 // d product
    at(X + b + 2 * p, A4 - p, true);         // d up
    at(X + 2 * b + 2 * p, A4 - 4 * p, true); // d y2
    at(X + 3 * b, A4 - 4 * p - b, true);     // d x_mid
    const i64 A5 = A4 - 4 * p - 3 * b - 4 * N;
    at(X + b + q2, A5);                      // d out
    const i64 A6 = A5 - H + R;               // the input norm's saves alone
    if (flash) {
      if (R > 0) {                           // the flash forward again: its output, its lse
        at(X + b + q2, A5 + q2);
        at(X + b + q2, A5 + q2 + A);
      }
      at(X + b + 2 * q2 + 2 * c2, A5 + (R > 0 ? q2 + A : 0));  // d q, k, v
    } else {
      const i64 Am = A5 - q2 + R;            // the bf16 output freed (under R the probabilities made again)
      at(X + b + q2 + Q, Am - R);            // d out's fp32 upcast
      at(X + b + 2 * Q, Am - R);             // d out head-major
      if (R > 0) at(X + b + Q, Am);          // the probabilities again (the upcast freed)
      at(X + b + Q + A, Am);                 // dP
      at(X + b + 2 * Q + A, Am);             // dv
      at(X + b + 2 * Q + A, Am - Q - A);     // dq
      at(X + b + 3 * Q + A, Am - Q - A);     // dk
      at(X + b + 3 * Q + q2 + 2 * c2, A6);   // dq, dk, dv bf16 beside them
    }
    at(X + 2 * b + q2 + 2 * c2, A6);         // d y1
    at(X + 3 * b, A6 - b);                   // dx
  };
  return blocks;
}

SavedForm param_bf16_saved_after_forward(const ModelConfig& model, const CheckpointPolicy& checkpoint) {
  return model.name == "gpt2" ? gpt2_saved_after_forward_param_bf16(model.transformer, model.batch, checkpoint)
                              : llama_saved_after_forward_param_bf16(model.transformer, model.batch, checkpoint);
}

StepBlocks param_bf16_blocks(const ModelConfig& model, const CheckpointPolicy& checkpoint) {
  return model.name == "gpt2" ? gpt2_param_bf16_blocks(model.transformer, model.batch, checkpoint)
                              : llama_param_bf16_blocks(model.transformer, model.batch, checkpoint);
}

}  // namespace shardscope
