// Checks a Chrome trace-event JSON (the "JSON Object Format") the way Perfetto and
// chrome://tracing need it: shared by the in-process trace tests and the CLI tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardscope::testing {

// Everything wrong with `trace`, one line each; empty when it is valid:
// - {"traceEvents": [...], "displayTimeUnit": "ms"};
// - every event has ph (one letter), ts (a number), pid and tid (integers), name (a string);
// - "X" events have dur >= 0 and, per (pid, tid), nest: a slice that starts inside
//   another ends inside it (compared in integer ns, as Perfetto reads µs with 3 decimals);
// - "B"/"E" events balance per (pid, tid), never ending more than began;
// - "C" counter events have numeric args and non-decreasing ts per (pid, name);
// - every pid with events has a process_name metadata event.
inline std::vector<std::string> trace_problems(const nlohmann::json& trace) {
  std::vector<std::string> out;
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    out.push_back("not {\"traceEvents\": [...]}");
    return out;
  }
  if (trace.value("displayTimeUnit", std::string()) != "ms") out.push_back("displayTimeUnit is not \"ms\"");
  using Track = std::pair<std::int64_t, std::int64_t>;
  std::map<Track, std::vector<std::pair<std::int64_t, std::int64_t>>> slices;
  std::map<Track, int> open;
  std::map<std::pair<std::int64_t, std::string>, double> counter_ts;
  std::set<std::int64_t> pids, named;
  std::size_t i = 0;
  for (const auto& e : trace["traceEvents"]) {
    const std::string where = "event " + std::to_string(i++) + " " + e.dump().substr(0, 160);
    if (!e.is_object()) {
      out.push_back(where + ": not an object");
      continue;
    }
    const bool ok = e.contains("ph") && e["ph"].is_string() && e["ph"].get<std::string>().size() == 1 &&
                    e.contains("ts") && e["ts"].is_number() && e.contains("pid") && e["pid"].is_number_integer() &&
                    e.contains("tid") && e["tid"].is_number_integer() && e.contains("name") && e["name"].is_string();
    if (!ok) {
      out.push_back(where + ": lacks one of ph, ts, pid, tid, name");
      continue;
    }
    const char ph = e["ph"].get<std::string>()[0];
    const std::int64_t pid = e["pid"], tid = e["tid"];
    const double ts = e["ts"];
    const std::int64_t ts_ns = std::llround(ts * 1000.0);
    if (ph == 'M') {
      if (e["name"] == "process_name") {
        if (!e.contains("args") || !e["args"].contains("name") || !e["args"]["name"].is_string())
          out.push_back(where + ": process_name without args.name");
        named.insert(pid);
      }
      continue;
    }
    pids.insert(pid);
    switch (ph) {
      case 'X': {
        if (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0) {
          out.push_back(where + ": X without a dur >= 0");
          break;
        }
        slices[{pid, tid}].push_back({ts_ns, ts_ns + std::llround(e["dur"].get<double>() * 1000.0)});
        break;
      }
      case 'B': ++open[{pid, tid}]; break;
      case 'E':
        if (--open[{pid, tid}] < 0) out.push_back(where + ": E without a B");
        break;
      case 'C': {
        if (!e.contains("args") || !e["args"].is_object() || e["args"].empty())
          out.push_back(where + ": counter without args");
        else
          for (const auto& [k, v] : e["args"].items())
            if (!v.is_number()) out.push_back(where + ": counter arg " + k + " is not a number");
        const auto key = std::make_pair(pid, e["name"].get<std::string>());
        const auto it = counter_ts.find(key);
        if (it != counter_ts.end() && ts < it->second) out.push_back(where + ": counter ts goes back");
        counter_ts[key] = ts;
        break;
      }
      case 'i': case 'I': break;
      default: out.push_back(where + ": unexpected ph");
    }
  }
  for (const auto& [track, n] : open)
    if (n != 0) out.push_back("B/E unbalanced on pid " + std::to_string(track.first));
  for (auto& [track, list] : slices) {
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<std::int64_t> ends;  // the open slices' ends, innermost last
    for (const auto& [s, e] : list) {
      while (!ends.empty() && ends.back() <= s) ends.pop_back();
      if (!ends.empty() && e > ends.back())
        out.push_back("pid " + std::to_string(track.first) + ": a slice at " + std::to_string(s) +
                      " ns sticks out of its parent");
      ends.push_back(e);
    }
  }
  for (std::int64_t pid : pids)
    if (!named.count(pid)) out.push_back("pid " + std::to_string(pid) + " has no process_name");
  return out;
}

// pid -> process name.
inline std::map<std::int64_t, std::string> trace_processes(const nlohmann::json& trace) {
  std::map<std::int64_t, std::string> out;
  for (const auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") out[e["pid"]] = e["args"]["name"];
  return out;
}

// Names of the X slices of one pid.
inline std::vector<std::string> trace_slice_names(const nlohmann::json& trace, std::int64_t pid) {
  std::vector<std::string> out;
  for (const auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "X" && e["pid"] == pid) out.push_back(e["name"]);
  return out;
}

}  // namespace shardscope::testing
