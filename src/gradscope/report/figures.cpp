#include "gradscope/report/figures.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/report/encode.h"
#include "gradscope/report/files.h"
#include "gradscope/report/gnuplot.h"
#include "gradscope/report/link_figure.h"
#include "gradscope/report/scaling.h"

namespace gradscope {

namespace fs = std::filesystem;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
const char* const kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
constexpr size_t kCurvePoints = 200;  // points per drawn loss curve (bucket means)

// Where the runs' energy figures come from ("nvml", "estimate", ...), for captions.
std::string energy_sources(const GroupedRuns& data) {
  std::set<std::string> sources;
  for (const ReportRun& r : data.runs)
    if (r.record.energy && r.record.energy->source && !r.record.energy->source->empty())
      sources.insert(*r.record.energy->source);
  std::string text;
  for (const auto& s : sources) text += (text.empty() ? "" : ", ") + s;
  return text;
}

// A group's label without its strategy (a loss panel is one strategy).
std::string short_label(const Group& g) {
  std::string label = g.label;
  const std::string part = ", " + g.strategy;
  const size_t at = label.find(part);
  if (at != std::string::npos) label.erase(at, part.size());
  return label;
}

class FigureWriter {
 public:
  FigureWriter(const GroupedRuns& data, fs::path dir, std::string gnuplot)
      : data_(data), dir_(std::move(dir)), gnuplot_(std::move(gnuplot)) {
    std::set<std::string> optimizers;
    for (const Group& g : data.groups) optimizers.insert(g.optimizer);
    size_t i = 0;
    for (const auto& o : optimizers) color_[o] = kPalette[i++ % std::size(kPalette)];
  }

  std::vector<Figure> write_all() {
    for (const std::string& model : data_.models) {
      for (Axis axis : {Axis::kSteps, Axis::kSamples, Axis::kEvaluations, Axis::kFlops, Axis::kTime,
                        Axis::kEnergy})
        loss_figure(model, axis);
      memory_figure(model);
      rank_memory_figure(model);
      phases_figure(model);
      scaling_figure(model);
      if (auto plot = link_figure(data_, model, kPalette, std::size(kPalette)))
        emit(plot->figure, plot->width, plot->height, plot->data, plot->body);
      pareto_figure(model);
    }
    utilization_figure();
    energy_figure();
    return figures_;
  }

 private:
  void emit(Figure f, int width, int height, const std::string& data, const std::string& body) {
    // Slugs of different names differ (encode.h) unless a 64-bit hash collides: never let one
    // figure overwrite another's files.
    if (!names_.insert(f.name).second)
      fail_runtime("two figures would share the name " + f.name,
                   "two model names in the database have the same slug; rename one");
    write_file(dir_ / (f.name + ".dat"), data);
    write_file(dir_ / (f.name + ".gp"), gnuplot_script(f.name, width, height, body));
    run_gnuplot(gnuplot_, dir_, f.name);
    figures_.push_back(std::move(f));
  }

  std::vector<size_t> groups_of(const std::string& model) const {
    std::vector<size_t> out;
    for (size_t i = 0; i < data_.groups.size(); ++i)
      if (data_.groups[i].model == model) out.push_back(i);
    return out;
  }

  // A group's loss curve on an axis: per seed, bucket means of kCurvePoints buckets of steps;
  // then per bucket the mean over seeds with its 95% band. Rows: x, mean, lo, hi.
  // The runs a curve on `axis` draws: the ok ones, and on the time and energy axes only those
  // whose timings were not disturbed (groups.h).
  std::vector<size_t> runs_on(const Group& g, Axis axis) const {
    std::vector<size_t> out;
    for (size_t r : g.ok_runs)
      if (!measured_axis(axis) || !data_.runs[r].timing_disturbed()) out.push_back(r);
    return out;
  }

