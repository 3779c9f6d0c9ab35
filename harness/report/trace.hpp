// `--trace FILE`: a shardscope/1 document's rank timelines as one Chrome trace-event
// JSON ("JSON Object Format": {"traceEvents": [...], "displayTimeUnit": "ms"}) that
// Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// One process per rank or stage record that carries a timeline: pid = (run index + 1) * 100000
// + rank (the run's index in the document's "runs", so a sweep's processes follow its
// JSON; every pid positive, below 2^31, and distinct however large the world; a record
// repeating a rank, or without one, gets the lowest free pid from 1), named by a
// process_name metadata event ("zero3 W=4 units=1 rank 2", "1f1b S=2 M=8 stage 1") and
// listed in the document's order (process_sort_index). On its one thread (tid = pid, named "ranges"):
// - an "X" complete event per span (step, forward, backward, layer or unit, each
//   collective with args.bytes, optimizer, pipeline actions), ts and dur in µs;
// - a "C" counter event "memory" per memory row, args = bytes per category (one counter
//   track per category in Perfetto, stacked in chrome://tracing), and "memory total"
//   with the sum;
// - an "i" instant event at the rank's highest row ("peak 8,749,120 B").
// Times are each run's own ms since its start (every run starts at 0).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/records/result.hpp"
#include "harness/report/json_io.hpp"

namespace shardscope {

// The trace of every rank or stage record of `doc` that has a timeline; runs and ranks
// without one (skipped runs, --timeline off) add nothing.
nlohmann::json trace_document(const ResultDocument& doc);

// "zero3 W=4 units=1 rank 2", "ddp W=2 rank 0", "1f1b S=2 M=8 stage 1" (plus
// " (emulated)" when the run was), for a run and one of its rank or stage records.
std::string trace_process_name(const DataParallelRun& run, const RankRecord& rank);
std::string trace_process_name(const PipelineRun& run, const StageRecord& stage);

// The timeline of record `member` (a rank or stage) of run `run` of a document, none
// when it has none: the record's own (own_timelines), or one brought back from disk.
using TimelineSource = std::function<std::optional<TimelineRecord>(std::size_t run, std::size_t member)>;
TimelineSource own_timelines(const ResultDocument& doc);  // `doc` must outlive it

// The text of trace_document(doc) (json_text, then a newline), handed to `sink` one rank
// or stage record's events at a time, each record's timeline from `timeline_of`: one
// record's events are in memory at once.
void write_trace_text(const ResultDocument& doc, const TimelineSource& timeline_of, const TextSink& sink);

// Writes the trace of `doc` whole or not at all (write_file_atomic_streamed).
void write_trace_file(const std::string& path, const ResultDocument& doc);

}  // namespace shardscope
