#include "harness/records/json_read.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <utility>

#include "harness/common/json_text.hpp"
#include "shardscope/check.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

constexpr const char* kByteCount = "a byte count";
constexpr const char* kCount = "a count";
constexpr const char* kTime = "a time in ms (a number >= 0)";

// The value as the file has it, cut short: a whole rank record would drown the line.
std::string shown(const json& v) {
  std::string text = json_text(v);
  if (text.size() <= 60) return text;
  std::size_t cut = 57;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  return text.substr(0, cut) + "...";
}

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }
std::string item(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }

// Reads the fields of one document; `at_` names the file and, once known, the run:
// "'a.json': runs[0] (ddp W=2)". Paths are the field's inside the run ("ranks[1].peak").
class Reader {
 public:
  explicit Reader(std::string at) : at_(std::move(at)) {}
  void set_at(std::string at) { at_ = std::move(at); }
  const std::string& at() const { return at_; }

  // `v` null: the field is missing.
  [[noreturn]] void refuse(const std::string& path, const json* v, const std::string& wanted,
                           const std::string& why = {}) const {
    const std::string field = path.empty() ? at_ : at_ + ": " + path;
    if (!v) throw UsageError(field + " is missing; expected " + wanted);
    throw UsageError(field + " is " + shown(*v) + ", not " + wanted + why);
  }

  const json& need(const json& obj, const std::string& path, const char* key, const std::string& wanted) const {
    const auto it = obj.find(key);
    if (it == obj.end()) refuse(join(path, key), nullptr, wanted);
    return *it;
  }
  // obj[key] when present and not null.
  static const json* present(const json& obj, const char* key) {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }

  const json& as_object(const json& v, const std::string& path, const std::string& wanted = "an object") const {
    if (!v.is_object()) refuse(path, &v, wanted);
    return v;
  }
  const json& object(const json& obj, const std::string& path, const char* key) const {
    return as_object(need(obj, path, key, "an object"), join(path, key));
  }
  const json& array(const json& obj, const std::string& path, const char* key, const std::string& wanted) const {
    const json& v = need(obj, path, key, wanted);
    if (!v.is_array()) refuse(join(path, key), &v, wanted);
    return v;
  }

  // A whole number from 0 to 2^63 - 1: figures are read into int64 and subtracted.
  // nlohmann keeps a number with a fraction or beyond 2^64 as a double, one from 2^63
  // as unsigned.
  std::int64_t as_count(const json& v, const std::string& path, const std::string& wanted) const {
    std::string why;
    if (v.is_number_unsigned()) {
      if (v.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return v.get<std::int64_t>();
      why = " (beyond 2^63 - 1)";
    } else if (v.is_number_integer()) {
      if (v.get<std::int64_t>() >= 0) return v.get<std::int64_t>();
      why = " (negative)";
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      why = d < 0.0 ? " (negative)" : d >= 0x1p63 ? " (beyond 2^63 - 1)" : " (not an integer)";
    }
    refuse(path, &v, wanted, why);
  }
  std::int64_t count(const json& obj, const std::string& path, const char* key, const std::string& wanted = kByteCount) const {
    return as_count(need(obj, path, key, wanted), join(path, key), wanted);
  }
  // A count that an int holds (layers, ranks, micro-batches).
  int as_small(const json& v, const std::string& path, const std::string& wanted) const {
    const std::int64_t n = as_count(v, path, wanted);
    if (n > std::numeric_limits<int>::max()) refuse(path, &v, wanted, " (beyond 2^31 - 1)");
    return static_cast<int>(n);
  }
  int small(const json& obj, const std::string& path, const char* key, const std::string& wanted = kCount) const {
    return as_small(need(obj, path, key, wanted), join(path, key), wanted);
  }
  int positive(const json& obj, const std::string& path, const char* key, const std::string& wanted = "a positive integer") const {
    const json& v = need(obj, path, key, wanted);
    const int n = as_small(v, join(path, key), wanted);
    if (n == 0) refuse(join(path, key), &v, wanted);
    return n;
  }
  std::optional<int> optional_small(const json& obj, const std::string& path, const char* key, const std::string& wanted) const {
    const json& v = need(obj, path, key, wanted + " or null");
    if (v.is_null()) return std::nullopt;
    return as_small(v, join(path, key), wanted + " or null");
  }
  std::optional<std::int64_t> optional_count(const json& obj, const std::string& path, const char* key,
                                             const std::string& wanted = kByteCount) const {
    const json& v = need(obj, path, key, wanted + " or null");
    if (v.is_null()) return std::nullopt;
    return as_count(v, join(path, key), wanted + " or null");
  }

  // A finite number; `non_negative` for times.
  double number(const json& v, const std::string& path, const std::string& wanted, bool non_negative) const {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || (non_negative && v.get<double>() < 0.0))
      refuse(path, &v, wanted);
    return v.get<double>();
  }
  double time(const json& obj, const std::string& path, const char* key) const {
    return number(need(obj, path, key, kTime), join(path, key), kTime, true);
  }
  std::optional<double> optional_number(const json& obj, const std::string& path, const char* key,
                                        const std::string& wanted, bool non_negative) const {
    const json& v = need(obj, path, key, wanted + " or null");
    if (v.is_null()) return std::nullopt;
    return number(v, join(path, key), wanted + " or null", non_negative);
  }
  std::optional<double> optional_time(const json& obj, const std::string& path, const char* key) const {
    return optional_number(obj, path, key, kTime, true);
  }
  std::vector<double> times(const json& obj, const std::string& path, const char* key) const {
    const json& v = array(obj, path, key, "an array of times in ms");
    std::vector<double> out;
    for (std::size_t i = 0; i < v.size(); ++i) out.push_back(number(v[i], item(join(path, key), i), kTime, true));
    return out;
  }
  std::vector<double> numbers(const json& v, const std::string& path, const std::string& wanted) const {
    if (!v.is_array()) refuse(path, &v, "an array of " + wanted + "s");
    std::vector<double> out;
    for (std::size_t i = 0; i < v.size(); ++i) out.push_back(number(v[i], item(path, i), wanted, false));
    return out;
  }