  std::string curve_block(const Group& g, Axis axis) const {
    const std::vector<size_t> runs = runs_on(g, axis);
    size_t n = SIZE_MAX;
    for (size_t r : runs) n = std::min(n, data_.runs[r].curve.size());
    if (runs.empty() || n == 0 || n == SIZE_MAX) return "";
    const size_t buckets = std::min(n, kCurvePoints);
    std::string rows;
    for (size_t b = 0; b < buckets; ++b) {
      const size_t from = b * n / buckets, to = (b + 1) * n / buckets;
      std::vector<double> xs, ys;
      for (size_t r : runs) {
        double x = 0, y = 0;
        for (size_t i = from; i < to; ++i) {
          x += data_.runs[r].curve[i].at(axis);
          y += data_.runs[r].curve[i].loss;
        }
        xs.push_back(x / double(to - from));
        ys.push_back(y / double(to - from));
      }
      const Interval x = mean_interval(xs), y = mean_interval(ys);
      if (!std::isfinite(x.mean)) return "";
      rows += fmt::format("{}\t{}\t{}\t{}\n", gnuplot_number(x.mean), gnuplot_number(y.mean),
                          gnuplot_number(y.lo()), gnuplot_number(y.hi()));
    }
    return rows;
  }

  void loss_figure(const std::string& model, Axis axis) {
    std::vector<std::string> strategies;
    for (size_t i : groups_of(model)) {
      const std::string& s = data_.groups[i].strategy;
      if (std::find(strategies.begin(), strategies.end(), s) == strategies.end())
        strategies.push_back(s);
    }
    std::string dat_text, body;
    int index = 0, drawn = 0;
    const int cols = std::min<int>(3, static_cast<int>(strategies.size()));
    const int rows = (static_cast<int>(strategies.size()) + cols - 1) / std::max(cols, 1);
    body += fmt::format("  set multiplot layout {},{}\n  set key top right font \",10\"\n", rows,
                        std::max(cols, 1));
    body += fmt::format("  set xlabel {}\n  set ylabel 'training loss'\n  set grid\n",
                        gnuplot_string(axis_label(axis)));
    bool any_band = false;
    for (const std::string& strategy : strategies) {
      std::string plots;
      std::map<std::string, int> seen;
      for (size_t i : groups_of(model)) {
        const Group& g = data_.groups[i];
        if (g.strategy != strategy) continue;
        const std::string block = curve_block(g, axis);
        if (block.empty()) continue;
        dat_text += fmt::format("# {}\n{}\n\n", gnuplot_datum(g.label), block);
        const int dash = 1 + seen[g.optimizer]++;
        const size_t seeds = runs_on(g, axis).size();
        if (seeds > 1) {
          any_band = true;
          plots += fmt::format(
              "'{}.dat' index {} using 1:3:4 with filledcurves fc rgb '{}' fs transparent solid "
              "0.2 noborder notitle, ",
              figure_name("loss", model, axis), index, color_.at(g.optimizer));
        }
        plots += fmt::format(
            "'{}.dat' index {} using 1:2 with lines lw 2 dt {} lc rgb '{}' title {}, ",
            figure_name("loss", model, axis), index, dash, color_.at(g.optimizer),
            gnuplot_string(short_label(g) +
                           (seeds > 1 ? fmt::format(" ({} seeds)", seeds) : "")));
        ++index;
        ++drawn;
      }
      body += fmt::format("  set title {}\n", gnuplot_string(strategy));
      if (plots.empty()) {
        body +=
            "  unset key\n  set label 1 'no data' at graph 0.5,0.5 center\n"
            "  plot [0:1][0:1] NaN notitle\n  unset label 1\n  set key\n";
      } else {
        plots.resize(plots.size() - 2);
        body += "  plot " + plots + "\n";
      }
    }
    body += "  unset multiplot\n";
    if (drawn == 0) return;  // e.g. no energy figure in any run
    Figure f;
    f.name = figure_name("loss", model, axis);
    f.section = model;
    f.kind = "loss";
    f.axis = axis_name(axis);
    f.title = fmt::format("{}: training loss by {}", model, axis_label(axis));
    f.caption = fmt::format(
        "Training loss (bucket means of {} points per curve) against {}; one panel per memory "
        "strategy, one line per configuration.{}{}",
        kCurvePoints, axis_label(axis), any_band ? " Shaded: 95% confidence band over seeds." : "",
        axis == Axis::kEnergy
            ? fmt::format(" Energy ({}) is each timed step's own reading; warm-up steps are "
                          "charged at the run's mean power.",
                          energy_sources(data_))
        : axis == Axis::kEvaluations
            ? std::string(" One gradient evaluation is one sample through one forward and "
                          "backward pass; a line search (CG) spends several per step, so equal "
                          "evaluations is equal compute.")
        : axis == Axis::kFlops
            ? std::string(" Hardware FLOPs: the record's FLOPs per forward-backward pass, "
                          "recomputation included, times the passes.")
            : std::string());
    emit(f, 440 * std::max(cols, 1) + 40, 360 * rows + 20, dat_text, body);
  }

