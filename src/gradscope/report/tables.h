// The report's tables, once as data and written as Markdown or HTML: recommendations, the
// study's claims, each claim's evidence, every configuration of a model, and its runs with
// several ranks.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "gradscope/report/analysis.h"

namespace gradscope {

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

std::string markdown_table(const Table& t);
std::string html_table(const Table& t, const std::string& css_class = "");

Table recommendations_table(const ReportData& data);

// A recommendation as the page shows it: the answer in one short line (what to use, the loss
// behind it, and the point and seeds that loss was read at), and what stands behind it as
// labelled lists, shown on request: the budget's source, the configurations not significantly
// worse, the samples, time and energy to the point, what was not ranked and what does not fit.
struct RecommendationView {
  std::string budget;        // "5.01 MiB", "no limit"
  std::string pick;          // "tiny: sgd, standard", "nothing measured fits", "nothing ranked"
  std::string loss;          // "validation 3.2782 ± 0.0216", "n/a"
  std::string scale;         // "at 256 gradient evaluations, 3 seeds", "-"
  std::string alternatives;  // the one not significantly worse, "2 configurations", "none"
  std::vector<std::pair<std::string, std::vector<std::string>>> details;
};
RecommendationView recommendation_view(const ReportData& data, const Recommendation& r);

Table findings_table(const ReportData& data);
Table evidence_table(const Finding& f);
Table groups_table(const ReportData& data, const std::string& model);
// The model's configurations with several ranks and their one-process forms (scaling.h), by
// configuration and rank count: step time, tokens/s, scaling efficiency against the one-rank
// baseline, communication, and the largest rank's peak. No rows without such configurations.
Table ranks_table(const ReportData& data, const std::string& model);

// What would have fitted a run that ran out of memory, in one short line: "would have fitted:
// --batch 6, or --loss chunked (chunked loss)"; the estimate's answer as its record keeps it.
std::string fit_hint_text(const MemoryFit& fit);

// One line on where the data comes from: runs, configurations, attempts, sweeps, devices and
// LibTorch versions.
std::string provenance(const ReportData& data);

// summary.md: recommendations, findings, and every group per model, as Markdown.
std::string markdown_summary(const ReportData& data);

}  // namespace gradscope
