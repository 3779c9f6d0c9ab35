// The HTML report of a shardscope/1 document (`sweep --report FILE.html`): one
// self-contained file, charts as inline SVG, styles inline, no scripts, no fonts and no
// network, readable offline in any browser.
//
// Sections: data parallel (per world and model: bytes per rank at rest and at peak by
// category with the predicted totals marked; memory over time per run and rank), pipeline
// (per schedule: a Gantt of the stages' actions with the bubbles shaded; live activation
// bytes per stage), the text tables `sweep` prints, and the command that produced it.
// Every piece of text from the document is HTML-escaped.
#pragma once

#include <string>

namespace shardscope {

struct ResultDocument;  // harness/records/result.hpp

// The page of a result's records, with their timelines; `command` (else the document's
// provenance.command) is shown as what produced it.
std::string render_html_report(const ResultDocument& doc, const std::string& command);

}  // namespace shardscope
