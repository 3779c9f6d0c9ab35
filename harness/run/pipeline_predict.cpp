#include "harness/run/pipeline_predict.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

namespace shardscope {

namespace {

// Mlp::output_saved: whether layer `layer`'s output is kept for backward in a segment
// ending at `last`.
bool output_saved(const ModelConfig& m, int layer, int last) {
  if (m.activation == Activation::relu) return true;
  if (layer + 1 < last) return true;
  return layer + 1 == m.layers && m.loss == Loss::mse;
}

// A buffer the walk holds: its bytes and category (0 bytes: empty). Moving one (dy into
// a zero-bubble dz, dx into a neighbour's grad_in) keeps its category.
struct Held {
  std::int64_t bytes = 0;
  Category category = Category::temp;
};

// Running bytes per category, and what they were at the first instant of the maximum
// total, as the tracker keeps its peak.
class Bytes {
 public:
  explicit Bytes(const CategoryBytes& start) : cur_(start), peak_(start) {}
  void alloc(Held& slot, std::int64_t b, Category c) {  // slot must be empty
    slot = {b, c};
    cur_[c] += b;
    if (cur_.total() > peak_.total()) peak_ = cur_;
  }
  void free(Held& slot) {
    cur_[slot.category] -= slot.bytes;
    slot.bytes = 0;
  }
  const CategoryBytes& peak() const { return peak_; }

 private:
  CategoryBytes cur_, peak_;
};

}  // namespace

CategoryBytes predict_peak(const ModelConfig& model, const PipelineLayout& layout, int stage,
                           const StageProgram& program, const CategoryBytes& resting) {
  const Schedule& s = layout.schedule;
  const int M = layout.microbatches(), V = layout.vstages();
  Bytes t(resting);
  const bool holds_loss = stage_of_vstage(s, V - 1) == stage;
  Held x, target;
  if (stage_of_vstage(s, 0) == stage) t.alloc(x, model.activation_bytes(model.batch), Category::temp);
  if (holds_loss && model.loss == Loss::mse) t.alloc(target, model.activation_bytes(model.batch), Category::temp);

  // PipelineStage::Slot and its Tape (0 bytes: empty): a received activation is saved by
  // the first Linear (activation), a received gradient is a staging buffer (comm).
  struct Slot {
    Held act_in, grad_in;
    std::vector<Held> outputs, dz;
  };
  std::vector<Slot> slots(static_cast<std::size_t>(layout.chunks()) * M);
  auto slot = [&](int m, int chunk) -> Slot& { return slots[static_cast<std::size_t>(chunk) * M + m]; };
  std::map<std::tuple<int, int, int>, Held> pending;  // (payload, m, vstage) -> owned buffer
  auto key = [](Payload p, int m, int k) { return std::make_tuple(p == Payload::activation ? 0 : 1, m, k); };

  for (const ProgramStep& ps : program) {
    // run_group: receives allocated in order, then the sent buffers released.
    std::vector<std::tuple<int, int, int>> sent;
    for (const P2p& op : ps.comm) {
      if (op.is_send) {
        sent.push_back(key(op.payload, op.microbatch, op.vstage));
        continue;
      }
      const std::int64_t b = model.activation_bytes(layout.rows[op.microbatch]);
      if (op.payload == Payload::activation)
        t.alloc(slot(op.microbatch, chunk_of_vstage(s, op.vstage + 1)).act_in, b, Category::activation);
      else
        t.alloc(slot(op.microbatch, chunk_of_vstage(s, op.vstage - 1)).grad_in, b, Category::comm);
    }
    for (const auto& k : sent) {
      auto it = pending.find(k);
      if (it == pending.end()) continue;
      t.free(it->second);
      pending.erase(it);
    }
    if (!ps.action) continue;

    // run_action
    const Action& a = *ps.action;
    const int k = vstage_of(s, stage, a.chunk);
    const int first = layout.first_layer(k), last = layout.end_layer(k), n = last - first;
    const std::int64_t b = model.activation_bytes(layout.rows[a.microbatch]);
    Slot& sl = slot(a.microbatch, a.chunk);
    switch (a.kind) {
      case ActionKind::F: {
        sl.outputs.assign(static_cast<std::size_t>(n), Held{});
        for (int j = 0; j < n; ++j)
          t.alloc(sl.outputs[j], b, output_saved(model, first + j, last) ? Category::activation : Category::temp);
        if (k == V - 1) {
          Held scalar;
          t.alloc(scalar, 4, Category::temp);  // the loss value
          if (!output_saved(model, last - 1, last)) t.free(sl.outputs.back());
          t.free(scalar);
        } else if (stage_of_vstage(s, k + 1) != stage) {
          Held owned;
          if (!output_saved(model, last - 1, last)) std::swap(owned, sl.outputs.back());
          pending[key(Payload::activation, a.microbatch, k)] = owned;
        }
        break;
      }
      case ActionKind::B: {
        Held dy = sl.grad_in;  // moved
        sl.grad_in = Held{};
        if (k == V - 1) {  // the tape has the loss: dy = loss_gradient
          Held g;
          t.alloc(g, b, Category::temp);
          t.free(dy);
          dy = g;
        }
        const bool input_requires_grad = k > 0;
        Held dx_out;
        if (s.split_backward) {
          sl.dz.assign(static_cast<std::size_t>(n), Held{});
          for (int j = n - 1; j >= 0; --j) {
            if (j == n - 1) t.free(sl.outputs[j]);
            Held dx;
            if (j > 0 || input_requires_grad) t.alloc(dx, b, Category::temp);
            sl.dz[j] = dy;
            dy = dx;
          }
          dx_out = dy;
        } else {
          for (int j = n - 1; j >= 0; --j) {
            Held dx;
            if (j > 0 || input_requires_grad) t.alloc(dx, b, Category::temp);
            t.free(dy);
            t.free(sl.outputs[j]);
            dy = dx;
          }
          dx_out = dy;
          t.free(sl.act_in);
          for (Held& o : sl.outputs) t.free(o);
          sl.outputs.clear();
        }
        if (k > 0) {
          if (stage_of_vstage(s, k - 1) == stage)
            slot(a.microbatch, chunk_of_vstage(s, k - 1)).grad_in = dx_out;  // moved, slot was empty
          else
            pending[key(Payload::gradient, a.microbatch, k)] = dx_out;
        }
        break;
      }
      case ActionKind::W: {
        for (int j = n - 1; j >= 0; --j) {
          t.free(sl.dz[j]);
          if (j > 0) t.free(sl.outputs[j - 1]);
        }
        t.free(sl.act_in);
        for (Held& o : sl.outputs) t.free(o);
        for (Held& d : sl.dz) t.free(d);
        sl.outputs.clear();
        sl.dz.clear();
        break;
      }
    }
  }
  // Then slots, x and target are freed and AdamW updates in place: nothing allocated.
  return t.peak();
}

}  // namespace shardscope
