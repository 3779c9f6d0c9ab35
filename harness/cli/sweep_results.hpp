// Putting a sweep's results together: the runs of each job's document, emulated ranks
// merged into one run, skipped records, and the merged shardscope/1 document.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/cli/sweep_plan.hpp"
#include "harness/report/json_io.hpp"

namespace shardscope {

// Whether the file at `path` holds complete results: a shardscope/1 document that is not
// a sweep's incomplete one ("sweep": {"complete": false}). A missing, unreadable or
// malformed file holds none.
bool holds_complete_results(const std::string& path);

// The runs of one job's document, each stamped with the document's backend, comm and
// emulated flag where the run lacks them (a sweep can mix them). Throws RunError when
// the document is not shardscope/1 or has no runs list.
std::vector<nlohmann::json> runs_of_document(const nlohmann::json& doc, const std::string& source);

// One job's runs from its emulated ranks' documents (rank r's document at index r):
// run i of rank 0, with the "ranks" (pipeline: "stages") of run i of every rank,
// sorted by rank (stage), without the run-level "rank" (the one rank an emulated run
// played: the merged run plays them all), "emulated": true. A pipeline run gets the replayed bubble of its stages' measured
// action times ("bubble_fraction_replayed" per stage, "replayed_makespan_ms"), and a
// null wall-clock "bubble_fraction" (each stage ran alone). Throws RunError when the
// documents disagree in shape.
std::vector<nlohmann::json> merge_emulated_ranks(const std::vector<nlohmann::json>& docs);

// {"kind", "skipped": true, "reason", the job's configuration...}.
nlohmann::json skipped_record(const SweepJob& job, const std::string& reason);

// {"schema": "shardscope/1", "version", "backend", "comm", "emulated", "provenance",
// "runs", "sweep"}: backend, comm and emulated are the runs' common value or "mixed"
// (no completed runs: null, null and `emulate`); provenance is the first job
// document's with "command" set to the sweep's (built here when no job completed).
// "sweep": {"jobs", "skipped", "complete", "error" (only when a job failed)}.
nlohmann::json sweep_document(const std::vector<nlohmann::json>& runs, const nlohmann::json& first_provenance,
                              const std::string& command, bool emulate, std::size_t jobs,
                              const std::string& error);

// The text readable_json(doc) + "\n" would be, handed to `sink` one rank or stage record
// at a time, each as `whole_record` gives it (itself, or with its timeline brought back
// from disk): only one record's timeline is in memory at once.
void write_results_text(const nlohmann::json& doc,
                        const std::function<nlohmann::json(const nlohmann::json&)>& whole_record, const TextSink& sink);

}  // namespace shardscope