  static std::string figure_name(const std::string& kind, const std::string& model, Axis axis) {
    return fmt::format("{}-{}-{}", kind, file_slug(model), axis_name(axis));
  }

  // Stacked bars, one per group: rows "label\tv1\tv2...", series titles and colors.
  //
  // The bars lie horizontally, one row per group with its label beside it, read level. Labels
  // are configurations ("adam, standard batch=16 lr=0.003"): rotated under upright bars they
  // needed a margin as deep as the longest one, and left wide blank areas under the short
  // ones. Level labels need only a left margin as wide as the longest label, computed from it,
  // and the figure grows by a fixed height per bar, so no area is left blank.
  void stacked_bars(Figure f, const std::vector<std::string>& labels,
                    const std::vector<std::vector<double>>& values,
                    const std::vector<std::string>& series, const std::string& value_label) {
    std::string dat_text = "# label";
    for (const auto& s : series) dat_text += "\t" + gnuplot_datum(s);
    dat_text += "\n";
    for (size_t i = 0; i < labels.size(); ++i) {
      dat_text += gnuplot_datum(labels[i]);
      for (double v : values[i]) dat_text += "\t" + gnuplot_number(v);
      dat_text += "\n";
    }
    // gnuplot's margins are in character cells: 8.4 px in the SVG at 12 pt, where a sans label
    // averages about 0.8 of a cell per character, and 8 px in the PNG at 10 pt, where it
    // averages about 0.95 (cairo draws points at 96 per inch). Each format gets its own left
    // margin, with 2 cells to spare; the figure is as wide as the wider of the two needs.
    // Beyond kMaxLabel characters a label runs off the left edge rather than squeeze the bars.
    constexpr size_t kMaxLabel = 90;
    size_t longest = 0, longest_series = 0;
    for (const auto& l : labels) longest = std::max(longest, std::min(l.size(), kMaxLabel));
    for (const auto& s : series) longest_series = std::max(longest_series, s.size());
    const double chars = static_cast<double>(longest);
    const int svg_margin = static_cast<int>(std::ceil(0.85 * chars)) + 2;
    const int png_margin = static_cast<int>(longest) + 2;
    // One series needs no key: the axis label names it.
    const bool key = series.size() > 1;
    const int key_px = key ? static_cast<int>(8.4 * static_cast<double>(longest_series + 7)) : 0;
    const int rows = static_cast<int>(labels.size());
    std::string body = fmt::format(
        "  set style fill solid 0.85 border rgb '#333333'\n  {}\n  set grid xtics\n"
        "  set xlabel {}\n  set xrange [0:*]\n  set yrange [{}:-0.5]\n  set ytics scale 0\n"
        "  set lmargin (format eq 'svg' ? {} : {})\n{}"
        "  # The left end of column c's bar: the sum of the columns before it.\n"
        "  lo(c) = c <= 2 ? 0 : sum [k=2:c-1] column(k)\n  plot ",
        key ? "set key outside right top vertical Left reverse" : "unset key",
        gnuplot_string(value_label), rows - 0.5, svg_margin, png_margin,
        key ? "" : "  set rmargin 4\n");  // the key's width is the right margin
    for (size_t s = 0; s < series.size(); ++s) {
      const size_t c = s + 2;
      body += fmt::format(
          "{}'{}.dat' using (lo({})+column({})/2):0:(lo({})):(lo({})+column({})):($0-0.35):"
          "($0+0.35){} with boxxyerror title {} lc rgb '{}'",
          s ? ", \\\n       " : "", f.name, c, c, c, c, c, s == 0 ? ":ytic(1)" : "",
          gnuplot_string(series[s]), kPalette[s % std::size(kPalette)]);
    }
    body += "\n";
    const int width = std::max(8 * png_margin, static_cast<int>(8.4 * svg_margin)) + 560 + key_px;
    const int height = std::max(26 * rows, key ? 20 * static_cast<int>(series.size()) : 0) + 90;
    emit(std::move(f), width, height, dat_text, body);
  }

