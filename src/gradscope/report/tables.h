// The report's tables, once as data and written as Markdown or HTML: recommendations, the
// study's claims, each claim's evidence, every configuration of a model, and its runs with
// several ranks.
#pragma once

#include <string>
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
Table findings_table(const ReportData& data);
Table evidence_table(const Finding& f);
Table groups_table(const ReportData& data, const std::string& model);
// The model's configurations with several ranks and their one-process forms (scaling.h), by
// configuration and rank count: step time, tokens/s, scaling efficiency against the one-rank
// baseline, communication, and the largest rank's peak. No rows without such configurations.
Table ranks_table(const ReportData& data, const std::string& model);

// One line on where the data comes from: runs, configurations, attempts, sweeps, devices and
// LibTorch versions.
std::string provenance(const ReportData& data);

// summary.md: recommendations, findings, and every group per model, as Markdown.
std::string markdown_summary(const ReportData& data);

}  // namespace gradscope
