#include "gradscope/report/html.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "gradscope/report/encode.h"
#include "gradscope/report/files.h"
#include "gradscope/report/tables.h"

namespace gradscope {

namespace fs = std::filesystem;

namespace {

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
.v-not-comparable-here { background: #fff4d6; color: #7a5a00; }
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
  document.querySelectorAll('[data-loss-group]').forEach(function (el) {
    if (el.getAttribute('data-loss-group') !== group) return;
    el.classList.toggle('active', el.getAttribute('data-axis') === axis);
  });
}
document.querySelectorAll('.axis-switch button').forEach(function (b) {
  b.addEventListener('click', function () {
    gsShowAxis(b.getAttribute('data-loss-group'), b.getAttribute('data-axis'));
  });
});
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
      extra_class, extra_attrs, html_escape(f.name), html_escape(f.title), base64(svg),
      html_escape(f.title), html_escape(f.caption), html_escape(f.name), html_escape(f.name),
      html_escape(f.name));
}

// The page's start, its header with where the data came from.
std::string page_head(const ReportData& data) {
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>gradscope report</title>\n<style>" +
      std::string(kCss) + "</style>\n</head>\n<body>\n";
  h += "<header><h1>gradscope report</h1><p>" + html_escape(provenance(data)) +
       "</p></header>\n<main>\n";
  return h;
}

std::string recommendations_section(const ReportData& data) {
  return "<section id=\"recommendations\"><h2>Recommendations</h2>\n<p>For each model and memory "
         "budget: the optimizer and memory strategy with the lowest validation loss at equal "
         "gradient evaluations (samples x forward-backward passes: equal compute, whatever an "
         "optimizer spends per step) among the configurations that fit, with the time and energy "
         "it took to get there. Only a configuration whose every run ended ok, none above its "
         "first loss, is ranked; one with no validation loss by that point is not either, and "
         "the row names each left out, with why or with its training loss there; only when no "
         "ranked one has a validation loss does the row rank by training loss. The next column "
         "lists the configurations whose per-seed losses are not significantly above the chosen "
         "one's (Welch's t test, Holm's correction over the row at 95%, 3 seeds a side): the "
         "lead over them is within the seeds' spread. "
         "Budgets are the memory caps runs ran under, those passed with --memory-budget, or else "
         "the leanest and the median configuration's peak and no limit.</p>\n" +
         html_table(recommendations_table(data)) + "</section>\n";
}

// The study's claims: a table of verdicts, then how each is decided and its comparisons.
std::string findings_section(const ReportData& data) {
  std::string h =
      "<section id=\"findings\"><h2>The study's claims, re-examined</h2>\n<p>Each claim of "
      "\"Gradient Under Microscope\" beside what this database shows. The verdict is taken on "
      "the study's own basis (equal optimizer steps); the fair comparisons at equal samples "
      "and at equal gradient evaluations (equal compute) are beside it. Every verdict rests on "
      "per-seed values: a comparison needs at least 3 seeds on each side and is decided by "
      "Welch's t test, two-sided at 95%; otherwise the verdict is not enough data. A claim "
      "about a quantity this data does not measure (GPU utilization, on CPU runs) is not "
      "comparable here.</p>\n<table>\n<thead><tr><th>claim (study)</th><th>this database</th>"
      "<th>verdict</th><th>at equal samples</th><th>at equal gradient evaluations</th></tr>"
      "</thead>\n<tbody>\n";
  for (const Finding& f : data.findings) {
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                     html_escape(f.claim), html_escape(f.measured), verdict_badge(f.verdict),
                     verdict_badge(f.verdict_equal_samples),
                     verdict_badge(f.verdict_equal_evaluations));
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
  return h;
}

// A model's loss figures, one per x axis, behind buttons that switch between them (the first
// shown). `group` names the model's figures in the page's script.
std::string loss_figures(const std::vector<Figure>& figures, const std::string& model,
                         const std::string& group, const fs::path& figures_dir) {
  std::string h;
  bool switcher = false;
  for (const Figure& f : figures) {
    if (f.section != model || f.kind != "loss") continue;
    if (!switcher) {
      h += fmt::format("<div class=\"axis-switch\">x axis: ");
      for (const Figure& g : figures)
        if (g.section == model && g.kind == "loss")
          h += fmt::format(
              "<button type=\"button\" class=\"{}\" data-loss-group=\"{}\" data-axis=\"{}\">"
              "{}</button>",
              g.axis == f.axis ? "active" : "", group, g.axis, g.axis);
      h += "</div>\n";
      switcher = true;
    }
    const bool first = &f == &*std::find_if(figures.begin(), figures.end(), [&](const Figure& g) {
      return g.section == model && g.kind == "loss";
    });
    h += figure_html(f, figures_dir, std::string("axis-figure") + (first ? " active" : ""),
                     fmt::format(" data-loss-group=\"{}\" data-axis=\"{}\"", group, f.axis));
  }
  return h;
}

// One model's section: its configurations, its ranks beside their one-process form, its
// loss figures and its other figures.
std::string model_section(const ReportData& data, const std::string& model,
                          const std::vector<Figure>& figures, const fs::path& figures_dir) {
  const std::string group = html_escape(file_slug(model));
  std::string h = fmt::format("<section id=\"model-{}\"><h2>{}</h2>\n", group, html_escape(model));
  h += html_table(groups_table(data, model));
  const Table ranks = ranks_table(data, model);
  if (!ranks.rows.empty())
    h += "<h3>Ranks</h3>\n<p>Each configuration that ran with several ranks, beside its "
         "one-process form. Scaling efficiency on N ranks: tokens/s (every rank's tokens) over "
         "N times the one-rank baseline's, the same configuration and per-rank batch with "
         "shard ddp on one rank where measured, else in one process.</p>\n" +
         html_table(ranks);
  h += loss_figures(figures, model, group, figures_dir);
  for (const Figure& f : figures)
    if (f.section == model && f.kind != "loss") h += figure_html(f, figures_dir, "", "");
  h += "</section>\n";
  return h;
}

// The figures of no one model, in a section of their own when there are any.
std::string across_models_section(const std::vector<Figure>& figures,
                                  const fs::path& figures_dir) {
  std::string h;
  for (const Figure& f : figures)
    if (f.section.empty()) h += figure_html(f, figures_dir, "", "");
  if (h.empty()) return h;
  return "<section id=\"across-models\"><h2>Across models</h2>\n" + h + "</section>\n";
}

// The links to the report's data files, and the page's end.
std::string page_end() {
  return "<section id=\"files\"><h2>Data</h2>\n<p><a href=\"runs.csv\">runs.csv</a> (one row "
         "per run) · <a href=\"steps.csv\">steps.csv</a> (one row per step, cumulative samples, "
         "gradient evaluations, FLOPs, time and energy) · <a href=\"claims.csv\">claims.csv</a> "
         "(one row per claim, its verdicts at each basis) · <a href=\"summary.md\">summary.md</a> "
         "(these tables in Markdown). Each "
         "figure's data and gnuplot script are in figures/.</p></section>\n"
         "</main>\n<script>" +
         std::string(kScript) + "</script>\n</body>\n</html>\n";
}

}  // namespace

std::string report_html(const ReportData& data, const std::vector<Figure>& figures,
                        const std::string& dir) {
  const fs::path figures_dir = fs::path(dir) / "figures";
  std::string h = page_head(data);
  h += recommendations_section(data);
  h += findings_section(data);
  for (const std::string& model : data.models)
    h += model_section(data, model, figures, figures_dir);
  h += across_models_section(figures, figures_dir);
  h += page_end();
  return h;
}

}  // namespace gradscope