  std::string as_text(const json& v, const std::string& path, const std::string& wanted) const {
    if (!v.is_string()) refuse(path, &v, wanted);
    return v.get<std::string>();
  }
  std::string text(const json& obj, const std::string& path, const char* key, const std::string& wanted = "a string") const {
    return as_text(need(obj, path, key, wanted), join(path, key), wanted);
  }
  std::optional<std::string> optional_text(const json& obj, const std::string& path, const char* key) const {
    const json& v = need(obj, path, key, "a string or null");
    if (v.is_null()) return std::nullopt;
    return as_text(v, join(path, key), "a string or null");
  }
  bool boolean(const json& obj, const std::string& path, const char* key) const {
    const json& v = need(obj, path, key, "true or false");
    if (!v.is_boolean()) refuse(join(path, key), &v, "true or false");
    return v.get<bool>();
  }

 private:
  std::string at_;
};

CategoryFigures read_categories(const Reader& rd, const json& obj, const std::string& path, const char* key) {
  const std::string here = join(path, key);
  const json& j = rd.object(obj, path, key);
  CategoryFigures f;
  f.total = rd.count(j, here, "total");
  for (int c = 0; c < kCategoryCount; ++c) {
    // "workspace", "master" and "param_cast" came after the first files were written:
    // missing, they held nothing.
    if (c >= kCategoriesBeforeWorkspace && !j.contains(kCategoryNames[c])) continue;
    f.bytes[c] = rd.count(j, here, kCategoryNames[c]);
  }
  return f;
}

PeakFigures read_peak(const Reader& rd, const json& member, const std::string& path) {
  const std::string here = join(path, "peak");
  const json& j = rd.object(member, path, "peak");
  PeakFigures p;
  p.total = rd.count(j, here, "total");
  p.phase = rd.text(j, here, "phase", "a phase name");
  p.where = rd.text(j, here, "where", "a place");
  p.by_category = read_categories(rd, j, here, "by_category");
  return p;
}

CommFigures read_comm(const Reader& rd, const json& member, const std::string& path) {
  const std::string here = join(path, "comm");
  const json& j = rd.object(member, path, "comm");
  CommFigures comm;
  for (int k = 0; k < kCollKindCount; ++k) {
    const std::string kind(kCollKindNames[k]);
    const json& c = rd.object(j, here, kind.c_str());
    const std::string at = join(here, kind);
    comm[k].calls = rd.count(c, at, "calls", kCount);
    comm[k].bytes = rd.count(c, at, "bytes");
    comm[k].ms = rd.time(c, at, "ms");
    comm[k].exposed_ms = c.contains("exposed_ms") ? rd.time(c, at, "exposed_ms") : comm[k].ms;
    comm[k].busbw_gbps = rd.optional_number(c, at, "busbw_gbps", "a bandwidth in GB/s (a number >= 0)", true);
  }
  return comm;
}

TimeSummary read_time_summary(const Reader& rd, const json& member, const std::string& path, const char* key) {
  const std::string here = join(path, key);
  const json& j = rd.object(member, path, key);
  return {rd.optional_time(j, here, "median"), rd.optional_time(j, here, "min"), rd.optional_time(j, here, "max")};
}

constexpr const char* kPartSource = "\"nvml\", \"cuda_mem_get_info_delta\" or \"not measured\"";

std::string part_source(const Reader& rd, const json& obj, const std::string& path) {
  const json& v = rd.need(obj, path, "source", kPartSource);
  const std::string source = rd.as_text(v, join(path, "source"), kPartSource);
  if (source != "nvml" && source != "cuda_mem_get_info_delta" && source != "not measured")
    rd.refuse(join(path, "source"), &v, kPartSource);
  return source;
}

MeasuredPartFigures read_part(const Reader& rd, const json& parts, const std::string& path, const char* key) {
  const std::string here = join(path, key);
  const json& j = rd.object(parts, path, key);
  return {rd.optional_count(j, here, "bytes"), part_source(rd, j, here)};
}

