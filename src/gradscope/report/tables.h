// The report's tables, once as data and written as Markdown or HTML: recommendations, the
// study's claims, each claim's evidence, and every configuration of a model.
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

// One line on where the data comes from: runs, configurations, attempts, sweeps, devices and
// LibTorch versions.
std::string provenance(const ReportData& data);

// summary.md: recommendations, findings, and every group per model, as Markdown.
std::string markdown_summary(const ReportData& data);

}  // namespace gradscope
