#include "gradscope/report/link_figure.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "gradscope/report/encode.h"

namespace gradscope {
namespace {

struct LinkPoint {
  double mbit_s = 0;   // the link as measured when the ranks met
  double step_ms = 0;  // the run's median step
  double wait_ms = NAN;  // the ranks' mean wait on collectives per step
};

// A run's point, when its ranks were on several hosts and it measured the link.
std::optional<LinkPoint> point_of(const ReportRun& run) {
  const RunRecord& r = run.record;
  if (!r.ok() || !r.distributed || !r.distributed->link || r.distributed->nnodes < 2 ||
      !r.time || !r.time->step_median_s || !std::isfinite(*r.time->step_median_s))
    return std::nullopt;
  LinkPoint p;
  p.mbit_s = r.distributed->link->bus_bytes_per_s * 8 / 1e6;
  p.step_ms = *r.time->step_median_s * 1e3;
  double sum = 0;
  int n = 0;
  for (const RankFigures& f : r.distributed->ranks)
    if (f.comm_wait_per_step_s) {
      sum += *f.comm_wait_per_step_s;
      ++n;
    }
  if (n > 0) p.wait_ms = sum / n * 1e3;
  if (!(p.mbit_s > 0) || !std::isfinite(p.mbit_s)) return std::nullopt;
  return p;
}

}  // namespace

std::optional<FigurePlot> link_figure(const GroupedRuns& data, const std::string& model,
                                      const char* const* palette, size_t colors) {
  // A line per configuration but for its --network: the runs on other links.
  std::map<std::string, std::vector<LinkPoint>> lines;
  std::map<std::string, std::string> titles;
  size_t points = 0, disturbed = 0;
  for (const Group& g : data.groups) {
    if (g.model != model) continue;
    const std::string key = key_without(g, {"network"});
    for (size_t i : g.ok_runs) {
      const auto p = point_of(data.runs[i]);
      if (!p) continue;
      // The group's label but for its network, and the hosts as the ranks counted them.
      std::string label = g.label;
      const size_t at = label.find("network=");
      if (at != std::string::npos) {
        const size_t end = label.find_first_of(" ,", at);
        label.erase(at, end == std::string::npos ? std::string::npos : end - at + 1);
      }
      while (!label.empty() && (label.back() == ' ' || label.back() == ',')) label.pop_back();
      titles[key] = fmt::format("{} ({} hosts)", label, data.runs[i].record.distributed->nnodes);
      lines[key].push_back(*p);
      ++points;
      disturbed += data.runs[i].timing_disturbed() ? 1 : 0;
    }
  }
  if (points < 2) return std::nullopt;
  FigurePlot plot;
  plot.figure.name = "link-" + file_slug(model);
  plot.figure.section = model;
  plot.figure.kind = "link";
  plot.figure.title = model + ": step time against the link";
  std::string step_plots, wait_plots;
  size_t index = 0;
  for (auto& [key, pts] : lines) {
    const std::string& label = titles[key];
    std::sort(pts.begin(), pts.end(),
              [](const LinkPoint& a, const LinkPoint& b) { return a.mbit_s < b.mbit_s; });
    std::string rows;
    for (const LinkPoint& p : pts)
      rows += fmt::format("{}\t{}\t{}\n", gnuplot_number(p.mbit_s), gnuplot_number(p.step_ms),
                          gnuplot_number(p.wait_ms));
    plot.data += fmt::format("# {}\n{}\n\n", gnuplot_datum(label), rows);
    const std::string style = fmt::format("with linespoints lw 2 pt 7 ps 0.8 lc rgb '{}' title {}",
                                          palette[index % colors], gnuplot_string(label));
    step_plots += fmt::format("{}'{}.dat' index {} using 1:2 {}", step_plots.empty() ? "" : ", ",
                              plot.figure.name, index, style);
    wait_plots += fmt::format("{}'{}.dat' index {} using 1:3 {}", wait_plots.empty() ? "" : ", ",
                              plot.figure.name, index, style);
    ++index;
  }
  plot.body =
      "  set multiplot layout 1,2\n  set key top right font \",10\"\n  set grid\n"
      "  set logscale xy\n  set xlabel 'link, measured (Mbit/s)'\n"
      "  set ylabel 'median step time (ms)'\n  plot " + step_plots + "\n"
      "  set ylabel 'waiting on collectives (ms per step)'\n  plot " + wait_plots + "\n"
      "  unset multiplot\n";
  plot.width = 920;
  plot.height = 400;
  plot.figure.caption = fmt::format(
      "Runs whose ranks were on several hosts: the median step time, and the time per step the "
      "ranks waited on collectives (the communication backward did not hide; the mean over "
      "ranks of distributed.ranks[].comm_wait_per_step_s), against the link's bandwidth as "
      "each run measured it when its ranks met (distributed.link, the ring's bus bandwidth), "
      "one line per configuration but for its --network. {} of the {} runs were marked "
      "disturbed: on test hosts of one machine the other host's ranks share its cores; they "
      "are drawn all the same, since what differs between the points is the link.",
      disturbed, points);
  return plot;
}

}  // namespace gradscope