OutsidePoolParts read_outside_pool_parts(const Reader& rd, const json& member, const std::string& path) {
  const std::string here = join(path, "outside_pool_parts");
  const json& j = rd.object(member, path, "outside_pool_parts");
  OutsidePoolParts parts;
  parts.cuda_context = read_part(rd, j, here, "cuda_context");
  parts.cublas = read_part(rd, j, here, "cublas");
  const json& nccl = rd.array(j, here, "nccl", "an array of communicators");
  for (std::size_t i = 0; i < nccl.size(); ++i) {
    const std::string at = item(join(here, "nccl"), i);
    rd.as_object(nccl[i], at);
    parts.nccl.push_back({rd.text(nccl[i], at, "communicator", "a communicator's name"),
                          rd.small(nccl[i], at, "ranks"), rd.optional_count(nccl[i], at, "init_bytes"),
                          rd.optional_count(nccl[i], at, "bytes"), part_source(rd, nccl[i], at)});
  }
  parts.other = rd.optional_count(j, here, "other");
  return parts;
}

AllocatorFigures read_allocator(const Reader& rd, const json& member, const std::string& path) {
  AllocatorFigures a;
  const json& rounded = rd.object(member, path, "rounded");
  a.rounded_resting_total = rd.count(rounded, join(path, "rounded"), "resting_total");
  a.rounded_peak_total = rd.count(rounded, join(path, "rounded"), "peak_total");
  const json& pool = rd.need(member, path, "pool", "an object or null");
  if (!pool.is_null()) {
    const std::string here = join(path, "pool");
    rd.as_object(pool, here, "an object or null");
    a.pool = PoolFigures{rd.count(pool, here, "used_current"), rd.count(pool, here, "used_high"),
                         rd.count(pool, here, "reserved_current"), rd.count(pool, here, "reserved_high")};
  }
  a.outside_pool_bytes = rd.optional_count(member, path, "outside_pool_bytes");
  if (member.contains("outside_pool_source"))  // added after the first files were written
    a.outside_pool_source = rd.optional_text(member, path, "outside_pool_source");
  if (Reader::present(member, "outside_pool_parts"))  // added later still; null on cpu
    a.outside_pool_parts = read_outside_pool_parts(rd, member, path);
  return a;
}

// A row's bytes of the file's first `count` categories (kCategoryNames' first `count`);
// the others, which the file predates, held nothing.
std::array<std::int64_t, kCategoryCount> row_bytes(const Reader& rd, const json& row, const std::string& path,
                                                   int count) {
  std::array<std::int64_t, kCategoryCount> b{};
  for (int c = 0; c < count; ++c) b[c] = rd.as_count(row[c + 1], item(path, c + 1), kByteCount);
  return b;
}

TimelineRecord read_timeline(const Reader& rd, const json& t, const std::string& path) {
  rd.as_object(t, path);
  TimelineRecord r;
  r.unit = rd.text(t, path, "unit");
  r.coalesced = rd.boolean(t, path, "coalesced");
  r.merged_events = rd.count(t, path, "merged_events", kCount);
  r.events = rd.count(t, path, "events", kCount);
  r.sample_limit = rd.count(t, path, "sample_limit", kCount);
  const json& categories = rd.array(t, path, "categories", "the category names");
  // The current names in order, or the first 8 of them (files written before "workspace"),
  // or the first 9 (before "master" and "param_cast").
  json names = json::array(), before_workspace = json::array(), before_precision = json::array();
  for (int c = 0; c < kCategoryCount; ++c) {
    names.push_back(kCategoryNames[c]);
    if (c < kCategoriesBeforeWorkspace) before_workspace.push_back(kCategoryNames[c]);
    if (c < kCategoriesBeforePrecision) before_precision.push_back(kCategoryNames[c]);
  }
  if (categories != names && categories != before_workspace && categories != before_precision)
    rd.refuse(join(path, "categories"), &categories,
              "the " + std::to_string(kCategoryCount) + " category names in order (or the first " +
                  std::to_string(kCategoriesBeforeWorkspace) + ", before workspace, or the first " +
                  std::to_string(kCategoriesBeforePrecision) + ", before master and param_cast)");
  const int count = static_cast<int>(categories.size());
  const json& memory = rd.array(t, path, "memory", "an array of rows");
  for (std::size_t i = 0; i < memory.size(); ++i) {
    const json& row = memory[i];
    const std::string at = item(join(path, "memory"), i);
    if (!row.is_array() || row.size() != static_cast<std::size_t>(count) + 1)
      rd.refuse(at, &row, "a row [t_ms, bytes of each of the " + std::to_string(count) + " categories]");
    r.memory.push_back({rd.number(row[0], item(at, 0), kTime, true), row_bytes(rd, row, at, count)});
  }
  const json& marks = rd.array(t, path, "marks", "an array of marks");
  for (std::size_t i = 0; i < marks.size(); ++i) {
    const json& m = marks[i];
    const std::string at = item(join(path, "marks"), i);
    if (!m.is_array() || m.size() != 3) rd.refuse(at, &m, "a mark [t_ms, phase, place]");
    r.marks.push_back({rd.number(m[0], item(at, 0), kTime, true), rd.as_text(m[1], item(at, 1), "a phase name"),
                       rd.as_text(m[2], item(at, 2), "a place")});
  }
  r.dropped_marks = rd.count(t, path, "dropped_marks", kCount);
  const json& spans = rd.array(t, path, "spans", "an array of spans");
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const std::string at = item(join(path, "spans"), i);
    const json& s = rd.as_object(spans[i], at, "a span (an object)");
    TimelineSpanRecord span;
    span.name = rd.text(s, at, "name");
    span.start_ms = rd.time(s, at, "start_ms");
    span.end_ms = rd.time(s, at, "end_ms");
    span.depth = rd.small(s, at, "depth");
    if (s.contains("bytes")) span.bytes = rd.count(s, at, "bytes");
    if (s.contains("track")) span.track = rd.text(s, at, "track");
    r.spans.push_back(std::move(span));
  }
  r.dropped_spans = rd.count(t, path, "dropped_spans", kCount);
  return r;
}

