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

}  // namespace gradscope