  // One stacked bar per configuration of the model that has the components `parts` of
  // `member` (memory breakdown or phase times), each mean scaled by `scale`.
  void component_figure(const std::string& model,
                        const std::map<std::string, Interval> Group::*member,
                        const std::vector<std::string>& parts, double scale, Figure f,
                        const std::vector<std::string>& series,
                        const std::string& value_label) {
    std::vector<std::string> labels;
    std::vector<std::vector<double>> values;
    for (size_t i : groups_of(model)) {
      const auto& by_part = data_.groups[i].*member;
      if (by_part.empty()) continue;
      std::vector<double> row;
      for (const std::string& part : parts) {
        auto it = by_part.find(part);
        row.push_back(it == by_part.end() ? 0.0 : scale * it->second.mean);
      }
      labels.push_back(data_.groups[i].label);
      values.push_back(row);
    }
    if (labels.empty()) return;
    f.section = model;
    stacked_bars(f, labels, values, series, value_label);
  }

  // Whether a group of the model has the component `part` of `member`.
  bool any_has(const std::string& model, const std::map<std::string, Interval> Group::*member,
               const std::string& part) const {
    for (size_t i : groups_of(model))
      if ((data_.groups[i].*member).count(part)) return true;
    return false;
  }

  void memory_figure(const std::string& model) {
    Figure f;
    f.name = "memory-" + file_slug(model);
    f.kind = "memory";
    f.title = model + ": peak memory by component";
    f.caption =
        "Memory at the step's peak, by what holds it (memory.breakdown in each record; mean over "
        "seeds). Other: the batch, workspace and allocator overhead.";
    // Collective buffers only where a run had several ranks (or a shard).
    std::vector<std::string> parts, series;
    for (const std::string& part : breakdown_parts()) {
      if (part == "collective_buffers" && !any_has(model, &Group::memory, part)) continue;
      parts.push_back(part);
      series.push_back(breakdown_label(part));
    }
    if (any_has(model, &Group::memory, "collective_buffers"))
      f.caption +=
          " With several ranks these are rank 0's; collective buffers: the buckets being "
          "reduced and the shards being gathered.";
    component_figure(model, &Group::memory, parts, 1.0 / kMiB, f, series, "MiB");
  }

  // Per configuration with several ranks: each rank's breakdown at its own peak, after the
  // same configuration in one process where the database has it.
  void rank_memory_figure(const std::string& model) {
    const std::vector<std::string>& parts = breakdown_parts();
    const auto row_of = [&](const std::map<std::string, Interval>& by_part) {
      std::vector<double> row;
      for (const std::string& part : parts) {
        const auto it = by_part.find(part);
        row.push_back(it == by_part.end() ? 0.0 : it->second.mean / kMiB);
      }
      return row;
    };
    std::vector<std::string> labels;
    std::vector<std::vector<double>> values;
    std::set<size_t> shown;  // one-process groups already drawn
    bool beside = false;
    for (size_t i : groups_of(model)) {
      const Group& g = data_.groups[i];
      if (!distributed_group(g) || g.rank_memory.empty()) continue;
      const std::optional<size_t> one = one_process_group(data_, i);
      if (one && !data_.groups[*one].memory.empty() && shown.insert(*one).second) {
        labels.push_back(data_.groups[*one].base_label + ": 1 process");
        values.push_back(row_of(data_.groups[*one].memory));
        beside = true;
      }
      for (size_t k = 0; k < g.rank_memory.size(); ++k) {
        if (g.rank_memory[k].empty()) continue;
        labels.push_back(fmt::format("{}, {}: rank {}", g.base_label, ranks_text(g), k));
        values.push_back(row_of(g.rank_memory[k]));
      }
    }
    if (labels.empty()) return;
    Figure f;
    f.name = "rank-memory-" + file_slug(model);
    f.section = model;
    f.kind = "rank-memory";
    f.title = model + ": memory per rank";
    f.caption = std::string(
                    "Each rank's memory at its own peak, by what holds it "
                    "(distributed.ranks[].breakdown in each record; mean over seeds)") +
                (beside ? ", beside the same configuration in one process (the same per-rank "
                          "batch): what sharding saves is the difference."
                        : ".") +
                " Collective buffers: the buckets being reduced and the shards being gathered.";
    std::vector<std::string> series;
    for (const std::string& part : parts) series.push_back(breakdown_label(part));
    stacked_bars(f, labels, values, series, "MiB");
  }