std::optional<TimelineRecord> read_optional_timeline(const Reader& rd, const json& member, const std::string& path) {
  if (!member.contains("timeline")) return std::nullopt;
  return read_timeline(rd, member["timeline"], join(path, "timeline"));
}

std::optional<Placement> read_placement(const Reader& rd, const json& member, const std::string& path) {
  if (!member.contains("local_rank")) return std::nullopt;
  Placement p;
  p.local_rank = rd.small(member, path, "local_rank", "a rank on the node");
  p.device = rd.optional_small(member, path, "device", "a device index");
  return p;
}

std::optional<RankSaved> read_rank_saved(const Reader& rd, const json& member, const std::string& path) {
  if (!member.contains("saved")) return std::nullopt;
  const std::string here = join(path, "saved");
  const json& j = rd.object(member, path, "saved");
  RankSaved s;
  s.after_forward_bytes = rd.count(j, here, "after_forward_bytes");
  s.after_forward_tensors = rd.count(j, here, "after_forward_tensors", kCount);
  return s;
}

// "comm_groups" under --mesh (one object per axis: dp, tp, pp) or HSDP (shard, replicate),
// each its group's ledger.
std::optional<std::vector<GroupCommRecord>> read_comm_groups(const Reader& rd, const json& member,
                                                             const std::string& path) {
  if (!Reader::present(member, "comm_groups")) return std::nullopt;
  const std::string here = join(path, "comm_groups");
  const json& j = rd.object(member, path, "comm_groups");
  std::vector<GroupCommRecord> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string name = it.key();
    const std::string at = join(here, name);
    const json& g = rd.object(j, here, name.c_str());
    GroupCommRecord r;
    r.axis = name;
    r.world = rd.positive(g, at, "world");
    r.rank = rd.small(g, at, "rank", "a rank in the group");
    const json& members = rd.array(g, at, "members", "an array of world ranks");
    for (std::size_t i = 0; i < members.size(); ++i)
      r.members.push_back(rd.as_small(members[i], join(at, "members"), "a world rank"));
    r.comm = read_comm(rd, g, at);
    r.comm_bytes = rd.count(g, at, "comm_bytes");
    r.predicted_comm_bytes = rd.count(g, at, "predicted_comm_bytes");
    out.push_back(std::move(r));
  }
  return out;
}

// A run's "mesh": {"dp", "tp", "pp"}.
MeshRecord read_mesh(const Reader& rd, const json& run) {
  const json& m = rd.object(run, "", "mesh");
  MeshRecord r{rd.positive(m, "mesh", "dp"), rd.positive(m, "mesh", "tp"), rd.positive(m, "mesh", "pp")};
  if (Reader::present(m, "sp")) r.sp = rd.boolean(m, "mesh", "sp");
  return r;
}

RankRecord read_rank(const Reader& rd, const json& member, const std::string& path) {
  rd.as_object(member, path, "a rank record (an object)");
  RankRecord r;
  r.rank = rd.small(member, path, "rank", "a rank number");
  r.resting = read_categories(rd, member, path, "resting");
  r.peak = read_peak(rd, member, path);
  const std::string here = join(path, "predicted");
  const json& p = rd.object(member, path, "predicted");
  r.predicted.resting_total = rd.count(p, here, "resting_total");
  r.predicted.resting = read_categories(rd, p, here, "resting");
  r.predicted.peak_total = rd.count(p, here, "peak_total");
  r.predicted.peak_by_category = read_categories(rd, p, here, "peak_by_category");
  r.predicted.peak_phase = rd.text(p, here, "peak_phase", "a phase name");
  r.predicted.peak_where = rd.text(p, here, "peak_where", "a place");
  r.predicted.comm_bytes = rd.count(p, here, "comm_bytes");
  r.predicted.saved = read_rank_saved(rd, p, here);
  if (Reader::present(p, "model_states")) r.predicted.model_states = rd.count(p, here, "model_states");
  r.allocator = read_allocator(rd, member, path);
  r.comm = read_comm(rd, member, path);
  r.comm_bytes = rd.count(member, path, "comm_bytes");
  r.step_ms = read_time_summary(rd, member, path, "step_ms");
  r.step_ms_all = rd.times(member, path, "step_ms_all");
  r.comm_ms = read_time_summary(rd, member, path, "comm_ms");
  r.comm_ms_all = rd.times(member, path, "comm_ms_all");
  // Added with --overlap; before it every collective blocked, so the step waited for all.
  r.comm_exposed_ms = Reader::present(member, "comm_exposed_ms")
                          ? read_time_summary(rd, member, path, "comm_exposed_ms")
                          : r.comm_ms;
  r.comm_exposed_ms_all = Reader::present(member, "comm_exposed_ms_all")
                              ? rd.times(member, path, "comm_exposed_ms_all")
                              : r.comm_ms_all;
  r.loss = rd.numbers(rd.need(member, path, "loss", "an array of losses"), join(path, "loss"), "loss");
  r.timeline = read_optional_timeline(rd, member, path);
  r.placement = read_placement(rd, member, path);
  r.saved = read_rank_saved(rd, member, path);
  r.comm_groups = read_comm_groups(rd, member, path);
  return r;
}

