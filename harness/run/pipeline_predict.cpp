#include "harness/run/pipeline_predict.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

namespace shardscope {

namespace {

// A tensor as the saved-tensor instrument tells them apart. Layer outputs are named by
// their layer: a received activation is the sender's output (one copy per stage).
enum class Kind { input, output, weight, target };
using TensorId = std::tuple<Kind, int, int>;  // (kind, micro-batch, layer)

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
  std::map<TensorId, Entry> live_;
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
        const TensorId in = i == 0 ? TensorId{Kind::input, m, 0} : TensorId{Kind::output, m, i - 1};
        save(in, bytes, /*until_w*/ true);  // Linear: its input
        if (i != 0) save({Kind::weight, m, i}, 0, false);  // and its weight, input requiring grad
        if (model.activation == Activation::relu) save({Kind::output, m, i}, bytes, false);  // ReLU: output
      }
      if (k == V - 1 && model.loss == Loss::mse) {  // MSE: input and target
        save({Kind::output, m, last - 1}, bytes, false);
        save({Kind::target, m, 0}, bytes, false);
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

std::int64_t predict_resting_total(const ModelConfig& model, const PipelineLayout& layout, int stage) {
  std::int64_t layers = 0;
  for (int c = 0; c < layout.chunks(); ++c) {
    const int k = vstage_of(layout.schedule, stage, c);
    layers += layout.end_layer(k) - layout.first_layer(k);
  }
  // params + grads + exp_avg + exp_avg_sq, and a 4-byte step for each of 2 tensors a layer
  return 16 * layers * model.layer_elems() + 8 * layers;
}

}  // namespace shardscope
