// A report's files, from the analysis (analysis.h): `report.html` (self-contained: figures
// inline as SVG data, no network), `figures/NAME.{svg,png}` drawn by gnuplot from the
// `figures/NAME.{gp,dat}` written beside them (edit and rerun `gnuplot NAME.gp` to restyle a
// figure for a paper), `runs.csv`, `steps.csv` and `summary.md`. The same database gives the
// same bytes: nothing depends on the time, the machine or the database's path.
#pragma once

#include <string>
#include <vector>

#include "gradscope/report/analysis.h"

namespace gradscope {

struct Figure {
  std::string name;     // file stem under figures/
  std::string section;  // a model's name, or "" for the cross-model figures
  std::string kind;     // "loss", "memory", "phases", "pareto", "utilization", "energy"
  std::string axis;     // loss figures: steps, samples, time or energy
  std::string title, caption;
};

// The Markdown tables: recommendations, findings, and every group per model.
std::string markdown_summary(const ReportData& data);

// runs.csv: one row per run (latest attempt of each run_id). steps.csv: one row per step
// with a finite loss, with cumulative samples, tokens, time and energy.
std::string runs_csv(const ReportData& data);
std::string steps_csv(const ReportData& data);

// Writes figures/NAME.{dat,gp} for every figure the data allows and draws them with
// `gnuplot` (the executable to run). Throws a runtime error naming the figure when gnuplot
// fails, and a usage error when it cannot be started.
std::vector<Figure> write_figures(const ReportData& data, const std::string& dir,
                                  const std::string& gnuplot = "gnuplot");

// The self-contained HTML page, given the figures already drawn under dir/figures.
std::string report_html(const ReportData& data, const std::vector<Figure>& figures,
                        const std::string& dir);

// Everything above into dir (created if missing). Returns the figures written.
std::vector<Figure> write_report(const ReportData& data, const std::string& dir,
                                 const std::string& gnuplot = "gnuplot");

}  // namespace gradscope