SavedFigures read_saved(const Reader& rd, const json& j, const std::string& path) {
  SavedFigures s;
  s.peak_live_tensors = rd.count(j, path, "peak_live_tensors", kCount);
  s.peak_live_bytes = rd.count(j, path, "peak_live_bytes");
  s.total_tensors = rd.count(j, path, "total_tensors", kCount);
  s.before_first_backward = rd.count(j, path, "before_first_backward", kCount);
  return s;
}

LayerRange read_layer_range(const Reader& rd, const json& v, const std::string& path) {
  if (!v.is_array() || v.size() != 2) rd.refuse(path, &v, "[first layer, last layer]");
  return {rd.as_small(v[0], item(path, 0), "a layer index"), rd.as_small(v[1], item(path, 1), "a layer index")};
}

StageRecord read_stage(const Reader& rd, const json& member, const std::string& path) {
  rd.as_object(member, path, "a stage record (an object)");
  StageRecord s;
  s.stage = rd.small(member, path, "stage", "a stage number");
  s.rank = rd.small(member, path, "rank", "a rank number");
  s.world = rd.positive(member, path, "world");
  s.layers = read_layer_range(rd, rd.need(member, path, "layers", "[first layer, last layer]"), join(path, "layers"));
  if (member.contains("chunks_layers")) {
    const json& all = rd.array(member, path, "chunks_layers", "an array of layer ranges");
    s.chunks_layers.emplace();
    for (std::size_t i = 0; i < all.size(); ++i)
      s.chunks_layers->push_back(read_layer_range(rd, all[i], item(join(path, "chunks_layers"), i)));
  }
  s.saved = read_saved(rd, rd.object(member, path, "saved"), join(path, "saved"));
  const std::string here = join(path, "predicted");
  const json& p = rd.object(member, path, "predicted");
  s.predicted.saved = read_saved(rd, p, here);
  s.predicted.resting_total = rd.count(p, here, "resting_total");
  s.predicted.peak_total = rd.count(p, here, "peak_total");
  s.predicted.peak_by_category = read_categories(rd, p, here, "peak_by_category");
  s.predicted.p2p_sent_bytes = rd.count(p, here, "p2p_sent_bytes");
  s.predicted.comm_bytes = rd.count(p, here, "comm_bytes");
  s.predicted.peak_live_microbatches = rd.small(p, here, "peak_live_microbatches");
  s.predicted.peak_live_microbatches_theory = rd.small(p, here, "peak_live_microbatches_theory");
  s.predicted.peak_held_microbatches = rd.small(p, here, "peak_held_microbatches");
  s.predicted.peak_held_microbatches_theory = rd.small(p, here, "peak_held_microbatches_theory");
  s.resting = read_categories(rd, member, path, "resting");
  s.peak = read_peak(rd, member, path);
  s.allocator = read_allocator(rd, member, path);
  const json& p2p = rd.object(member, path, "p2p");
  s.p2p_sent_bytes = rd.count(p2p, join(path, "p2p"), "sent_bytes");
  s.p2p_recv_bytes = rd.count(p2p, join(path, "p2p"), "recv_bytes");
  s.p2p_peak_comm_bytes = rd.count(p2p, join(path, "p2p"), "peak_comm_bytes");
  if (p2p.contains("dtype")) s.p2p_dtype = rd.text(p2p, join(path, "p2p"), "dtype", "fp32 or bf16");
  s.comm = read_comm(rd, member, path);
  s.comm_bytes = rd.count(member, path, "comm_bytes");
  s.busy_ms = rd.optional_time(member, path, "busy_ms");
  s.step_ms = read_time_summary(rd, member, path, "step_ms");
  s.step_ms_all = rd.times(member, path, "step_ms_all");
  s.actions_end_ms = rd.optional_time(member, path, "actions_end_ms");
  constexpr const char* kFraction = "a fraction (a finite number)";
  s.bubble_fraction = rd.optional_number(member, path, "bubble_fraction", kFraction, false);
  s.bubble_fraction_replayed = rd.optional_number(member, path, "bubble_fraction_replayed", kFraction, false);
  s.bubble_fraction_theory = rd.number(rd.need(member, path, "bubble_fraction_theory", kFraction),
                                       join(path, "bubble_fraction_theory"), kFraction, false);
  if (member.contains("replayed_makespan_ms")) s.replayed_makespan_ms = rd.time(member, path, "replayed_makespan_ms");
  const json& actions = rd.need(member, path, "action_ms", "an array of action times or null");
  if (!actions.is_null()) {
    const std::string list = join(path, "action_ms");
    if (!actions.is_array()) rd.refuse(list, &actions, "an array of action times or null");
    s.action_ms.emplace();
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const std::string at = item(list, i);
      const json& a = rd.as_object(actions[i], at, "an action time (an object)");
      s.action_ms->push_back({rd.text(a, at, "action", "an action name"), rd.small(a, at, "microbatch"),
                              rd.small(a, at, "chunk"), rd.time(a, at, "ms")});
    }
  }
  const json& loss = rd.need(member, path, "loss", "an array of losses or null");
  if (!loss.is_null()) s.loss = rd.numbers(loss, join(path, "loss"), "loss");
  s.timeline = read_optional_timeline(rd, member, path);
  s.placement = read_placement(rd, member, path);
  s.comm_groups = read_comm_groups(rd, member, path);
  return s;
}

