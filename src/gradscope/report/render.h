// A report's files, from the analysis (analysis.h): `report.html` (html.h; self-contained:
// figures inline as SVG data, no network), `figures/NAME.{svg,png}` drawn by gnuplot from the
// `figures/NAME.{gp,dat}` written beside them (figures.h; edit and rerun `gnuplot NAME.gp` to
// restyle a figure for a paper), `runs.csv` and `steps.csv` (csv.h) and `summary.md`
// (tables.h). The same database gives the same bytes: nothing depends on the time, the
// machine or the database's path.
#pragma once

#include <string>
#include <vector>

#include "gradscope/report/analysis.h"
#include "gradscope/report/csv.h"
#include "gradscope/report/figures.h"
#include "gradscope/report/html.h"
#include "gradscope/report/tables.h"

namespace gradscope {

// Everything above into dir (created if missing). Returns the figures written.
std::vector<Figure> write_report(const ReportData& data, const std::string& dir,
                                 const std::string& gnuplot = "gnuplot");

}  // namespace gradscope
