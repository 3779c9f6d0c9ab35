#include "harness/run/records.hpp"

#include <algorithm>
#include <numeric>

#include "harness/predict/transformer_forms.hpp"

namespace shardscope {

CategoryFigures category_figures(const CategoryBytes& b) { return {b.total(), b.bytes}; }

CommFigures comm_figures(const CommLedger& ledger, int world, bool emulated) {
  CommFigures out;
  for (int k = 0; k < kCollKindCount; ++k) {
    const CollStats& s = ledger.by_kind[k];
    out[k] = {s.calls, s.bytes, s.ms, s.exposed_ms, std::nullopt};
    if (!emulated) out[k].busbw_gbps = busbw_gbps(s, static_cast<CollKind>(k), world);
  }
  return out;
}

PeakFigures peak_figures(const PeakRecord& peak, std::string where) {
  return {peak.total, std::string(phase_name(peak.phase)), std::move(where), category_figures(peak.by_category)};
}

RankPredicted rank_predicted(const Prediction& p) {
  return {p.resting.total(),
          category_figures(p.resting),
          p.peak_known,
          p.peak_total,
          category_figures(p.peak_by_category),
          std::string(phase_name(p.peak_phase)),
          p.peak_where,
          p.comm_total(),
          // Known with the peak: both come from the model's activation forms.
          p.peak_known ? std::optional<RankSaved>(RankSaved{p.saved_after_forward_bytes, p.saved_after_forward_tensors})
                       : std::nullopt,
          p.model_states};
}

namespace {

ModelRecord model_record_of_shape(const ModelConfig& m) {
  if (m.is_transformer()) {
    const TransformerShape& s = m.transformer;
    const std::int64_t params = transformer_params(s);
    ModelRecord r{s.layers,
                  s.hidden,
                  params,
                  transformer_param_tensors(s),
                  4 * params,
                  m.name == "gpt2" ? "gelu_tanh" : "swiglu",
                  "cross_entropy",
                  m.batch,
                  m.name,
                  TransformerShapeRecord{s.model_type, s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn, s.vocab, s.seq,
                                         s.positions, s.tied_embeddings, s.qkv_bias, s.out_bias,
                                         s.attention == AttentionMode::math ? "math" : "flash"},
                  std::nullopt};
    return r;
  }
  return {m.layers,
          m.width,
          m.params(),
          m.param_tensors(),
          4 * m.params(),
          m.activation == Activation::relu ? "relu" : "none",
          m.loss == Loss::mse ? "mse" : "sum",
          m.batch,
          std::nullopt,
          std::nullopt,
          std::nullopt};
}

}  // namespace

ModelRecord model_record(const ModelConfig& m) {
  ModelRecord r = model_record_of_shape(m);
  if (m.checkpoint.any()) r.checkpoint = m.checkpoint.text();
  return r;
}

int timed_steps(int steps) { return steps > 1 ? steps - 1 : 0; }

TimeSummary time_summary(const std::vector<double>& step_ms) {
  // The first step is warm-up: with one step nothing is timed (the record keeps the object).
  if (step_ms.size() < 2) return {};
  std::vector<double> t(step_ms.begin() + 1, step_ms.end());
  std::sort(t.begin(), t.end());
  const std::size_t n = t.size();
  const double median = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  return {median, t.front(), t.back()};
}

AllocatorFigures allocator_figures(Backend& backend) {
  const Tracker& tr = backend.tracker();
  AllocatorFigures a;
  a.rounded_resting_total = tr.rounded_current();
  a.rounded_peak_total = tr.rounded_peak();
  PoolStats pool;
  if (backend.pool_stats(&pool))
    a.pool = PoolFigures{pool.used_current, pool.used_high, pool.reserved_current, pool.reserved_high};
  const OutsidePool outside = backend.outside_pool();
  if (outside.bytes >= 0) a.outside_pool_bytes = outside.bytes;
  if (outside.source != nullptr) a.outside_pool_source = std::string(outside.source);
  OutsidePoolBreakdown breakdown;
  if (backend.outside_pool_breakdown(&breakdown)) a.outside_pool_parts = outside_pool_parts(breakdown, outside);
  return a;
}

OutsidePoolParts outside_pool_parts(const OutsidePoolBreakdown& b, const OutsidePool& outside) {
  const auto figures = [](const MeasuredPart& p) {
    return MeasuredPartFigures{p.bytes >= 0 ? std::optional<std::int64_t>(p.bytes) : std::nullopt, p.source};
  };
  OutsidePoolParts parts;
  parts.cuda_context = figures(b.cuda_context);
  parts.cublas = figures(b.cublas);
  for (const NcclMemory& c : b.nccl) {
    const MeasuredPartFigures init = figures(c.init), total = figures(c.total);
    parts.nccl.push_back({c.communicator, c.ranks, init.bytes, total.bytes, total.source});
  }
  // The rest of the figure: known when every part in it is. The context is in it only when
  // the figure is NVML's (cudaMemGetInfo's delta starts after the context was made).
  if (outside.bytes < 0 || outside.source == nullptr) return parts;
  const bool with_context = std::string(outside.source) != "cuda_mem_get_info_delta";
  std::int64_t rest = outside.bytes;
  if (with_context && b.cuda_context.bytes < 0) return parts;
  if (with_context) rest -= b.cuda_context.bytes;
  if (b.cublas.bytes < 0) return parts;
  rest -= b.cublas.bytes;
  for (const NcclMemory& c : b.nccl) {
    if (c.total.bytes < 0) return parts;
    rest -= c.total.bytes;
  }
  // Below zero when a part gave back some of what it took: then the rest is not known.
  if (rest >= 0) parts.other = rest;
  return parts;
}

namespace {

// ns -> ms; the division is correctly rounded, so the JSON prints the exact decimal.
double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

}  // namespace

TimelineRecord timeline_record(const Timeline& t) {
  TimelineRecord r;
  r.coalesced = t.coalesced();
  r.merged_events = t.merged_events();
  r.events = t.events();
  r.sample_limit = static_cast<std::int64_t>(t.sample_limit());
  r.memory.push_back({0.0, t.start_state().bytes});
  for (const TimelineSample& s : t.samples()) r.memory.push_back({ms(s.t_ns), s.bytes.bytes});
  for (const PhaseMark& m : t.marks()) r.marks.push_back({ms(m.t_ns), std::string(phase_name(m.phase)), describe_place(m.place)});
  r.dropped_marks = t.dropped_marks();
  // Spans end in completion order; a reader wants them by start, parents first.
  const std::vector<TimelineSpan>& spans = t.spans();
  std::vector<std::size_t> order(spans.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (spans[a].start_ns != spans[b].start_ns) return spans[a].start_ns < spans[b].start_ns;
    return spans[a].depth < spans[b].depth;
  });
  for (std::size_t i : order) {
    const TimelineSpan& s = spans[i];
    TimelineSpanRecord span{s.name, ms(s.start_ns), ms(s.end_ns), s.depth, std::nullopt, std::nullopt};
    if (s.bytes >= 0) span.bytes = s.bytes;
    if (!s.track.empty()) span.track = s.track;
    r.spans.push_back(std::move(span));
  }
  r.dropped_spans = t.dropped_spans();
  return r;
}

