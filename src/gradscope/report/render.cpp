#include "gradscope/report/render.h"

#include <filesystem>

#include "gradscope/report/files.h"

namespace gradscope {

std::vector<Figure> write_report(const ReportData& data, const std::string& dir,
                                 const std::string& gnuplot) {
  const std::filesystem::path root = dir;
  make_folder(root);
  write_file(root / "runs.csv", runs_csv(data));
  write_file(root / "steps.csv", steps_csv(data));
  write_file(root / "claims.csv", claims_csv(data.findings));
  write_file(root / "summary.md", markdown_summary(data));
  std::vector<Figure> figures = write_figures(data, dir, gnuplot);
  write_file(root / "report.html", report_html(data, figures, dir));
  return figures;
}

}  // namespace gradscope
