// Hand-made shardscope/1 documents for the report printers (HTML, CSV): data-parallel
// runs whose ranks carry a timeline in the format the tracker writes, pipeline runs
// with action spans or with only action_ms, and a skipped configuration.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardscope::testing {

using nlohmann::json;

inline const std::array<const char*, 8> kReportCategories = {
    "param", "param_unsharded", "grad", "grad_unsharded", "optim", "activation", "comm", "temp"};

inline json category_bytes(const std::array<std::int64_t, 8>& b, bool with_total) {
  json j = json::object();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    j[kReportCategories[i]] = b[i];
    total += b[i];
  }
  if (with_total) j["total"] = total;
  return j;
}

// A step of L layers: forward gathers units (zero2 keeps them, zero3 frees each after
// use), backward frees them again. Memory rows: [t, 8 categories]; marks and spans too.
inline json dp_timeline(bool keep_gathered, int layers, std::int64_t unit_bytes) {
  std::array<std::int64_t, 8> b = {4000, 0, 4000, 0, 8000, 0, 0, 0};
  json memory = json::array(), marks = json::array(), spans = json::array();
  double t = 0.0;
  auto row = [&] {
    json r = json::array({t});
    for (std::int64_t v : b) r.push_back(v);
    memory.push_back(r);
    t += 0.25;
  };
  row();
  spans.push_back({{"name", "step"}, {"start_ms", 0.0}, {"end_ms", 4.0 * layers * 0.25 + 0.5}, {"depth", 0}});
  marks.push_back({t, "forward", "layer 0"});
  for (int i = 0; i < layers; ++i) {
    b[1] += unit_bytes;  // gather unit i
    b[5] += 512;         // its output
    row();
    if (!keep_gathered) {
      b[1] -= unit_bytes;
      row();
    }
  }
  marks.push_back({t, "backward", "layer 3"});
  for (int i = layers - 1; i >= 0; --i) {
    if (!keep_gathered) {
      b[1] += unit_bytes;
      row();
    }
    b[3] += unit_bytes;
    row();
    b[1] -= unit_bytes;
    b[3] -= unit_bytes;
    b[5] -= 512;
    row();
  }
  marks.push_back({t, "optimizer", "-"});
  spans.push_back({{"name", "all_gather 2048 B"}, {"start_ms", 0.3}, {"end_ms", 0.4}, {"depth", 2}, {"bytes", 2048}});
  return {{"unit", "ms since the run started"}, {"coalesced", false}, {"merged_events", 0},
          {"categories", kReportCategories}, {"memory", memory}, {"marks", marks}, {"spans", spans}};
}

inline json dp_rank_record(int rank, bool keep_gathered, bool with_timeline) {
  const std::array<std::int64_t, 8> resting = {4000, 0, 4000, 0, 8000, 0, 0, 0};
  const std::array<std::int64_t, 8> peak = {4000, keep_gathered ? 8192 : 4096, 4000, 2048, 8000, 2048, 0, 0};
  std::int64_t resting_total = 0, peak_total = 0;
  for (std::size_t i = 0; i < 8; ++i) resting_total += resting[i], peak_total += peak[i];
  json r = {{"rank", rank},
            {"resting", category_bytes(resting, true)},
            {"peak", {{"total", peak_total}, {"phase", "backward"}, {"where", "unit 3"},
                      {"by_category", category_bytes(peak, true)}}},
            {"predicted", {{"resting_total", resting_total}, {"peak_total", peak_total}, {"comm_bytes", 6144},
                           {"resting", category_bytes(resting, true)},
                           {"peak_by_category", category_bytes(peak, true)}}},
            {"comm", {{"all_gather", {{"calls", 4}, {"bytes", 4096}, {"ms", 0.5}, {"busbw_gbps", 1.0}}},
                      {"reduce_scatter", {{"calls", 4}, {"bytes", 2048}, {"ms", 0.25}, {"busbw_gbps", 1.0}}}}},
            {"comm_bytes", 6144},
            {"step_ms", {{"median", 1.25}, {"min", 1.0}}},
            {"comm_ms", {{"median", 0.75}, {"min", 0.5}}}};
  if (with_timeline) r["timeline"] = dp_timeline(keep_gathered, 4, 2048);
  return r;
}

inline json dp_run_record(const std::string& strategy, const json& layers_per_unit, int world, bool with_timeline) {
  json ranks = json::array();
  for (int r = 0; r < world; ++r) ranks.push_back(dp_rank_record(r, strategy != "zero3", with_timeline));
  return {{"kind", "data_parallel"}, {"strategy", strategy}, {"world", world}, {"units", 4},
          {"layers_per_unit", layers_per_unit}, {"prefetch", 1}, {"ddp_bucket", "view"}, {"steps", 3},
          {"timed_steps", 2},
          {"model", {{"layers", 4}, {"width", 16}, {"params", 1088}, {"param_tensors", 8}, {"param_bytes", 4352},
                     {"activation", "none"}, {"loss", "sum"}, {"batch", 8}}},
          {"ranks", ranks}};
}

