// Flat CSV files of a shardscope/1 document (`--csv DIR`, columns in docs/json.md, "CSV"): one per run
// kind, every row complete on its own, for spreadsheets and data frames.
//   data_parallel.csv: one row per run x rank x category (8 per rank);
//   pipeline.csv:      one row per run x stage.
// Skipped configurations have no rows. Fields are quoted as RFC 4180 says (a field
// holding a comma, a double quote, CR or LF is quoted, its quotes doubled), lines end
// in CRLF; a figure the record holds none of (null in the JSON) is an empty field. Bytes are integers, times and fractions
// are printed with 9 significant digits.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "harness/records/result.hpp"

namespace shardscope {

// One field as RFC 4180 writes it.
std::string csv_field(const std::string& text);

// The files' contents, header first (a header alone when the document has no such runs).
std::string data_parallel_csv(const ResultDocument& doc);
std::string pipeline_csv(const ResultDocument& doc);

// The files written in DIR: data_parallel.csv and pipeline.csv; and their paths in DIR.
const std::vector<std::string>& csv_file_names();
std::vector<std::string> csv_paths(const std::string& dir);

// Before any work, creating nothing: DIR is a directory where both files can be written,
// or one that can be made (json_io.hpp: check_dir_usable). Returns the folders that
// writing will make, outermost first. Throws UsageError("--csv DIR: ...") otherwise.
std::vector<std::filesystem::path> check_csv_dir(const std::string& dir);

// Makes DIR when missing and writes DIR/data_parallel.csv and DIR/pipeline.csv, each
// atomically (json_io.hpp).
void write_csv_files(const ResultDocument& doc, const std::string& dir);

}  // namespace shardscope
