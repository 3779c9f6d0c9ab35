#include "harness/run/pipeline_predict.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <tuple>
#include <vector>

namespace shardscope {

namespace {

// A tensor as the saved-tensor instrument tells them apart. Layer outputs are named by
// their layer: a received activation is the sender's output (one copy per stage).
enum class Kind : std::uint64_t { input, output, weight, target };
// (kind, micro-batch, layer) packed in one word: M <= 10,000 and L <= 100,000 (the CLI's
// caps) fit 24 bits each.
using TensorId = std::uint64_t;
TensorId tensor_id(Kind kind, int microbatch, int layer) {
  return static_cast<std::uint64_t>(kind) << 48 | static_cast<std::uint64_t>(microbatch) << 24 |
         static_cast<std::uint64_t>(layer);
}

class Walk {
 public:
  void save(const TensorId& id, std::int64_t bytes) {
    Entry& e = live_[id];
    if (e.refs++ == 0) {
      e.bytes = bytes;
      live_bytes_ += bytes;
    }
    ++live_count_;
    ++p_.total_tensors;
    p_.peak_live_tensors = std::max(p_.peak_live_tensors, live_count_);
    p_.peak_live_bytes = std::max(p_.peak_live_bytes, live_bytes_);
  }
  void release(const TensorId& id) {
    Entry& e = live_[id];
    --live_count_;
    if (--e.refs == 0) {
      live_bytes_ -= e.bytes;
      live_.erase(id);
    }
  }
  SavedPrediction& result() { return p_; }

 private:
  struct Entry {
    int refs = 0;
    std::int64_t bytes = 0;
  };
  std::unordered_map<TensorId, Entry> live_;
  int live_count_ = 0;
  std::int64_t live_bytes_ = 0;
  SavedPrediction p_;
};

}  // namespace

SavedPrediction predict_saved(const ModelConfig& model, const PipelineLayout& layout, int stage) {
  const Schedule& s = layout.schedule;
  const int M = layout.microbatches(), V = layout.vstages();
  // What F(m, chunk) saved, by the action that releases it.
  struct Saves {
    std::vector<TensorId> at_b, at_w;
  };
  std::vector<Saves> saves(static_cast<std::size_t>(layout.chunks()) * M);
  Walk walk;
  bool backward_seen = false;
  for (const Action& a : s.actions.at(stage)) {
    Saves& mine = saves[static_cast<std::size_t>(a.chunk) * M + a.microbatch];
    const int m = a.microbatch;
    if (a.kind == ActionKind::F) {
      const int k = vstage_of(s, stage, a.chunk);
      const int first = layout.first_layer(k), last = layout.end_layer(k);
      const std::int64_t bytes = model.activation_bytes(layout.rows[m]);
      auto save = [&](const TensorId& id, std::int64_t b, bool until_w) {
        walk.save(id, b);
        (until_w && s.split_backward ? mine.at_w : mine.at_b).push_back(id);
      };
      for (int i = first; i < last; ++i) {
        const TensorId in = i == 0 ? tensor_id(Kind::input, m, 0) : tensor_id(Kind::output, m, i - 1);
        save(in, bytes, /*until_w*/ true);  // Linear: its input
        if (i != 0) save(tensor_id(Kind::weight, m, i), 0, false);  // and its weight, input requiring grad
        if (model.activation == Activation::relu) save(tensor_id(Kind::output, m, i), bytes, false);  // ReLU: output
      }
      if (k == V - 1 && model.loss == Loss::mse) {  // MSE: input and target
        save(tensor_id(Kind::output, m, last - 1), bytes, false);
        save(tensor_id(Kind::target, m, 0), bytes, false);
      }
    } else {
      if (!backward_seen) walk.result().before_first_backward = walk.result().total_tensors;
      backward_seen = true;
      for (const TensorId& id : a.kind == ActionKind::B ? mine.at_b : mine.at_w) walk.release(id);
      (a.kind == ActionKind::B ? mine.at_b : mine.at_w).clear();
    }
  }
  if (!backward_seen) walk.result().before_first_backward = walk.result().total_tensors;
  return walk.result();
}

CategoryBytes predict_resting(const ModelConfig& model, const PipelineLayout& layout, int stage) {
  std::int64_t layers = 0;
  for (int c = 0; c < layout.chunks(); ++c) {
    const int k = vstage_of(layout.schedule, stage, c);
    layers += layout.end_layer(k) - layout.first_layer(k);
  }
  CategoryBytes b;
  b[Category::param] = 4 * layers * model.layer_elems();
  b[Category::grad] = 4 * layers * model.layer_elems();
  // exp_avg + exp_avg_sq, and a 4-byte step for each of 2 tensors a layer
  b[Category::optim] = 8 * layers * model.layer_elems() + 8 * layers;
  return b;
}

std::int64_t predict_resting_total(const ModelConfig& model, const PipelineLayout& layout, int stage) {
  return predict_resting(model, layout, stage).total();
}

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

std::int64_t predict_p2p_bytes(const ModelConfig& model, const PipelineLayout& layout, int stage) {
  const Schedule& s = layout.schedule;
  const int V = layout.vstages();
  std::int64_t neighbours = 0;
  for (int c = 0; c < layout.chunks(); ++c) {
    const int v = vstage_of(s, stage, c);
    // A neighbour on this same stage (one stage, several chunks) is handed over in place.
    neighbours += (v > 0 && stage_of_vstage(s, v - 1) != stage ? 1 : 0) +
                  (v < V - 1 && stage_of_vstage(s, v + 1) != stage ? 1 : 0);
  }
  return neighbours * model.activation_bytes(model.batch);
}

std::int64_t predict_peak_total(const ModelConfig& model, const PipelineLayout& layout, int stage) {
  return predict_peak(model, layout, stage, lower(layout.schedule).at(stage)).total();
}

CategoryBytes predict_peak(const ModelConfig& model, const PipelineLayout& layout, int stage,
                           const StageProgram& program) {
  const Schedule& s = layout.schedule;
  const int M = layout.microbatches(), V = layout.vstages();
  Bytes t(predict_resting(model, layout, stage));
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
