#include "harness/run/records.hpp"

#include <algorithm>
#include <numeric>

namespace shardscope {

nlohmann::json category_json(const CategoryBytes& b) {
  nlohmann::json j;
  j["total"] = b.total();
  for (int c = 0; c < kCategoryCount; ++c) j[std::string(kCategoryNames[c])] = b.bytes[c];
  return j;
}

nlohmann::json comm_json(const CommLedger& ledger, int world, bool emulated) {
  nlohmann::json j = nlohmann::json::object();
  for (int k = 0; k < kCollKindCount; ++k) {
    const CollStats& s = ledger.by_kind[k];
    // An emulated call moves nothing: its time is not a transfer's, so no bandwidth.
    j[std::string(kCollKindNames[k])] = {
        {"calls", s.calls},
        {"bytes", s.bytes},
        {"ms", s.ms},
        {"busbw_gbps", emulated ? nlohmann::json(nullptr)
                                : nlohmann::json(busbw_gbps(s, static_cast<CollKind>(k), world))}};
  }
  return j;
}

nlohmann::json prediction_json(const Prediction& p) {
  return {{"resting_total", p.resting.total()},
          {"resting", category_json(p.resting)},
          {"peak_total", p.peak_total},
          {"peak_by_category", category_json(p.peak_by_category)},
          {"peak_phase", std::string(phase_name(p.peak_phase))},
          {"peak_where", p.peak_where},
          {"comm_bytes", p.comm_total()}};
}

nlohmann::json model_json(const ModelConfig& m) {
  return {{"layers", m.layers},
          {"width", m.width},
          {"params", m.params()},
          {"param_tensors", m.param_tensors()},
          {"param_bytes", 4 * m.params()},
          {"activation", m.activation == Activation::relu ? "relu" : "none"},
          {"loss", m.loss == Loss::mse ? "mse" : "sum"},
          {"batch", m.batch}};
}

nlohmann::json step_ms_json(const std::vector<double>& step_ms) {
  // The first step is warm-up: with one step nothing is timed (DESIGN §7 keeps the object).
  if (step_ms.size() < 2) return {{"median", nullptr}, {"min", nullptr}, {"max", nullptr}};
  std::vector<double> t(step_ms.begin() + 1, step_ms.end());
  std::sort(t.begin(), t.end());
  const std::size_t n = t.size();
  const double median = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  return {{"median", median}, {"min", t.front()}, {"max", t.back()}};
}

void add_allocator_figures(Backend& backend, nlohmann::json& r) {
  const Tracker& tr = backend.tracker();
  r["rounded"] = {{"resting_total", tr.rounded_current()}, {"peak_total", tr.rounded_peak()}};
  PoolStats pool;
  if (backend.pool_stats(&pool)) {
    r["pool"] = {{"used_current", pool.used_current},
                 {"used_high", pool.used_high},
                 {"reserved_current", pool.reserved_current},
                 {"reserved_high", pool.reserved_high}};
  } else {
    r["pool"] = nullptr;
  }
  const std::int64_t outside = backend.outside_pool_bytes();
  r["outside_pool_bytes"] = outside >= 0 ? nlohmann::json(outside) : nlohmann::json(nullptr);
}

namespace {

// ns -> ms; the division is correctly rounded, so the JSON prints the exact decimal.
double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

nlohmann::json memory_row(std::int64_t t_ns, const CategoryBytes& b) {
  nlohmann::json row = nlohmann::json::array();
  row.push_back(ms(t_ns));
  for (std::int64_t v : b.bytes) row.push_back(v);
  return row;
}

}  // namespace

nlohmann::json timeline_json(const Timeline& t) {
  nlohmann::json j;
  j["unit"] = "ms since the run started";
  j["coalesced"] = t.coalesced();
  j["merged_events"] = t.merged_events();
  j["events"] = t.events();
  j["sample_limit"] = t.sample_limit();
  j["categories"] = kCategoryNames;
  nlohmann::json memory = nlohmann::json::array();
  nlohmann::json marks = nlohmann::json::array();
  memory.push_back(memory_row(0, t.start_state()));
  for (const TimelineSample& s : t.samples()) memory.push_back(memory_row(s.t_ns, s.bytes));
  for (const PhaseMark& m : t.marks())
    marks.push_back({ms(m.t_ns), std::string(phase_name(m.phase)), describe_place(m.place)});
  j["memory"] = std::move(memory);
  j["marks"] = std::move(marks);
  j["dropped_marks"] = t.dropped_marks();
  // Spans end in completion order; a reader wants them by start, parents first.
  const std::vector<TimelineSpan>& spans = t.spans();
  std::vector<std::size_t> order(spans.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (spans[a].start_ns != spans[b].start_ns) return spans[a].start_ns < spans[b].start_ns;
    return spans[a].depth < spans[b].depth;
  });
  nlohmann::json list = nlohmann::json::array();
  for (std::size_t i : order) {
    const TimelineSpan& s = spans[i];
    nlohmann::json span = {{"name", s.name}, {"start_ms", ms(s.start_ns)}, {"end_ms", ms(s.end_ns)},
                           {"depth", s.depth}};
    if (s.bytes >= 0) span["bytes"] = s.bytes;
    list.push_back(std::move(span));
  }
  j["spans"] = std::move(list);
  j["dropped_spans"] = t.dropped_spans();
  return j;
}

}  // namespace shardscope