// gpipe at S = 2, M = 2 (stage lists F0 F1 B0 B1), every action 1 ms. With spans, each
// stage's last step is [10, 16] ms on its clock, laid out as the replay would.
inline json pipeline_run_record(bool with_spans) {
  json stages = json::array();
  for (int s = 0; s < 2; ++s) {
    json actions = json::array();
    for (const char* kind : {"F", "B"})
      for (int m = 0; m < 2; ++m) actions.push_back({{"action", kind}, {"microbatch", m}, {"chunk", 0}, {"ms", 1.0}});
    json st = {{"stage", s}, {"rank", s}, {"world", 2}, {"layers", {s, s}},
               {"saved", {{"peak_live_tensors", 4 + 6 * s}, {"peak_live_bytes", 2048 + 1024 * s},
                          {"total_tensors", 4 + 6 * s}, {"before_first_backward", 4 + 6 * s}}},
               {"predicted", {{"peak_live_tensors", 4 + 6 * s}, {"peak_live_bytes", 2048 + 1024 * s},
                              {"resting_total", 16904}, {"peak_total", 19464}, {"comm_bytes", 2048}}},
               {"resting", {{"total", 16904}}}, {"peak", {{"total", 19464}}}, {"comm_bytes", 2048}, {"busy_ms", 4.0},
               {"step_ms", {{"median", 6.0}, {"min", 6.0}}}, {"bubble_fraction", 1.0 / 3.0},
               {"bubble_fraction_replayed", 1.0 / 3.0}, {"bubble_fraction_theory", 1.0 / 3.0},
               {"action_ms", actions}};
    if (with_spans) {
      // Replayed starts: stage 0 F0 0, F1 1, B0 4, B1 5; stage 1 F0 1, F1 2, B0 3, B1 4.
      const std::array<std::array<double, 4>, 2> starts = {{{0, 1, 4, 5}, {1, 2, 3, 4}}};
      const std::array<const char*, 4> names = {"F(m=0)", "F(m=1)", "B(m=0)", "B(m=1)"};
      json spans = json::array();
      spans.push_back({{"name", "step"}, {"start_ms", 1.0}, {"end_ms", 7.5}, {"depth", 0}});  // an earlier step
      spans.push_back({{"name", "F(m=0)"}, {"start_ms", 1.0}, {"end_ms", 2.0}, {"depth", 1}});
      spans.push_back({{"name", "step"}, {"start_ms", 10.0}, {"end_ms", 16.0}, {"depth", 0}});
      json memory = json::array({json::array({0.0, 0, 0, 0, 0, 0, 0, 0, 0})});
      std::int64_t act = 0;
      for (std::size_t i = 0; i < 4; ++i) {
        const double t0 = 10.0 + starts[s][i];
        spans.push_back({{"name", names[i]}, {"start_ms", t0}, {"end_ms", t0 + 1.0}, {"depth", 1}});
        spans.push_back({{"name", "p2p"}, {"start_ms", t0 + 0.9}, {"end_ms", t0 + 1.0}, {"depth", 2}, {"bytes", 512}});
        act += names[i][0] == 'F' ? 1024 : -1024;
        memory.push_back({t0 + 1.0, 4224, 0, 4224, 0, 8456, act, 0, 0});
      }
      st["timeline"] = {{"unit", "ms since the run started"}, {"coalesced", false}, {"merged_events", 0},
                        {"categories", kReportCategories}, {"memory", memory}, {"spans", spans}};
    }
    stages.push_back(st);
  }
  return {{"kind", "pipeline"}, {"schedule", "gpipe"}, {"world", 2}, {"microbatches", 2}, {"chunks", 1},
          {"steps", 2}, {"timed_steps", 1},
          {"model", {{"layers", 2}, {"width", 32}, {"params", 2112}, {"param_tensors", 4}, {"param_bytes", 8448},
                     {"activation", "relu"}, {"loss", "mse"}, {"batch", 8}}},
          {"stages", stages}};
}

// W = 2: zero2 and zero3 one layer per unit with timelines, zero3 root unit without;
// W = 4: ddp without; a gpipe run with spans, one with only action_ms; one skipped.
inline json report_document() {
  json runs = json::array({dp_run_record("zero2", 1, 2, true), dp_run_record("zero3", 1, 2, true),
                           dp_run_record("zero3", "all", 2, false), dp_run_record("ddp", "all", 4, false),
                           pipeline_run_record(true), pipeline_run_record(false)});
  runs.push_back({{"kind", "pipeline"}, {"skipped", true}, {"schedule", "gpipe"}, {"world", 4},
                  {"microbatches", 2}, {"reason", "--layers 2 cannot fill 4 stages"}});
  return {{"schema", "shardscope/1"}, {"version", "0.1.0"}, {"backend", "cpu"}, {"comm", "mpi"},
          {"emulated", false},
          {"provenance", {{"git", "abc"}, {"command", "shardscope sweep"}, {"host", "h"}, {"cpu", "c"}}},
          {"runs", runs},
          {"sweep", {{"jobs", 7}, {"skipped", 1}, {"complete", true}}}};
}

}  // namespace shardscope::testing
