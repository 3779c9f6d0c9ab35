// Text tables of a shardscope/1 document (docs/design.md §6, §7): what `run` and `sweep` print.
//
// Runs are grouped by world, model and setup (backend, comm, emulated). A data-parallel
// group prints a resting table and a peak/communication/time table, one row per run,
// or one row per rank when ranks differ in any byte figure. A pipeline group prints
// one table, one row per stage of each (schedule, micro-batches, chunks) run. Skipped configurations are listed last with their reasons.
// Bytes are exact with thousands separators; "× 4P" is a multiple of the model's
// fp32 weight bytes (model.param_bytes); a predicted figure that differs from the
// measured one is marked " !". Missing fields print "-".
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/report/cells.hpp"

namespace shardscope {

struct ResultDocument;  // harness/records/result.hpp
struct PlanDocument;
struct SkippedRun;

// By default every line fits TableOptions::kColumns (120): bytes in binary units, a
// setting all rows share stated once above the table, "=" for a prediction equal to its
// measured figure. The tables render the records (table_parts.hpp has their parts).
void print_tables(const ResultDocument& doc, std::ostream& os, const TableOptions& options = {});

struct Comparison;  // comparison.hpp

// What `shardscope compare` found (compare_documents) as a table (table_compare.cpp).
void print_comparison(const Comparison& comparison, std::ostream& os, const TableOptions& options = {});

// A `shardscope plan` document (schema shardscope-plan/1) as tables (table_plan.cpp).
void print_plan(const PlanDocument& plan, std::ostream& os, const TableOptions& options = {});

// The configurations that could not run (a sweep's or a plan's), with their reasons.
void print_skipped(const std::vector<const SkippedRun*>& skipped, std::ostream& os);

// The line under the tables that says how bytes are written (and, with `predictions`,
// what "=" in a predicted column means).
std::string bytes_footnote(const TableOptions& options, bool predictions = true);

// What follows reads a sweep's configuration (a skipped record's) as JSON.

// A short name for a run or skipped record: "zero3 W=4 units=1",
// "1f1b S=2 M=8".
std::string run_label(const nlohmann::json& run);
// A sweep's record of a configuration that could not run ("skipped": true).
bool is_skipped(const nlohmann::json& run);

}  // namespace shardscope
