// `gradscope report DB --out DIR`: the report of a results database (report/analysis.h for
// what it computes, report/render.h for the files). Reads the database only.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradscope/cli/commands.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/log.h"
#include "gradscope/report/analysis.h"
#include "gradscope/report/files.h"
#include "gradscope/report/render.h"
#include "gradscope/report/timeline.h"
#include "gradscope/store/db.h"

namespace gradscope {
namespace {

struct ReportCommandOptions {
  std::string db;
  std::string out;
  std::string format = "html";
  std::vector<std::string> budgets;
  std::string gnuplot = "gnuplot";
  std::vector<std::string> memory_timelines;  // files from `run --memory-timeline`
};

// Refuses (a usage error naming --out and the file) a report folder whose files the report
// would overwrite and that a report did not write: each file of `format` that is there must be
// an earlier report's, and a figures/ folder with files in it must sit beside an earlier
// report.html.
void check_report_folder(const std::string& out, const std::string& format) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return;
  check_usage(fs::is_directory(out, ec),
              fmt::format("--out {}: it is not a folder, and the report is a folder of files", out),
              "name a new or empty folder, or one a report wrote before");
  std::vector<std::pair<std::string, OutputKind>> files = {
      {"summary.md", OutputKind::kReportSummary}};
  if (format != "md")
    files = {{"runs.csv", OutputKind::kReportTable}, {"steps.csv", OutputKind::kReportTable}};
  if (format == "html")
    files.insert(files.end(), {{"claims.csv", OutputKind::kReportTable},
                               {"summary.md", OutputKind::kReportSummary},
                               {"report.html", OutputKind::kReportPage}});
  for (const auto& [name, kind] : files)
    check_output_file("--out", (fs::path(out) / name).string(), kind);
  const fs::path figures = fs::path(out) / "figures";
  if (format == "html" && fs::exists(fs::symlink_status(figures, ec))) {
    check_usage(fs::is_directory(figures, ec) && !fs::is_symlink(figures, ec),
                fmt::format("--out {}: {} is not a folder", out, figures.string()),
                "name a new or empty folder, or one a report wrote before");
    check_usage(fs::is_empty(figures, ec) || fs::exists(fs::path(out) / "report.html", ec),
                fmt::format("--out {}: {} holds files and no report.html is beside it, so they "
                            "are not an earlier report's figures, which this report would "
                            "overwrite",
                            out, figures.string()),
                "name a new or empty folder, or one a report wrote before");
  }
}

}  // namespace

