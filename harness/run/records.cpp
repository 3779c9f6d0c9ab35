#include "harness/run/records.hpp"

#include <algorithm>

namespace shardscope {

nlohmann::json category_json(const CategoryBytes& b) {
  nlohmann::json j;
  j["total"] = b.total();
  for (int c = 0; c < kCategoryCount; ++c) j[std::string(kCategoryNames[c])] = b.bytes[c];
  return j;
}

nlohmann::json comm_json(const CommLedger& ledger, int world) {
  nlohmann::json j = nlohmann::json::object();
  for (int k = 0; k < kCollKindCount; ++k) {
    const CollStats& s = ledger.by_kind[k];
    j[std::string(kCollKindNames[k])] = {{"calls", s.calls},
                                         {"bytes", s.bytes},
                                         {"ms", s.ms},
                                         {"busbw_gbps", busbw_gbps(s, static_cast<CollKind>(k), world)}};
  }
  return j;
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

int timed_steps(const std::vector<double>& step_ms) {
  return step_ms.size() > 1 ? static_cast<int>(step_ms.size()) - 1 : 0;
}

nlohmann::json step_ms_json(const std::vector<double>& step_ms) {
  if (step_ms.size() < 2) return nullptr;  // the first step is warm-up
  std::vector<double> t(step_ms.begin() + 1, step_ms.end());
  std::sort(t.begin(), t.end());
  const std::size_t n = t.size();
  const double median = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  return {{"median", median}, {"min", t.front()}};
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

}  // namespace shardscope