ModelRecord read_model(const Reader& rd, const json& run) {
  const json& m = rd.as_object(rd.need(run, "", "model", "an object (layers, width, batch, ...)"), "model",
                               "an object (layers, width, batch, ...)");
  ModelRecord r;
  r.layers = rd.positive(m, "model", "layers");
  r.width = rd.positive(m, "model", "width");
  r.params = rd.count(m, "model", "params", kCount);
  r.param_tensors = rd.small(m, "model", "param_tensors");
  r.param_bytes = rd.count(m, "model", "param_bytes");
  r.activation = rd.text(m, "model", "activation", "a name");
  r.loss = rd.text(m, "model", "loss", "a name");
  r.batch = rd.positive(m, "model", "batch");
  // A transformer's (files of an MLP, and those written before transformers, have neither).
  if (m.contains("family")) r.family = rd.text(m, "model", "family", "a model family");
  // --checkpoint when not none (files written before it have none).
  if (m.contains("checkpoint")) r.checkpoint = rd.text(m, "model", "checkpoint", "full, every:K or attention");
  if (m.contains("shape")) {
    const json& s = rd.object(m, "model", "shape");
    const std::string path = "model.shape";
    TransformerShapeRecord t;
    t.model_type = rd.text(s, path, "model_type", "a model_type");
    t.hidden = rd.positive(s, path, "hidden");
    t.heads = rd.positive(s, path, "heads");
    t.kv_heads = rd.positive(s, path, "kv_heads");
    t.head_dim = rd.positive(s, path, "head_dim");
    t.ffn = rd.positive(s, path, "ffn");
    t.vocab = rd.positive(s, path, "vocab");
    t.seq = rd.positive(s, path, "seq");
    t.positions = rd.positive(s, path, "positions");
    t.tied_embeddings = rd.boolean(s, path, "tied_embeddings");
    t.qkv_bias = rd.boolean(s, path, "qkv_bias");
    t.out_bias = rd.boolean(s, path, "out_bias");
    t.attention = rd.text(s, path, "attention", "math or flash");
    r.shape = t;
  }
  return r;
}

RunPlace read_place(const Reader& rd, const json& run) {
  RunPlace p;
  p.backend = rd.text(run, "", "backend", "a backend name");
  p.comm = rd.text(run, "", "comm", "a communicator name");
  p.emulated = rd.boolean(run, "", "emulated");
  if (run.contains("rank")) p.rank = rd.small(run, "", "rank", "a rank number");
  return p;
}

std::vector<int> read_ints(const Reader& rd, const json& run, const char* key, const std::string& wanted) {
  const json& v = rd.array(run, "", key, "an array of " + wanted + "s");
  std::vector<int> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(rd.as_small(v[i], item(key, i), wanted));
  return out;
}

// A run's "seed": any whole number below 2^64, the full range of the seed it was run with.
std::uint64_t read_seed(const Reader& rd, const json& run) {
  constexpr const char* kSeed = "a seed (a whole number below 2^64)";
  const json& seed = rd.need(run, "", "seed", kSeed);
  if (!seed.is_number_unsigned() && !(seed.is_number_integer() && seed.get<std::int64_t>() >= 0))
    rd.refuse("seed", &seed, kSeed);
  return seed.get<std::uint64_t>();
}

// The run as compare and the tables name it: "zero2 W=2 units=1", "gpipe S=2 M=2 chunks=1".
// read_run has checked the name (a string) and the world; the rest is shown as the file
// has it, checked after.
std::string run_label(const json& run, bool pipeline) {
  auto text = [](const json& v) { return v.is_string() ? v.get<std::string>() : json_text(v); };
  const std::string name = run[pipeline ? "schedule" : "strategy"].get<std::string>();
  std::string label = name + (pipeline ? " S=" : " W=") + text(run["world"]);
  if (!pipeline) {
    const std::optional<StrategyKind> kind = find_strategy(name);
    const bool units = (kind && shards_by_unit(*kind)) || name == "hsdp";  // hsdp: zero3's units
    if (const json* k = Reader::present(run, "layers_per_unit"); k && units) label += " units=" + text(*k);
    if (const json* g = Reader::present(run, "shard_group")) label += " shard_group=" + text(*g);
    if (const json* e = Reader::present(run, "engine"); e && *e != "torch") label += " engine=" + text(*e);
    if (const json* p = Reader::present(run, "precision"); p && *p != "fp32") label += " precision=" + text(*p);
    if (const json* m = Reader::present(run, "model"); m && m->is_object())
      if (const json* c = Reader::present(*m, "checkpoint")) label += " checkpoint=" + text(*c);
    if (const json* a = Reader::present(run, "accumulate"); a && *a != 1) label += " accumulate=" + text(*a);
    if (const json* n = Reader::present(run, "no_sync"); n && *n == true) label += " no_sync";
    if (const json* m = Reader::present(run, "mesh"); m && m->is_object())
      label += " mesh=dp" + text(m->value("dp", json(1))) + ",tp" + text(m->value("tp", json(1))) + ",pp" +
               text(m->value("pp", json(1))) + (m->value("sp", false) == true ? ",sp" : "");
  } else {
    if (const json* m = Reader::present(run, "microbatches")) label += " M=" + text(*m);
    if (const json* v = Reader::present(run, "chunks")) label += " chunks=" + text(*v);
    if (const json* p = Reader::present(run, "precision"); p && *p != "fp32") label += " precision=" + text(*p);
    if (const json* a = Reader::present(run, "autocast_region"); a && *a != "microbatch")
      label += " autocast_region=" + text(*a);
  }
  return label;
}

