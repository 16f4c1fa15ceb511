// report.html: the whole report on one self-contained page. Figures are inlined as SVG data,
// so the file needs no network and can be mailed or archived on its own.
#pragma once

#include <string>
#include <vector>

#include "gradscope/report/analysis.h"
#include "gradscope/report/figures.h"

namespace gradscope {

// The page, given the figures already drawn under dir/figures.
std::string report_html(const ReportData& data, const std::vector<Figure>& figures,
                        const std::string& dir);

// The CSS class of a verdict's badge ("v-not-enough-data"): one class name, no space.
const char* verdict_class(Verdict v);

// The claims table: one short row per claim (the claim, its verdict, its headline and the
// scale of its deciding runs), each followed by a row holding a closed disclosure with the
// rule, the correction, the contrasts, the verdicts at the other bases, the evidence and the
// notes.
std::string claims_table_html(const std::vector<Finding>& findings);

// The recommendations table: one short row per model and budget (recommendation_view), each
// followed by a row holding a closed disclosure with what stands behind it.
std::string recommendations_table_html(const ReportData& data);

}  // namespace gradscope