  void phases_figure(const std::string& model) {
    Figure f;
    f.name = "phases-" + file_slug(model);
    f.kind = "phases";
    f.title = model + ": time per step by phase";
    f.caption =
        "Mean time per timed step in each phase (the phase totals over timed steps); checkpointed "
        "runs recompute their forward inside backward.";
    std::vector<std::string> phases = {"data", "forward", "backward", "optimizer"};
    if (any_has(model, &Group::phase_s, "communication")) {
      phases.insert(phases.begin() + 3, "communication");
      f.caption += " Communication: rank 0's wait on collectives between ranks (time.comm_s).";
    }
    component_figure(model, &Group::phase_s, phases, 1e3, f, phases, "ms per step");
  }

  // Per model with runs on at least two rank counts: median step time, tokens per second and
  // scaling efficiency against the number of ranks, one line per shard mode (scaling.h).
  void scaling_figure(const std::string& model) {
    const std::vector<ScalingLine> lines = scaling_lines(data_, model);
    if (rank_counts(data_, lines) < 2) return;
    const std::string name = "scaling-" + file_slug(model);
    // Columns: ranks, step time (mean, lo, hi), tokens/s, efficiency (%).
    constexpr int kStepColumn = 2, kTokensColumn = 5, kEfficiencyColumn = 6;
    std::string dat_text;
    std::map<int, std::vector<bool>> drawn;  // column -> per line: any finite value
    for (const ScalingLine& line : lines) {
      std::string rows;
      bool step = false, tokens = false, efficiency = false;
      for (size_t i : line.groups) {
        const Group& g = data_.groups[i];
        const double e = 100 * scaling_efficiency(data_, i);
        const double step_mean = g.step_s.n ? g.step_s.mean : kNaN;
        const double tokens_mean = g.tokens_per_s.n ? g.tokens_per_s.mean : kNaN;
        step = step || std::isfinite(step_mean);
        tokens = tokens || std::isfinite(tokens_mean);
        efficiency = efficiency || std::isfinite(e);
        rows += fmt::format("{}\t{}\t{}\t{}\t{}\t{}\n", g.config.nproc, gnuplot_number(step_mean),
                            gnuplot_number(g.step_s.n ? g.step_s.lo() : kNaN),
                            gnuplot_number(g.step_s.n ? g.step_s.hi() : kNaN),
                            gnuplot_number(tokens_mean), gnuplot_number(e));
      }
      dat_text += fmt::format("# {}\n{}\n\n", gnuplot_datum(line.title), rows);
      drawn[kStepColumn].push_back(step);
      drawn[kTokensColumn].push_back(tokens);
      drawn[kEfficiencyColumn].push_back(efficiency);
    }
    const auto any = [](const std::vector<bool>& v) {
      return std::find(v.begin(), v.end(), true) != v.end();
    };
    if (!any(drawn[kStepColumn])) return;
    struct Panel {
      int column;
      const char* ylabel;
    };
    std::vector<Panel> panels = {{kStepColumn, "median step time (s)"}};
    if (any(drawn[kTokensColumn])) panels.push_back({kTokensColumn, "tokens/s (all ranks)"});
    if (any(drawn[kEfficiencyColumn]))
      panels.push_back({kEfficiencyColumn, "scaling efficiency (%)"});
    // Tics at the rank counts run, nowhere between.
    std::set<int64_t> counts;
    for (const ScalingLine& line : lines)
      for (size_t i : line.groups) counts.insert(data_.groups[i].config.nproc);
    std::string tics;
    for (int64_t n : counts) tics += (tics.empty() ? "" : ", ") + std::to_string(n);
    std::string body = fmt::format(
        "  set multiplot layout 1,{}\n  set key top left font \",10\"\n  set grid\n"
        "  set xlabel 'ranks (nproc)'\n  set xtics ({})\n  set yrange [0:*]\n"
        "  set offsets graph 0.05, graph 0.05, graph 0.1, 0\n",
        panels.size(), tics);
    for (const Panel& p : panels) {
      std::string plots;
      for (size_t l = 0; l < lines.size(); ++l) {
        if (!drawn[p.column][l]) continue;
        plots += fmt::format(
            "{}'{}.dat' index {} using 1:{} with linespoints lw 2 pt 7 ps 0.8 lc rgb '{}' title {}",
            plots.empty() ? "" : ", ", name, l, p.column, kPalette[l % std::size(kPalette)],
            gnuplot_string(lines[l].title));
      }
      body += fmt::format("  set ylabel '{}'\n  plot {}\n", p.ylabel, plots);
    }
    body += "  unset multiplot\n";
    Figure f;
    f.name = name;
    f.section = model;
    f.kind = "scaling";
    f.title = model + ": step time against ranks";
    f.caption =
        "Median step time, tokens per second (every rank's tokens) and scaling efficiency "
        "against the number of ranks, one line per shard mode (mean over seeds). Efficiency on N "
        "ranks: tokens/s over N times the one-rank baseline's, the same configuration with the "
        "same per-rank batch on one rank (shard ddp where measured, else one process); 100% is "
        "perfect scaling.";
    emit(f, 440 * static_cast<int>(panels.size()) + 40, 400, dat_text, body);
  }