GroupCommRecord group_record(const std::string& name, Communicator& comm, std::vector<int> members,
                             std::int64_t predicted_bytes) {
  GroupCommRecord g;
  g.axis = name;
  g.world = comm.world();
  g.rank = comm.rank();
  g.members = std::move(members);
  g.comm = comm_figures(comm.ledger(), comm.world(), comm.emulated());
  g.comm_bytes = comm.ledger().total_bytes();
  g.predicted_comm_bytes = predicted_bytes;
  return g;
}

GroupCommRecord group_record(MeshComms& mesh, MeshAxis axis, int world_rank, std::int64_t predicted_bytes) {
  return group_record(std::string(kMeshAxisNames[static_cast<int>(axis)]), mesh.group(axis),
                      mesh.shape.group(world_rank, axis), predicted_bytes);
}

CommLedger summed_ledger(const std::vector<Communicator*>& groups) {
  CommLedger sum;
  for (const Communicator* c : groups)
    for (int k = 0; k < kCollKindCount; ++k) {
      const CollStats& s = c->ledger().by_kind[k];
      sum.by_kind[k].calls += s.calls;
      sum.by_kind[k].bytes += s.bytes;
      sum.by_kind[k].ms += s.ms;
      sum.by_kind[k].exposed_ms += s.exposed_ms;
    }
  return sum;
}

CommLedger summed_ledger(MeshComms& mesh) {
  std::vector<Communicator*> groups;
  for (int a = 0; a < kMeshAxes; ++a) groups.push_back(mesh.groups[a].get());
  return summed_ledger(groups);
}

}  // namespace shardscope