// Ranks (stages) are matched by number: a number given twice would match either.
template <typename Member>
void check_numbers_distinct(const Reader& rd, const json& list, const std::vector<Member>& members,
                            const char* list_key, const char* id, int Member::*number) {
  std::set<int> seen;
  for (std::size_t i = 0; i < members.size(); ++i)
    if (!seen.insert(members[i].*number).second)
      rd.refuse(join(item(list_key, i), id), &list[i][id], std::string("a ") + id + " number no other record has");
}

// "precision": fp32 or bf16 (a record without it is fp32).
std::string read_precision(const Reader& rd, const json& run) {
  const std::string p = rd.text(run, "", "precision", "fp32 or bf16");
  if (!find_named<PrecisionKind>(kPrecisionNames, p)) rd.refuse("precision", &run["precision"], "fp32 or bf16");
  return p;
}

DataParallelRun read_data_parallel(const Reader& rd, const json& run) {
  DataParallelRun dp;
  dp.strategy = run["strategy"].get<std::string>();
  if (Reader::present(run, "engine")) {
    dp.engine = rd.text(run, "", "engine", "torch, fsdp2 or deepspeed");
    if (dp.engine != "torch" && dp.engine != "fsdp2" && dp.engine != "deepspeed")
      rd.refuse("engine", &run["engine"], "torch, fsdp2 or deepspeed");
  }
  if (Reader::present(run, "precision")) dp.precision = read_precision(rd, run);
  if (Reader::present(run, "bf16_gemm")) dp.bf16_gemm = rd.text(run, "", "bf16_gemm", "the bf16 GEMM's description");
  if (Reader::present(run, "accumulate")) dp.accumulate = rd.positive(run, "", "accumulate");
  if (Reader::present(run, "no_sync")) dp.no_sync = rd.boolean(run, "", "no_sync");
  if (Reader::present(run, "overlap")) dp.overlap = rd.boolean(run, "", "overlap");
  dp.world = rd.positive(run, "", "world");
  dp.model = read_model(rd, run);
  dp.units = rd.positive(run, "", "units");
  const json& k = rd.need(run, "", "layers_per_unit", "a positive integer or \"all\"");
  if (k != "all") dp.layers_per_unit = rd.positive(run, "", "layers_per_unit", "a positive integer or \"all\"");
  dp.prefetch = rd.small(run, "", "prefetch", "a whole number >= 0");
  dp.ddp_bucket = rd.text(run, "", "ddp_bucket", "a name");
  dp.bucket_mb = rd.number(rd.need(run, "", "bucket_mb", "a number >= 0"), "bucket_mb", "a number >= 0", true);
  dp.steps = rd.small(run, "", "steps");
  dp.timed_steps = rd.small(run, "", "timed_steps");
  dp.seed = read_seed(rd, run);
  if (Reader::present(run, "shard_group")) dp.shard_group = rd.positive(run, "", "shard_group");
  if (Reader::present(run, "mesh")) dp.mesh = read_mesh(rd, run);
  const json& ranks = rd.array(run, "", "ranks", "an array of rank records");
  for (std::size_t i = 0; i < ranks.size(); ++i) dp.ranks.push_back(read_rank(rd, ranks[i], item("ranks", i)));
  check_numbers_distinct(rd, ranks, dp.ranks, "ranks", "rank", &RankRecord::rank);
  dp.place = read_place(rd, run);
  return dp;
}

