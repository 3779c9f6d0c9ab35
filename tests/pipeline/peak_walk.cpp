#include "pipeline/peak_walk.hpp"

#include <map>
#include <tuple>
#include <vector>

namespace shardscope {
namespace {

using i64 = std::int64_t;

// Running bytes per category, and what they were at the first instant of the maximum
// total, as the tracker keeps its peak.
class Bytes {
 public:
  explicit Bytes(const CategoryBytes& start) : cur_(start), peak_(start) {}
  void add(Category c, i64 b) {
    cur_[c] += b;
    if (b > 0 && cur_.total() > peak_.total()) peak_ = cur_;
  }
  const CategoryBytes& peak() const { return peak_; }

 private:
  CategoryBytes cur_, peak_;
};

// A buffer: its bytes (0: none) and category; moving one keeps its category.
struct Held {
  i64 bytes = 0;
  Category category = Category::temp;
};

// What one (micro-batch, chunk) holds between its actions.
struct Slot {
  Held act_in, grad_in;  // received activation (activation), received gradient (comm)
  i64 saved_outputs = 0;  // outputs its layers saved, activation
  i64 last_output = 0;    // its unsaved last output, kept in the tape (temp)
  i64 last_saved = 0;     // the part of saved_outputs that is the last layer's output
  Held dz_first;          // split backward: dy kept for W
  i64 dz_rest = 0;        // split backward: the other n-1 dz, temp
  bool live = false;      // F done, its last backward action not yet
};

}  // namespace

CategoryBytes walk_peak(const ModelConfig& model, const PipelineLayout& layout, int stage,
                        const StageProgram& program, const CategoryBytes& resting) {
  const Schedule& s = layout.schedule;
  const int M = layout.microbatches(), V = layout.vstages();
  const bool relu = model.activation == Activation::relu, mse = model.loss == Loss::mse;
  Bytes t(resting);
  if (stage_of_vstage(s, 0) == stage) t.add(Category::temp, model.activation_bytes(model.batch));
  if (stage_of_vstage(s, V - 1) == stage && mse) t.add(Category::temp, model.activation_bytes(model.batch));
  auto free = [&](Held& h) {
    t.add(h.category, -h.bytes);
    h.bytes = 0;
  };

  std::vector<Slot> slots(static_cast<std::size_t>(layout.chunks()) * M);
  auto slot = [&](int m, int chunk) -> Slot& { return slots[static_cast<std::size_t>(chunk) * M + m]; };
  std::map<std::tuple<int, int, int>, Held> pending;  // (payload, m, vstage) -> owned buffer
  auto key = [](Payload p, int m, int k) { return std::make_tuple(p == Payload::activation ? 0 : 1, m, k); };

  for (const ProgramStep& ps : program) {
    std::vector<std::tuple<int, int, int>> sent;
    for (const P2p& op : ps.comm) {
      if (op.is_send) {
        sent.push_back(key(op.payload, op.microbatch, op.vstage));
        continue;
      }
      const i64 b = model.activation_bytes(layout.rows[op.microbatch]);
      Held& into = op.payload == Payload::activation ? slot(op.microbatch, chunk_of_vstage(s, op.vstage + 1)).act_in
                                                     : slot(op.microbatch, chunk_of_vstage(s, op.vstage - 1)).grad_in;
      into = {b, op.payload == Payload::activation ? Category::activation : Category::comm};
      t.add(into.category, b);
    }
    for (const auto& k : sent) {
      auto it = pending.find(k);
      if (it == pending.end()) continue;
      free(it->second);
      pending.erase(it);
    }
    if (!ps.action) continue;

    const Action& a = *ps.action;
    const int k = vstage_of(s, stage, a.chunk);
    const i64 n = layout.end_layer(k) - layout.first_layer(k);
    const i64 b = model.activation_bytes(layout.rows[a.microbatch]);
    const bool last_saved = relu || (k == V - 1 && mse);
    Slot& sl = slot(a.microbatch, a.chunk);
    switch (a.kind) {
      case ActionKind::F: {
        sl.live = true;
        // (n-1) outputs the next Linear saves, and the last: saved, or temp
        t.add(Category::activation, (n - 1) * b);
        sl.saved_outputs = (n - 1) * b;
        if (last_saved) {
          t.add(Category::activation, b);
          sl.saved_outputs += b;
          sl.last_saved = b;
        } else {
          t.add(Category::temp, b);
          sl.last_output = b;
        }
        if (k == V - 1) {
          t.add(Category::temp, 4);  // the loss value
          if (!last_saved) t.add(Category::temp, -b), sl.last_output = 0;
          t.add(Category::temp, -4);
        } else if (stage_of_vstage(s, k + 1) != stage && !last_saved) {
          pending[key(Payload::activation, a.microbatch, k)] = {b, Category::temp};  // moved out of the tape
          sl.last_output = 0;
        }
        break;
      }
      case ActionKind::B: {
        Held dy = sl.grad_in;
        sl.grad_in = {};
        if (k == V - 1) {  // the tape has the loss: dy = its gradient
          t.add(Category::temp, b);
          dy = {b, Category::temp};
        }
        const bool input_grad = k > 0;
        Held dx_out;
        if (s.split_backward) {
          // the last output goes (unless the next chunk here, its W to come, reads it:
          // zbv's V bottom hands it on), then the input gradients, kept as dz but the
          // returned one
          Slot* reader = nullptr;
          if (k + 1 < V && stage_of_vstage(s, k + 1) == stage && slot(a.microbatch, chunk_of_vstage(s, k + 1)).live)
            reader = &slot(a.microbatch, chunk_of_vstage(s, k + 1));
          if (reader)
            reader->act_in = sl.last_saved ? Held{sl.last_saved, Category::activation} : Held{sl.last_output, Category::temp};
          else
            t.add(Category::activation, -sl.last_saved), t.add(Category::temp, -sl.last_output);
          sl.saved_outputs -= sl.last_saved;
          sl.last_saved = sl.last_output = 0;
          t.add(Category::temp, (n - 1 + (input_grad ? 1 : 0)) * b);
          sl.dz_first = dy;
          sl.dz_rest = (n - 1) * b;
          if (input_grad) dx_out = {b, Category::temp};
        } else {
          if (n > 1 || input_grad) t.add(Category::temp, b);  // the first dx: the maximum
          // then each layer frees dy and its output; the last dx is returned
          t.add(Category::temp, -(n > 1 || input_grad ? b : 0) + (input_grad ? b : 0));
          free(dy);
          t.add(Category::activation, -sl.saved_outputs);
          t.add(Category::temp, -sl.last_output);
          free(sl.act_in);
          sl = Slot{};
          if (input_grad) dx_out = {b, Category::temp};
        }
        if (input_grad) {
          if (stage_of_vstage(s, k - 1) == stage)
            slot(a.microbatch, chunk_of_vstage(s, k - 1)).grad_in = dx_out;  // moved, slot was empty
          else
            pending[key(Payload::gradient, a.microbatch, k)] = dx_out;
        }
        break;
      }
      case ActionKind::W: {
        free(sl.dz_first);
        t.add(Category::temp, -sl.dz_rest);
        t.add(Category::activation, -sl.saved_outputs);
        t.add(Category::temp, -sl.last_output);
        free(sl.act_in);
        sl = Slot{};
        break;
      }
    }
  }
  return t.peak();
}

}  // namespace shardscope