void add_report_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<ReportCommandOptions>();
  CLI::App* cmd = root.add_subcommand(
      "report",
      "Build the report of a results database: recommendations (per model and memory budget,\n"
      "the optimizer and strategy with the lowest validation loss at equal gradient\n"
      "evaluations that fits), the study's claims re-examined with verdicts (at equal steps,\n"
      "samples and gradient evaluations; named contrasts, 3 seeds a side, Holm at 95%),\n"
      "figures (loss by steps, samples, gradient evaluations, FLOPs, time and energy; memory by\n"
      "component; time by phase; utilization; energy; loss against memory) and tables. Seeds\n"
      "of one configuration are pooled: mean with a 95% interval.\n"
      "  --format html (default): DIR/report.html (self-contained), DIR/figures/*.svg|png\n"
      "      (with each figure's gnuplot script and data), runs.csv, steps.csv, claims.csv,\n"
      "      summary.md\n"
      "  --format md: print the tables as Markdown (and write DIR/summary.md with --out)\n"
      "  --format csv: write DIR/runs.csv and DIR/steps.csv only\n"
      "  --memory-timeline FILE (html, up to 2): a section with the memory timeline a run\n"
      "      wrote (`gradscope run --memory-timeline FILE`), beside its memory estimate\n"
      "The same database always gives the same files.\n"
      "Example: gradscope report runs.db --out report/ && xdg-open report/report.html");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("db", o->db, "Results database (from `gradscope run/sweep --db`)")->required();
  cmd->add_option("--out", o->out, "Folder to write the report into (created if missing)");
  cmd->add_option("--format", o->format, "html, md or csv")
      ->check(CLI::IsMember({"html", "md", "csv"}))
      ->capture_default_str();
  cmd->add_option("--memory-budget", o->budgets,
                  "Also recommend for this memory budget, e.g. 8GiB (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--gnuplot", o->gnuplot, "The gnuplot executable that draws the figures")
      ->capture_default_str();
  cmd->add_option("--memory-timeline", o->memory_timelines,
                  "Add the memory timeline of this file from `gradscope run --memory-timeline` "
                  "(repeatable, at most 2: shown one above the other)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->callback([o, &exit_code] {
    check_usage(optional_input_file(o->db, "database"), fmt::format("no database at {}", o->db),
                "pass the file given to `gradscope run --db` or `gradscope sweep --db`");
    check_usage(o->format == "md" || !o->out.empty(),
                fmt::format("--format {} needs --out DIR", o->format), "add e.g. --out report/");
    ReportOptions options;
    for (const auto& b : o->budgets) {
      const int64_t bytes = parse_bytes(b);
      check_usage(bytes > 0, fmt::format("--memory-budget {} must be positive", b));
      options.memory_budgets.push_back(bytes);
    }
    check_usage(o->memory_timelines.size() <= kMaxReportTimelines,
                fmt::format("--memory-timeline given {} times; a report shows at most {}",
                            o->memory_timelines.size(), kMaxReportTimelines),
                "pass one or two timeline files");
    check_usage(o->memory_timelines.empty() || o->format == "html",
                fmt::format("--memory-timeline is drawn in report.html, not in --format {}",
                            o->format),
                "leave out --format, or --memory-timeline");
    if (!o->out.empty()) check_report_folder(o->out, o->format);
    // Read before the database, so that a bad file is refused before anything is written.
    std::vector<ReportTimeline> timelines;
    for (const std::string& path : o->memory_timelines)
      timelines.push_back(load_report_timeline(path));
    Database db(o->db, DatabaseAccess::kReadOnly);
    ReportData data = analyze(db, options);
    data.timelines = std::move(timelines);
    if (o->format == "md") {
      const std::string md = markdown_summary(data);
      fmt::print("{}", terminal_text(md));  // record text, on a terminal: no control characters
      if (!o->out.empty()) {
        make_folder(o->out);
        write_file(std::filesystem::path(o->out) / "summary.md", md);
      }
    } else if (o->format == "csv") {
      make_folder(o->out);
      write_file(std::filesystem::path(o->out) / "runs.csv", runs_csv(data));
      write_file(std::filesystem::path(o->out) / "steps.csv", steps_csv(data));
      fmt::print("wrote {0}/runs.csv and {0}/steps.csv ({1} runs)\n", terminal_text(o->out),
                 data.runs.size());
    } else {
      const auto figures = write_report(data, o->out, o->gnuplot);
      fmt::print("{} runs in {} configurations, {} figures\n", data.runs.size(), data.groups.size(),
                 figures.size());
      // Each claim's verdicts, then the headline behind the one at equal steps (the measured
      // figures while there is no headline), as data: no control characters reach the terminal.
      fmt::print("  {:<20} {:<20} {:<20} {:<28} {}\n", "claim", "at equal steps",
                 "equal samples", "equal gradient evaluations", "headline");
      for (const Finding& f : data.findings)
        fmt::print("  {:<20} {:<20} {:<20} {:<28} {}\n", f.id, verdict_name(f.verdict),
                   verdict_name(f.verdict_equal_samples),
                   verdict_name(f.verdict_equal_evaluations),
                   terminal_text(f.headline.empty() ? f.measured : f.headline));
      fmt::print("report: {}/report.html\n", terminal_text(o->out));
    }
    exit_code = 0;
  });
}

}  // namespace gradscope