PipelineRun read_pipeline(const Reader& rd, const json& run) {
  PipelineRun pp;
  pp.schedule = run["schedule"].get<std::string>();
  if (Reader::present(run, "precision")) pp.precision = read_precision(rd, run);
  if (Reader::present(run, "autocast_region")) {
    pp.autocast_region = rd.text(run, "", "autocast_region", "microbatch or step");
    if (pp.autocast_region != "microbatch" && pp.autocast_region != "step")
      rd.refuse("autocast_region", &run["autocast_region"], "microbatch or step");
  }
  pp.world = rd.positive(run, "", "world");
  pp.model = read_model(rd, run);
  pp.microbatches = rd.positive(run, "", "microbatches");
  pp.chunks = rd.positive(run, "", "chunks");
  pp.steps = rd.small(run, "", "steps");
  pp.timed_steps = rd.small(run, "", "timed_steps");
  pp.seed = read_seed(rd, run);
  pp.split = read_ints(rd, run, "split", "layer count");
  pp.microbatch_rows = read_ints(rd, run, "microbatch_rows", "row count");
  if (Reader::present(run, "mesh")) pp.mesh = read_mesh(rd, run);
  const json& stages = rd.array(run, "", "stages", "an array of stage records");
  for (std::size_t i = 0; i < stages.size(); ++i) pp.stages.push_back(read_stage(rd, stages[i], item("stages", i)));
  // Under --mesh a stage is held by a rank of each data-parallel replica: ranks are distinct.
  if (pp.mesh)
    check_numbers_distinct(rd, stages, pp.stages, "stages", "rank", &StageRecord::rank);
  else
    check_numbers_distinct(rd, stages, pp.stages, "stages", "stage", &StageRecord::stage);
  pp.wall_makespan_ms = rd.optional_time(run, "", "wall_makespan_ms");
  pp.replayed_makespan_ms = rd.optional_time(run, "", "replayed_makespan_ms");
  pp.place = read_place(rd, run);
  return pp;
}

RunRecord read_run(const std::string& file_at, const json& run, std::size_t index) {
  Reader rd(file_at + "runs[" + std::to_string(index) + "]");
  rd.as_object(run, "", "a run (an object)");
  const json* skipped = Reader::present(run, "skipped");
  if (skipped && !skipped->is_boolean()) rd.refuse("skipped", skipped, "true or false");
  if (skipped && skipped->get<bool>()) {
    SkippedRun s;
    s.reason = rd.text(run, "", "reason", "the reason it was skipped");
    s.config = run;
    s.config.erase("skipped");
    s.config.erase("reason");
    return s;
  }
  const json* kind = Reader::present(run, "kind");
  if (!kind || (*kind != "data_parallel" && *kind != "pipeline"))
    rd.refuse("kind", kind, "\"data_parallel\" or \"pipeline\"");
  const bool pipeline = *kind == "pipeline";
  const char* name = pipeline ? "schedule" : "strategy";
  if (const json* v = Reader::present(run, name); !v || !v->is_string() || v->get<std::string>().empty())
    rd.refuse(name, v, std::string("a ") + name + " name");
  rd.positive(run, "", "world");
  // The label is made of the fields above, so from here on the run is named by it too.
  rd.set_at(rd.at() + " (" + run_label(run, pipeline) + ")");
  if (pipeline) return read_pipeline(rd, run);
  return read_data_parallel(rd, run);
}

Provenance read_provenance(const Reader& rd, const json& doc) {
  const json& p = rd.object(doc, "", "provenance");
  Provenance out;
  const std::string at = "provenance";
  out.git = rd.optional_text(p, at, "git");
  out.command = rd.optional_text(p, at, "command");
  out.host = rd.optional_text(p, at, "host");
  out.cpu = rd.optional_text(p, at, "cpu");
  out.cores = rd.optional_count(p, at, "cores", kCount);
  out.gpu = rd.optional_text(p, at, "gpu");
  out.blas = rd.optional_text(p, at, "blas");
  out.mpi = rd.optional_text(p, at, "mpi");
  out.nccl = rd.optional_text(p, at, "nccl");
  out.cuda = rd.optional_text(p, at, "cuda");
  return out;
}

}  // namespace

ResultDocument read_result(const json& doc, const std::string& source) {
  const std::string file_at = "'" + source + "': ";
  Reader rd("'" + source + "'");
  if (!doc.is_object() || doc.value("schema", json()) != kResultSchema)
    throw UsageError("'" + source + "' is not a shardscope/1 result (no \"schema\": \"shardscope/1\")");
  ResultDocument out;
  out.version = rd.text(doc, "", "version", "a version");
  out.backend = rd.optional_text(doc, "", "backend");
  out.comm = rd.optional_text(doc, "", "comm");
  const json& emulated = rd.need(doc, "", "emulated", "true, false or \"mixed\"");
  if (emulated.is_boolean())
    out.emulated = emulated.get<bool>();
  else if (emulated != "mixed")
    rd.refuse("emulated", &emulated, "true, false or \"mixed\"");
  out.provenance = read_provenance(rd, doc);
  const json& runs = rd.array(doc, "", "runs", "an array of runs");
  for (std::size_t i = 0; i < runs.size(); ++i) out.runs.push_back(read_run(file_at, runs[i], i));
  if (doc.contains("sweep")) {
    const json& s = rd.object(doc, "", "sweep");
    SweepSummary sweep;
    sweep.jobs = rd.count(s, "sweep", "jobs", kCount);
    sweep.skipped = rd.count(s, "sweep", "skipped", kCount);
    sweep.complete = rd.boolean(s, "sweep", "complete");
    if (s.contains("error")) sweep.error = rd.text(s, "sweep", "error", "a message");
    out.sweep = std::move(sweep);
  }
  return out;
}

RankRecord read_rank_record(const json& record, const std::string& source) {
  return read_rank(Reader(source), record, "");
}

StageRecord read_stage_record(const json& record, const std::string& source) {
  return read_stage(Reader(source), record, "");
}

TimelineRecord read_timeline_record(const json& timeline, const std::string& source) {
  return read_timeline(Reader(source), timeline, "timeline");
}

}  // namespace shardscope
