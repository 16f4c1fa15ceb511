#include "gradscope/report/render.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/report/console.h"

namespace gradscope {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
const char* const kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
const char* const kMemoryParts[] = {"params", "grads", "optimizer_state", "activations", "other"};
const char* const kMemoryLabels[] = {"parameters", "gradients", "optimizer state", "activations",
                                     "other"};
const char* const kPhases[] = {"data", "forward", "backward", "optimizer"};
constexpr size_t kCurvePoints = 200;  // points per drawn loss curve (bucket means)

double num(const json& j, std::initializer_list<const char*> path) {
  return record_number(j, path);
}

std::string str(const json& j, std::initializer_list<const char*> path) {
  const json* at = &j;
  for (const char* key : path) {
    if (!at->is_object() || !at->contains(key)) return "";
    at = &(*at)[key];
  }
  return at->is_string() ? at->get<std::string>() : at->is_null() ? "" : at->dump();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) fail_runtime("cannot write " + path.string(), "check free disk space and permissions");
}

std::string read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string md_escape(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// A gnuplot single-quoted string ('' is a quote inside one).
std::string gp_str(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string base64(const std::string& bytes) {
  static const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v =
        (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += table[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= uint8_t(bytes[i + 1]) << 8;
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? table[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// A number for a data or CSV file: shortest round-trip text, empty for NaN.
std::string field(double v) { return std::isfinite(v) ? fmt::format("{}", v) : ""; }
std::string dat(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "NaN"; }

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_row(const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) line += (i ? "," : "") + csv_quote(cells[i]);
  return line + "\n";
}

std::string bytes_or_na(const Interval& i) {
  return i.n > 0 ? format_bytes(i.mean) : std::string("n/a");
}

std::string seconds_or_na(const Interval& i) {
  return i.n > 0 ? format_duration(i.mean) : std::string("n/a");
}

std::string joules_text(double j) {
  if (!std::isfinite(j)) return "n/a";
  return j >= 3.6e6 ? fmt::format("{:.2f} kWh", j / 3.6e6)
         : j >= 1e3 ? fmt::format("{:.2f} kJ", j / 1e3)
                    : fmt::format("{:.3g} J", j);
}

// Where a run's energy figure comes from ("nvml", "estimate", ...), for captions.
std::string energy_sources(const ReportData& data) {
  std::set<std::string> sources;
  for (const ReportRun& r : data.runs) {
    const std::string s = str(r.record, {"energy", "source"});
    if (!s.empty()) sources.insert(s);
  }
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

// ---- gnuplot ----

// Runs `gnuplot script` in dir; its output goes to NAME.log, removed when it succeeds.
void run_gnuplot(const std::string& gnuplot, const fs::path& dir, const std::string& name) {
  const fs::path log = dir / (name + ".log");
  const pid_t pid = fork();
  if (pid < 0)
    fail_runtime(std::string("cannot start gnuplot: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (chdir(dir.c_str()) != 0) _exit(126);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    const std::string script = name + ".gp";
    execlp(gnuplot.c_str(), gnuplot.c_str(), script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  if (code == 127)
    fail_usage(fmt::format("cannot run '{}'", gnuplot),
               "install gnuplot-nox (scripts/install-deps.sh does), pass --gnuplot PATH, or "
               "use --format md or csv");
  if (code != 0)
    fail_runtime(
        fmt::format("gnuplot failed on {}: {}", (dir / (name + ".gp")).string(), read_file(log)),
        "the figure's script and data are kept beside it");
  std::error_code ec;
  fs::remove(log, ec);
}

// A figure's script: the same commands drawn once as SVG and once as PNG.
std::string gp_script(const std::string& name, int width, int height, const std::string& body) {
  return fmt::format(
      "# Draws {0}.svg and {0}.png from {0}.dat: `gnuplot {0}.gp`.\n"
      "set datafile separator \"\\t\"\n"
      "set datafile missing \"NaN\"\n"
      "do for [format in \"svg png\"] {{\n"
      "  if (format eq \"svg\") {{\n"
      "    set terminal svg size {1},{2} fixed noenhanced font \"sans,12\" background rgb "
      "\"white\"\n"
      "  }} else {{\n"
      "    set terminal pngcairo size {1},{2} noenhanced font \"sans,10\" background rgb "
      "\"white\"\n"
      "  }}\n"
      "  set output \"{0}.\".format\n"
      "{3}"
      "  set output\n"
      "}}\n",
      name, width, height, body);
}

class FigureWriter {
 public:
  FigureWriter(const ReportData& data, fs::path dir, std::string gnuplot)
      : data_(data), dir_(std::move(dir)), gnuplot_(std::move(gnuplot)) {
    std::set<std::string> optimizers;
    for (const Group& g : data.groups) optimizers.insert(g.optimizer);
    size_t i = 0;
    for (const auto& o : optimizers) color_[o] = kPalette[i++ % std::size(kPalette)];
  }

  std::vector<Figure> write_all() {
    for (const std::string& model : data_.models) {
      for (Axis axis : {Axis::kSteps, Axis::kSamples, Axis::kTime, Axis::kEnergy})
        loss_figure(model, axis);
      memory_figure(model);
      phases_figure(model);
      pareto_figure(model);
    }
    utilization_figure();
    energy_figure();
    return figures_;
  }

 private:
  void emit(Figure f, int width, int height, const std::string& data, const std::string& body) {
    write_file(dir_ / (f.name + ".dat"), data);
    write_file(dir_ / (f.name + ".gp"), gp_script(f.name, width, height, body));
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
  std::string curve_block(const Group& g, Axis axis) const {
    size_t n = SIZE_MAX;
    for (size_t r : g.ok_runs) n = std::min(n, data_.runs[r].curve.size());
    if (g.ok_runs.empty() || n == 0 || n == SIZE_MAX) return "";
    const size_t buckets = std::min(n, kCurvePoints);
    std::string rows;
    for (size_t b = 0; b < buckets; ++b) {
      const size_t from = b * n / buckets, to = (b + 1) * n / buckets;
      std::vector<double> xs, ys;
      for (size_t r : g.ok_runs) {
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
      rows += fmt::format("{}\t{}\t{}\t{}\n", dat(x.mean), dat(y.mean), dat(y.lo()), dat(y.hi()));
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
    int index = 0, panels = 0, drawn = 0;
    const int cols = std::min<int>(3, static_cast<int>(strategies.size()));
    const int rows = (static_cast<int>(strategies.size()) + cols - 1) / std::max(cols, 1);
    body += fmt::format("  set multiplot layout {},{}\n  set key top right font \",10\"\n", rows,
                        std::max(cols, 1));
    body += fmt::format("  set xlabel {}\n  set ylabel 'training loss'\n  set grid\n",
                        gp_str(axis_label(axis)));
    bool any_band = false;
    for (const std::string& strategy : strategies) {
      std::string plots;
      std::map<std::string, int> seen;
      for (size_t i : groups_of(model)) {
        const Group& g = data_.groups[i];
        if (g.strategy != strategy) continue;
        const std::string block = curve_block(g, axis);
        if (block.empty()) continue;
        dat_text += fmt::format("# {}\n{}\n\n", g.label, block);
        const int dash = 1 + seen[g.optimizer]++;
        if (g.ok_runs.size() > 1) {
          any_band = true;
          plots += fmt::format(
              "'{}.dat' index {} using 1:3:4 with filledcurves fc rgb '{}' fs transparent solid "
              "0.2 noborder notitle, ",
              figure_name("loss", model, axis), index, color_.at(g.optimizer));
        }
        plots += fmt::format(
            "'{}.dat' index {} using 1:2 with lines lw 2 dt {} lc rgb '{}' title {}, ",
            figure_name("loss", model, axis), index, dash, color_.at(g.optimizer),
            gp_str(short_label(g) +
                   (g.ok_runs.size() > 1 ? fmt::format(" ({} seeds)", g.ok_runs.size()) : "")));
        ++index;
        ++drawn;
      }
      body += fmt::format("  set title {}\n", gp_str(strategy));
      if (plots.empty()) {
        body +=
            "  unset key\n  set label 1 'no data' at graph 0.5,0.5 center\n"
            "  plot [0:1][0:1] NaN notitle\n  unset label 1\n  set key\n";
      } else {
        plots.resize(plots.size() - 2);
        body += "  plot " + plots + "\n";
      }
      ++panels;
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
            ? fmt::format(" Energy per step is the run's total ({}) spread in proportion to step "
                          "time.",
                          energy_sources(data_))
            : "");
    emit(f, 440 * std::max(cols, 1) + 40, 360 * rows + 20, dat_text, body);
  }

  static std::string figure_name(const std::string& kind, const std::string& model, Axis axis) {
    return fmt::format("{}-{}-{}", kind, model, axis_name(axis));
  }

  // Stacked bars, one per group: rows "label\tv1\tv2...", series titles and colors.
  void stacked_bars(Figure f, const std::vector<std::string>& labels,
                    const std::vector<std::vector<double>>& values,
                    const std::vector<std::string>& series, const std::string& ylabel) {
    std::string dat_text = "# label";
    for (const auto& s : series) dat_text += "\t" + s;
    dat_text += "\n";
    for (size_t i = 0; i < labels.size(); ++i) {
      dat_text += labels[i];
      for (double v : values[i]) dat_text += "\t" + dat(v);
      dat_text += "\n";
    }
    // Room below the axis for the longest rotated label (about 0.3 character heights per
    // character at -35 degrees).
    size_t longest = 0;
    for (const auto& l : labels) longest = std::max(longest, l.size());
    const int bmargin = std::clamp(static_cast<int>(0.3 * static_cast<double>(longest)) + 3, 6, 24);
    std::string body = fmt::format(
        "  set style data histograms\n  set style histogram rowstacked\n"
        "  set style fill solid 0.85 border rgb '#333333'\n  set boxwidth 0.7\n"
        "  set key outside right top\n  set grid ytics\n  set ylabel {}\n"
        "  set xtics rotate by -35 left font \",10\"\n  set yrange [0:*]\n  set bmargin {}\n"
        "  plot ",
        gp_str(ylabel), bmargin);
    for (size_t s = 0; s < series.size(); ++s)
      body += fmt::format("{}'{}.dat' using {}{} title {} lc rgb '{}'", s ? ", " : "", f.name,
                          s + 2, s == 0 ? ":xtic(1)" : "", gp_str(series[s]),
                          kPalette[s % std::size(kPalette)]);
    body += "\n";
    const int width = std::max(640, 60 * static_cast<int>(labels.size()) + 320);
    emit(std::move(f), width, 330 + 14 * bmargin, dat_text, body);
  }

  // One stacked bar per configuration of the model that has the components `parts` of
  // `member` (memory breakdown or phase times), each mean scaled by `scale`.
  void component_figure(const std::string& model,
                        const std::map<std::string, Interval> Group::*member,
                        const std::vector<std::string>& parts, double scale, Figure f,
                        const std::vector<std::string>& series, const std::string& ylabel) {
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
    stacked_bars(f, labels, values, series, ylabel);
  }

  void memory_figure(const std::string& model) {
    Figure f;
    f.name = "memory-" + model;
    f.kind = "memory";
    f.title = model + ": peak memory by component";
    f.caption =
        "Memory at the step's peak, by what holds it (memory.breakdown in each record; mean over "
        "seeds). Other: the batch, workspace and allocator overhead.";
    component_figure(
        model, &Group::memory,
        std::vector<std::string>(std::begin(kMemoryParts), std::end(kMemoryParts)), 1.0 / kMiB, f,
        std::vector<std::string>(std::begin(kMemoryLabels), std::end(kMemoryLabels)), "MiB");
  }

  void phases_figure(const std::string& model) {
    Figure f;
    f.name = "phases-" + model;
    f.kind = "phases";
    f.title = model + ": time per step by phase";
    f.caption =
        "Mean time per timed step in each phase (the phase totals over timed steps); checkpointed "
        "runs recompute their forward inside backward.";
    const std::vector<std::string> phases(std::begin(kPhases), std::end(kPhases));
    component_figure(model, &Group::phase_s, phases, 1e3, f, phases, "ms per step");
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
      all += fmt::format("{}\t{}\t{}\n", dat(p.mib), dat(p.loss), p.label);
      if (p.loss < best) {
        best = p.loss;
        front += fmt::format("{}\t{}\t{}\n", dat(p.mib), dat(p.loss), p.label);
      }
    }
    Figure f;
    f.name = "pareto-" + model;
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
      // The model's first configuration (in report order) whose run has a sampled series.
      for (size_t i : groups_of(model)) {
        const Group& g = data_.groups[i];
        std::string block;
        for (size_t r : g.ok_runs) {
          const json& timeline = data_.runs[r].record.value("timeline", json::array());
          if (!timeline.is_array()) continue;
          for (const json& s : timeline) {
            double u = num(s, {"gpu_util_pct"});
            if (std::isfinite(u)) gpu = true;
            if (!std::isfinite(u)) u = num(s, {"util_pct"});
            const double t = num(s, {"t_s"});
            if (std::isfinite(u) && std::isfinite(t))
              block += fmt::format("{}\t{}\n", dat(t), dat(u));
          }
          if (!block.empty()) {
            dat_text += fmt::format("# {} ({}), seed {}\n{}\n\n", model, g.label,
                                    data_.runs[r].seed, block);
            plots += fmt::format(
                "{}'utilization.dat' index {} using 1:2 with lines lw 1.5 lc rgb "
                "'{}' title {}",
                plots.empty() ? "" : ", ", index, kPalette[index % std::size(kPalette)],
                gp_str(model + " (" + g.label + ")"));
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
    stacked_bars(f, labels, values, {"energy (J)"}, "joules");
  }

  const ReportData& data_;
  fs::path dir_;
  std::string gnuplot_;
  std::map<std::string, std::string> color_;
  std::vector<Figure> figures_;
};

// ---- tables ----

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

std::string markdown_table(const Table& t) {
  std::string text = "|";
  for (const auto& h : t.header) text += " " + md_escape(h) + " |";
  text += "\n|";
  for (size_t i = 0; i < t.header.size(); ++i) text += "---|";
  text += "\n";
  for (const auto& row : t.rows) {
    text += "|";
    for (const auto& c : row) text += " " + md_escape(c) + " |";
    text += "\n";
  }
  return text;
}

std::string html_table(const Table& t, const std::string& css_class = "") {
  std::string text = css_class.empty() ? "<table>\n<thead><tr>"
                                       : "<table class=\"" + css_class + "\">\n<thead><tr>";
  for (const auto& h : t.header) text += "<th>" + html_escape(h) + "</th>";
  text += "</tr></thead>\n<tbody>\n";
  for (const auto& row : t.rows) {
    text += "<tr>";
    for (const auto& c : row) text += "<td>" + html_escape(c) + "</td>";
    text += "</tr>\n";
  }
  return text + "</tbody></table>\n";
}

std::string budget_text(const Recommendation& r) {
  return r.budget_bytes > 0 ? format_bytes(r.budget_bytes) : std::string("no limit");
}

Table recommendations_table(const ReportData& data) {
  Table t{{"model", "memory budget", "use", "loss at equal samples", "samples", "time to them",
           "energy to them", "does not fit"},
          {}};
  for (const Recommendation& r : data.recommendations) {
    std::string misses;
    for (size_t i = 0; i < r.misses.size(); ++i)
      misses += (i ? "; " : "") + data.groups[r.misses[i]].label + " (" + r.miss_reasons[i] + ")";
    const Group* best = r.best ? &data.groups[*r.best] : nullptr;
    t.rows.push_back(
        {r.model,
         r.budget_bytes > 0 ? budget_text(r) + " (" + r.budget_source + ")" : budget_text(r),
         best ? best->preset + ": " + best->label : "nothing measured fits",
         best ? format_interval(r.best_loss) : "n/a", fmt::format("{:.0f}", r.equal_samples),
         best && std::isfinite(r.time_to_samples_s) ? format_duration(r.time_to_samples_s) : "n/a",
         best && r.energy_known ? joules_text(r.energy_to_samples_j) : "n/a",
         misses.empty() ? "-" : misses});
  }
  return t;
}

Table findings_table(const ReportData& data) {
  Table t{{"claim (study)", "this database", "verdict (the study's basis)", "at equal samples"},
          {}};
  for (const Finding& f : data.findings)
    t.rows.push_back(
        {f.claim, f.measured, verdict_name(f.verdict), verdict_name(f.verdict_equal_samples)});
  return t;
}

Table groups_table(const ReportData& data, const std::string& model) {
  Table t{{"configuration", "preset", "seeds", "status", "train loss (last 10% of steps)",
           "val loss", "step time", "peak memory", "energy", "utilization"},
          {}};
  for (const Group& g : data.groups) {
    if (g.model != model) continue;
    t.rows.push_back({g.label, g.preset, std::to_string(g.runs.size()), g.statuses,
                      format_interval(g.final_loss), format_interval(g.val_loss),
                      seconds_or_na(g.step_s), bytes_or_na(g.peak_bytes),
                      g.energy_j.n ? joules_text(g.energy_j.mean) : "n/a",
                      g.util_pct.n ? fmt::format("{:.1f}%", g.util_pct.mean) : "n/a"});
  }
  return t;
}

Table evidence_table(const Finding& f) {
  Table t{{"compared", "at equal steps", "at equal samples"}, {}};
  for (const Evidence& e : f.evidence) t.rows.push_back({e.what, e.steps, e.samples});
  return t;
}

// Hosts, devices and LibTorch versions of the runs, for the header.
std::string provenance(const ReportData& data) {
  std::set<std::string> devices, libtorch, sweeps;
  for (const ReportRun& r : data.runs) {
    const std::string d = str(r.record, {"env", "device_name"});
    if (!d.empty()) devices.insert(d);
    const std::string l = str(r.record, {"env", "libtorch"});
    if (!l.empty()) libtorch.insert(l);
    if (!r.sweep.empty()) sweeps.insert(r.sweep);
  }
  auto join = [](const std::set<std::string>& s) {
    std::string text;
    for (const auto& x : s) text += (text.empty() ? "" : ", ") + x;
    return text.empty() ? std::string("n/a") : text;
  };
  return fmt::format(
      "{} runs in {} configurations ({} attempts stored); sweeps: {}; devices: {}; "
      "LibTorch {}",
      data.runs.size(), data.groups.size(), data.attempts, join(sweeps), join(devices),
      join(libtorch));
}

const char* kCss = R"CSS(
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0;
  color: #1d2330; background: #f6f7f9; line-height: 1.45; }
header { background: #1d2330; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px 0; font-size: 22px; }
header p { margin: 0; color: #c5cad3; font-size: 13px; }
main { padding: 8px 32px 40px 32px; max-width: 1500px; }
section { background: #fff; border: 1px solid #e1e4e8; border-radius: 8px; padding: 12px 20px;
  margin: 18px 0; }
h2 { font-size: 19px; margin: 6px 0 10px 0; }
h3 { font-size: 16px; margin: 14px 0 6px 0; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0 10px 0; }
th, td { border-bottom: 1px solid #e6e8eb; padding: 4px 10px; text-align: left;
  vertical-align: top; }
th { background: #f0f2f5; font-weight: 600; }
.verdict { font-weight: 600; border-radius: 10px; padding: 1px 8px; white-space: nowrap; }
.v-reproduced { background: #dcf5e0; color: #17612a; }
.v-not-reproduced { background: #fde2e1; color: #9b1c17; }
.v-not-enough-data { background: #eceef1; color: #4b5361; }
figure { margin: 12px 0 18px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eceef1; background: #fff; }
figcaption { font-size: 12.5px; color: #4b5361; max-width: 1000px; }
.axis-switch button { font-size: 12px; margin-right: 4px; padding: 3px 10px; border-radius: 12px;
  border: 1px solid #b9c0ca; background: #fff; cursor: pointer; }
.axis-switch button.active { background: #1d2330; color: #fff; border-color: #1d2330; }
.axis-figure { display: none; }
.axis-figure.active { display: block; }
details { margin: 4px 0 10px 0; font-size: 13px; }
.note { color: #6b5200; }
a { color: #1f5fb4; }
@media print { .axis-figure { display: block; } .axis-switch { display: none; } }
)CSS";

// Switches loss figures between axes; marks on <body> how many figures loaded and are shown
// (data-figures-loaded, data-figures-visible, data-figures-total) for automated checks.
const char* kScript = R"JS(
function gsShowAxis(group, axis) {
  document.querySelectorAll('[data-loss-group="' + group + '"]').forEach(function (el) {
    el.classList.toggle('active', el.getAttribute('data-axis') === axis);
  });
}
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.querySelectorAll('img.figure'));
  var loaded = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  var shown = imgs.filter(function (i) {
    var hidden = i.closest('.axis-figure:not(.active)');
    var r = i.getBoundingClientRect();
    return !hidden && r.width > 0 && r.height > 0;
  });
  var meant = imgs.filter(function (i) { return !i.closest('.axis-figure:not(.active)'); });
  document.body.setAttribute('data-figures-total', String(imgs.length));
  document.body.setAttribute('data-figures-loaded', String(loaded.length));
  document.body.setAttribute('data-figures-visible', String(shown.length));
  document.body.setAttribute('data-figures-meant', String(meant.length));
});
)JS";

std::string verdict_badge(Verdict v) {
  std::string cls = verdict_name(v);
  std::replace(cls.begin(), cls.end(), ' ', '-');
  return fmt::format("<span class=\"verdict v-{}\">{}</span>", cls, verdict_name(v));
}

std::string figure_html(const Figure& f, const fs::path& figures_dir,
                        const std::string& extra_class, const std::string& extra_attrs) {
  const std::string svg = read_file(figures_dir / (f.name + ".svg"));
  return fmt::format(
      "<figure class=\"{}\"{} id=\"fig-{}\">\n<img class=\"figure\" alt=\"{}\" "
      "src=\"data:image/svg+xml;base64,{}\">\n<figcaption><b>{}.</b> {} "
      "<a href=\"figures/{}.png\">PNG</a> · <a href=\"figures/{}.svg\">SVG</a> · "
      "<a href=\"figures/{}.gp\">gnuplot script</a></figcaption>\n</figure>\n",
      extra_class, extra_attrs, f.name, html_escape(f.title), base64(svg), html_escape(f.title),
      html_escape(f.caption), f.name, f.name, f.name);
}

}  // namespace

std::string markdown_summary(const ReportData& data) {
  std::string md = "# gradscope report\n\n" + provenance(data) + "\n\n";
  md +=
      "## Recommendations\n\nFor each model and memory budget: the optimizer and strategy with "
      "the lowest training loss at equal samples among the configurations that fit.\n\n";
  md += markdown_table(recommendations_table(data));
  md += "\n## The study's claims\n\n" + markdown_table(findings_table(data));
  for (const Finding& f : data.findings)
    for (const std::string& note : f.notes) md += fmt::format("\n- {}: {}", f.id, note);
  md += "\n";
  for (const std::string& model : data.models)
    md += "\n## " + model + "\n\n" + markdown_table(groups_table(data, model));
  return md;
}

std::string runs_csv(const ReportData& data) {
  std::string csv = csv_row({"run_id",
                             "sweep",
                             "configuration",
                             "model",
                             "preset",
                             "optimizer",
                             "strategy",
                             "seed",
                             "lr",
                             "batch",
                             "accum_steps",
                             "seq_len",
                             "steps",
                             "dtype",
                             "device",
                             "status",
                             "final_loss",
                             "loss_last_tenth",
                             "final_val_loss",
                             "final_accuracy",
                             "step_median_s",
                             "total_s",
                             "samples_per_s",
                             "tokens_per_s",
                             "peak_bytes",
                             "params_bytes",
                             "grads_bytes",
                             "optimizer_state_bytes",
                             "activations_bytes",
                             "other_bytes",
                             "energy_j",
                             "energy_source",
                             "utilization_mean_pct",
                             "flops_per_step",
                             "achieved_flops_per_s",
                             "mfu"});
  for (const Group& g : data.groups) {
    for (size_t i : g.runs) {
      const ReportRun& r = data.runs[i];
      const json& rec = r.record;
      const auto tail =
          r.curve.empty() ? std::nullopt : loss_at(r.curve, Axis::kSteps, r.curve.back().step);
      csv += csv_row({r.run_id,
                      r.sweep,
                      g.label,
                      g.model,
                      g.preset,
                      g.optimizer,
                      g.strategy,
                      std::to_string(r.seed),
                      field(num(rec, {"config", "lr"})),
                      field(num(rec, {"config", "batch"})),
                      field(num(rec, {"config", "accum_steps"})),
                      field(num(rec, {"config", "seq_len"})),
                      field(num(rec, {"config", "steps"})),
                      str(rec, {"config", "dtype"}),
                      str(rec, {"config", "device"}),
                      r.status,
                      field(num(rec, {"final_loss"})),
                      tail ? field(*tail) : "",
                      field(num(rec, {"final_val_loss"})),
                      field(num(rec, {"final_accuracy"})),
                      field(num(rec, {"time", "step_median_s"})),
                      field(num(rec, {"time", "total_s"})),
                      field(num(rec, {"throughput", "samples_per_s"})),
                      field(num(rec, {"throughput", "tokens_per_s"})),
                      field(num(rec, {"memory", "peak_bytes"})),
                      field(num(rec, {"memory", "breakdown", "params"})),
                      field(num(rec, {"memory", "breakdown", "grads"})),
                      field(num(rec, {"memory", "breakdown", "optimizer_state"})),
                      field(num(rec, {"memory", "breakdown", "activations"})),
                      field(num(rec, {"memory", "breakdown", "other"})),
                      field(num(rec, {"energy", "joules"})),
                      str(rec, {"energy", "source"}),
                      field(num(rec, {"utilization", "mean_pct"})),
                      field(num(rec, {"flops", "per_step"})),
                      field(num(rec, {"flops", "achieved_per_s"})),
                      field(num(rec, {"flops", "mfu"}))});
    }
  }
  return csv;
}

std::string steps_csv(const ReportData& data) {
  std::string csv = csv_row(
      {"run_id", "step", "samples", "tokens", "time_s", "energy_j", "loss", "lr", "grad_norm"});
  for (const Group& g : data.groups)
    for (size_t i : g.runs)
      for (const CurvePoint& p : data.runs[i].curve)
        csv += csv_row({data.runs[i].run_id, field(p.step), field(p.samples), field(p.tokens),
                        field(p.time_s), field(p.energy_j), field(p.loss), field(p.lr),
                        field(p.grad_norm)});
  return csv;
}

std::vector<Figure> write_figures(const ReportData& data, const std::string& dir,
                                  const std::string& gnuplot) {
  const fs::path figures = fs::path(dir) / "figures";
  std::error_code ec;
  fs::create_directories(figures, ec);
  check_usage(!ec && fs::is_directory(figures),
              fmt::format("cannot create {}: {}", figures.string(), ec.message()),
              "choose a writable --out folder");
  return FigureWriter(data, figures, gnuplot).write_all();
}

std::string report_html(const ReportData& data, const std::vector<Figure>& figures,
                        const std::string& dir) {
  const fs::path figures_dir = fs::path(dir) / "figures";
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>gradscope report</title>\n<style>" +
      std::string(kCss) + "</style>\n</head>\n<body>\n";
  h += "<header><h1>gradscope report</h1><p>" + html_escape(provenance(data)) +
       "</p></header>\n<main>\n";
  h += "<section id=\"recommendations\"><h2>Recommendations</h2>\n<p>For each model and memory "
       "budget: the optimizer and memory strategy with the lowest training loss at equal samples "
       "among the configurations that fit, with the time and energy it took to get there. "
       "Budgets are the memory caps runs ran under, those passed with --memory-budget, or else "
       "the leanest and the median configuration's peak and no limit.</p>\n" +
       html_table(recommendations_table(data)) + "</section>\n";
  h += "<section id=\"findings\"><h2>The study's claims, re-examined</h2>\n<p>Each claim of "
       "\"Gradient Under Microscope\" beside what this database shows. The verdict is taken on "
       "the study's own basis (equal optimizer steps); the fair comparison at equal samples is "
       "beside it.</p>\n<table>\n<thead><tr><th>claim (study)</th><th>this database</th>"
       "<th>verdict</th><th>at equal samples</th></tr></thead>\n<tbody>\n";
  for (const Finding& f : data.findings) {
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                     html_escape(f.claim), html_escape(f.measured), verdict_badge(f.verdict),
                     verdict_badge(f.verdict_equal_samples));
  }
  h += "</tbody></table>\n";
  for (const Finding& f : data.findings) {
    h += fmt::format(
        "<details><summary>{}: how it is decided and the comparisons</summary>\n<p>{}</p>\n",
        html_escape(f.id), html_escape(f.rule));
    if (!f.evidence.empty()) h += html_table(evidence_table(f));
    for (const std::string& note : f.notes)
      h += "<p class=\"note\">" + html_escape(note) + "</p>\n";
    h += "</details>\n";
  }
  h += "</section>\n";
  for (const std::string& model : data.models) {
    h += fmt::format("<section id=\"model-{0}\"><h2>{0}</h2>\n", html_escape(model));
    h += html_table(groups_table(data, model));
    bool switcher = false;
    for (const Figure& f : figures) {
      if (f.section != model || f.kind != "loss") continue;
      if (!switcher) {
        h += fmt::format("<div class=\"axis-switch\">x axis: ");
        for (const Figure& g : figures)
          if (g.section == model && g.kind == "loss")
            h += fmt::format(
                "<button type=\"button\" class=\"{}\" data-loss-group=\"{}\" data-axis=\"{}\" "
                "onclick=\"gsShowAxis('{}', '{}')\">{}</button>",
                g.axis == f.axis ? "active" : "", html_escape(model), g.axis, html_escape(model),
                g.axis, g.axis);
        h += "</div>\n";
        switcher = true;
      }
      const bool first = &f == &*std::find_if(figures.begin(), figures.end(), [&](const Figure& g) {
        return g.section == model && g.kind == "loss";
      });
      h += figure_html(
          f, figures_dir, std::string("axis-figure") + (first ? " active" : ""),
          fmt::format(" data-loss-group=\"{}\" data-axis=\"{}\"", html_escape(model), f.axis));
    }
    for (const Figure& f : figures)
      if (f.section == model && f.kind != "loss") h += figure_html(f, figures_dir, "", "");
    h += "</section>\n";
  }
  bool across = false;
  for (const Figure& f : figures) {
    if (!f.section.empty()) continue;
    if (!across) h += "<section id=\"across-models\"><h2>Across models</h2>\n";
    across = true;
    h += figure_html(f, figures_dir, "", "");
  }
  if (across) h += "</section>\n";
  h += "<section id=\"files\"><h2>Data</h2>\n<p><a href=\"runs.csv\">runs.csv</a> (one row per "
       "run) · <a href=\"steps.csv\">steps.csv</a> (one row per step, cumulative samples, time "
       "and energy) · <a href=\"summary.md\">summary.md</a> (these tables in Markdown). Each "
       "figure's data and gnuplot script are in figures/.</p></section>\n";
  h += "</main>\n<script>" + std::string(kScript) + "</script>\n</body>\n</html>\n";
  return h;
}

std::vector<Figure> write_report(const ReportData& data, const std::string& dir,
                                 const std::string& gnuplot) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  check_usage(!ec && fs::is_directory(dir), fmt::format("cannot create {}: {}", dir, ec.message()),
              "choose a writable --out folder");
  const fs::path root = dir;
  write_file(root / "runs.csv", runs_csv(data));
  write_file(root / "steps.csv", steps_csv(data));
  write_file(root / "summary.md", markdown_summary(data));
  std::vector<Figure> figures = write_figures(data, dir, gnuplot);
  write_file(root / "report.html", report_html(data, figures, dir));
  return figures;
}

}  // namespace gradscope