  void pareto_figure(const std::string& model) {
    double equal = INFINITY;
    for (size_t i : groups_of(model))
      if (std::isfinite(data_.groups[i].samples_total))
        equal = std::min(equal, data_.groups[i].samples_total);
    if (!std::isfinite(equal)) return;
    struct Point {
      double mib, loss;
      std::string label;
    };
    std::vector<Point> points;
    for (size_t i : groups_of(model)) {
      const Group& g = data_.groups[i];
      const Interval loss = group_loss_at(data_, g, Axis::kSamples, equal);
      if (loss.n == 0 || g.peak_bytes.n == 0) continue;
      points.push_back({g.peak_bytes.mean / kMiB, loss.mean, g.label});
    }
    if (points.empty()) return;
    std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) {
      return std::tie(a.mib, a.loss, a.label) < std::tie(b.mib, b.loss, b.label);
    });
    std::string all, front;
    double best = INFINITY;
    for (const Point& p : points) {
      all += fmt::format("{}\t{}\t{}\n", gnuplot_number(p.mib), gnuplot_number(p.loss),
                         gnuplot_datum(p.label));
      if (p.loss < best) {
        best = p.loss;
        front += fmt::format("{}\t{}\t{}\n", gnuplot_number(p.mib), gnuplot_number(p.loss),
                             gnuplot_datum(p.label));
      }
    }
    Figure f;
    f.name = "pareto-" + file_slug(model);
    f.section = model;
    f.kind = "pareto";
    f.title = model + ": loss against peak memory";
    f.caption = fmt::format(
        "Each configuration's training loss at {:.0f} samples (the fewest any run of {} "
        "reached) against its peak memory. The line joins the Pareto front: nothing else is both "
        "leaner and better.",
        equal, model);
    const std::string body = fmt::format(
        "  set xlabel 'peak memory (MiB)'\n  set ylabel 'training loss at equal samples'\n"
        "  set grid\n  set key top right\n  set offsets graph 0.05, graph 0.25, graph 0.08, "
        "graph 0.08\n"
        "  plot '{0}.dat' index 1 using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#d62728' "
        "title 'Pareto front', \\\n"
        "       '{0}.dat' index 0 using 1:2 with points pt 7 ps 1.2 lc rgb '#1f77b4' title "
        "'configurations', \\\n"
        "       '{0}.dat' index 0 using 1:2:3 with labels left offset 0.8,0.4 font ',9' "
        "notitle\n",
        f.name);
    emit(f, 760, 480, "# all configurations\n" + all + "\n\n# Pareto front\n" + front, body);
  }

  void utilization_figure() {
    std::string dat_text, plots;
    int index = 0;
    bool gpu = false;
    for (const std::string& model : data_.models) {
      // The model's first configuration (in report order) whose run has a sampled series,
      // of the runs whose timings were not disturbed (the axis is time).
      for (size_t i : groups_of(model)) {
        const Group& g = data_.groups[i];
        std::string block;
        for (size_t r : g.ok_runs) {
          if (data_.runs[r].timing_disturbed()) continue;
          for (const TimelineSample& s : data_.runs[r].record.timeline) {
            if (s.gpu_util_pct) gpu = true;
            const std::optional<double> u = s.gpu_util_pct ? s.gpu_util_pct : s.util_pct;
            if (u && std::isfinite(*u) && std::isfinite(s.t_s))
              block += fmt::format("{}\t{}\n", gnuplot_number(s.t_s), gnuplot_number(*u));
          }
          if (!block.empty()) {
            dat_text += fmt::format("# {} ({}), seed {}\n{}\n\n", gnuplot_datum(model),
                                    gnuplot_datum(g.label), data_.runs[r].seed(), block);
            plots += fmt::format(
                "{}'utilization.dat' index {} using 1:2 with lines lw 1.5 lc rgb "
                "'{}' title {}",
                plots.empty() ? "" : ", ", index, kPalette[index % std::size(kPalette)],
                gnuplot_string(model + " (" + g.label + ")"));
            ++index;
            break;
          }
        }
        if (!block.empty()) break;
      }
    }
    if (index == 0) return;
    Figure f;
    f.name = "utilization";
    f.kind = "utilization";
    f.title = "Utilization over time, per architecture";
    f.caption = std::string(gpu ? "GPU utilization (NVML) where measured, else " : "") +
                "process CPU utilization (CPU time / (wall time x threads)) over each run, as the "
                "sampler read it; one representative run per model.";
    const std::string body =
        "  set xlabel 'time since the run started (s)'\n  set ylabel 'utilization (%)'\n"
        "  set yrange [0:110]\n  set grid\n  set key bottom right\n  plot " +
        plots + "\n";
    emit(f, 800, 420, dat_text, body);
  }

  void energy_figure() {
    std::vector<std::string> labels;
    std::vector<std::vector<double>> values;
    for (const Group& g : data_.groups) {
      if (g.energy_j.n == 0) continue;
      labels.push_back(g.model + " " + g.preset + ": " + g.label);
      values.push_back({g.energy_j.mean});
    }
    if (labels.empty()) return;
    Figure f;
    f.name = "energy";
    f.kind = "energy";
    f.title = "Energy per run";
    f.caption = fmt::format("Energy of each configuration's run (mean over seeds), from: {}.",
                            energy_sources(data_));
    stacked_bars(f, labels, values, {"energy (J)"}, "energy (J)");
  }

  const GroupedRuns& data_;
  fs::path dir_;
  std::string gnuplot_;
  std::map<std::string, std::string> color_;
  std::set<std::string> names_;
  std::vector<Figure> figures_;
};

}  // namespace

std::vector<Figure> write_figures(const GroupedRuns& data, const std::string& dir,
                                  const std::string& gnuplot) {
  const fs::path figures = fs::path(dir) / "figures";
  make_folder(figures);
  return FigureWriter(data, figures, gnuplot).write_all();
}

}  // namespace gradscope
