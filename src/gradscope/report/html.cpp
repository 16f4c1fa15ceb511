#include "gradscope/report/html.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "gradscope/report/encode.h"
#include "gradscope/report/files.h"
#include "gradscope/report/tables.h"
#include "gradscope/report/timeline.h"

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
.v-not-comparable { background: #fff4d6; color: #7a5a00; }
.v-indicative-only { background: #e6eefb; color: #244a85; border: 1px dashed #7d9bd1; }
figure { margin: 12px 0 18px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eceef1; background: #fff; }
figcaption { font-size: 12.5px; color: #4b5361; max-width: 1000px; }
.axis-switch button { font-size: 12px; margin-right: 4px; padding: 3px 10px; border-radius: 12px;
  border: 1px solid #b9c0ca; background: #fff; cursor: pointer; }
.axis-switch button.active { background: #1d2330; color: #fff; border-color: #1d2330; }
.axis-figure { display: none; }
.axis-figure.active { display: block; }
details { margin: 4px 0 10px 0; font-size: 13px; }
summary { cursor: pointer; }
details.about > summary, details.more > summary { color: #5b6472; font-size: 12px; }
details.more { margin: 0; }
/* A short row, then the row of its disclosure: one line each until it is opened. */
tr.claim-row td, tr.rec-row td { border-bottom: none; padding-top: 6px; }
/* Figures stay on one line; a long configuration label wraps rather than widen the page. */
tr.rec-row td { white-space: nowrap; }
tr.rec-row td:nth-child(3) { white-space: normal; }
tr.claim-more td, tr.rec-more td { padding-top: 0; padding-bottom: 6px; font-size: 12px; }
dl.more { display: grid; grid-template-columns: fit-content(280px) 1fr; gap: 3px 14px;
  margin: 6px 0; max-width: 1100px; }
dl.more dt { font-weight: 600; color: #4b5361; }
dl.more dd { margin: 0; }
dl.more ul { margin: 0; padding-left: 18px; }
table.evidence { font-size: 12px; }
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
  return fmt::format("<span class=\"verdict {}\">{}</span>", verdict_class(v), verdict_name(v));
}

// A labelled entry of a disclosure: one item as text, several as a list; every item escaped.
std::string detail_entry(const std::string& label, const std::vector<std::string>& items) {
  std::string h = "<dt>" + html_escape(label) + "</dt><dd>";
  if (items.size() == 1) return h + html_escape(items.front()) + "</dd>\n";
  h += "<ul>";
  for (const std::string& item : items) h += "<li>" + html_escape(item) + "</li>";
  return h + "</ul></dd>\n";
}

// What stands behind a claim's verdict, in a closed disclosure: what the rule gave when the
// runs cannot carry a verdict, the verdicts at the fair bases, the rule, the correction, each
// named contrast, the evidence table (the figures at the three bases) and the notes.
std::string claim_details(const Finding& f) {
  std::string h = fmt::format(
      "<details class=\"more\"><summary>{}: the rule, the contrasts and the evidence</summary>\n"
      "<dl class=\"more\">\n",
      html_escape(f.id));
  if (f.verdict == Verdict::kIndicativeOnly)
    h += fmt::format(
        "<dt>indicative only</dt><dd>the rule gave: {}; the deciding runs cannot carry a verdict "
        "(untuned learning rates or too few steps)</dd>\n",
        verdict_badge(f.leaning));
  h += fmt::format(
      "<dt>at the fair bases</dt><dd>equal samples {} · equal gradient evaluations {}</dd>\n",
      verdict_badge(f.verdict_equal_samples), verdict_badge(f.verdict_equal_evaluations));
  // The headline row shows the measured figures while there is no headline.
  if (!f.headline.empty() && !f.measured.empty()) h += detail_entry("measured", {f.measured});
  h += detail_entry("rule", {f.rule});
  if (!f.correction.empty()) h += detail_entry("correction", {f.correction});
  if (!f.contrasts.empty()) h += detail_entry("contrasts", f.contrasts);
  h += "</dl>\n";
  if (!f.evidence.empty()) h += html_table(evidence_table(f), "evidence");
  for (const std::string& note : f.notes)
    h += "<p class=\"note\">" + html_escape(note) + "</p>\n";
  return h + "</details>";
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
      std::string(kCss) + timeline_css() + "</style>\n</head>\n<body>\n";
  h += "<header><h1>gradscope report</h1><p>" + html_escape(provenance(data)) +
       "</p></header>\n<main>\n";
  return h;
}

std::string recommendations_section(const ReportData& data) {
  return "<section id=\"recommendations\"><h2>Recommendations</h2>\n<p>For each model and "
         "memory budget: the optimizer and memory strategy with the lowest validation loss at "
         "equal gradient evaluations among the configurations that fit. Open a row for the "
         "others as good, what it took to get there, and what was left out.</p>\n"
         "<details class=\"about\"><summary>How a row is chosen</summary>\n<p>Equal gradient "
         "evaluations (samples x forward-backward passes) is equal compute, whatever an "
         "optimizer spends per step. Only a configuration whose every run ended ok, none above "
         "its first loss, is ranked; one with no validation loss by that point is not either, "
         "and the row names each left out, with why or with its training loss there; only when "
         "no ranked one has a validation loss does the row rank by training loss. \"Not "
         "significantly worse\" counts the configurations whose per-seed losses are not "
         "significantly above the chosen one's (Welch's t test, Holm's correction over the row "
         "at 95%, 3 seeds a side): the lead over them is within the seeds' spread. Budgets are "
         "the memory caps runs ran under, those passed with --memory-budget, or else the "
         "leanest and the median configuration's peak and no limit.</p>\n</details>\n" +
         recommendations_table_html(data) + "</section>\n";
}

// The study's claims: one short row each, what decides it behind a disclosure.
std::string findings_section(const ReportData& data) {
  return "<section id=\"findings\"><h2>The study's claims, re-examined</h2>\n<p>Each claim of "
         "\"Gradient Under Microscope\" beside what this database shows, with its verdict on the "
         "study's own basis (equal optimizer steps). Open a claim for its rule, its contrasts, "
         "the verdicts at equal samples and at equal gradient evaluations, and the evidence."
         "</p>\n<details class=\"about\"><summary>How a verdict is decided</summary>\n<p>Every "
         "verdict rests on the contrasts its claim names, of per-seed values: each needs at least "
         "3 seeds on each side, is tested two-sided (paired by seed over the seeds both sides "
         "ran where they share 3 or more, Welch's t test otherwise; ratios on the log scale), "
         "and the claim's contrasts are held at 95% together (Holm's step-down). Otherwise the "
         "verdict is not enough data, and each undecided contrast says what it could have "
         "detected. The fair comparisons "
         "are at equal samples (when a strategy changes how many samples a step sees) and at "
         "equal gradient evaluations (equal compute). A claim about a quantity this data does "
         "not measure (GPU utilization, on CPU runs) is not comparable here; a verdict from "
         "runs that cannot carry one (untuned learning rates, too few steps) is indicative "
         "only.</p>\n</details>\n" +
         claims_table_html(data.findings) + "</section>\n";
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
         std::string(kScript) + timeline_script() + "</script>\n</body>\n</html>\n";
}

}  // namespace

const char* verdict_class(Verdict v) {
  // A verdict's name holds spaces, and a space in a class attribute separates two classes.
  switch (v) {
    case Verdict::kReproduced:
      return "v-reproduced";
    case Verdict::kNotReproduced:
      return "v-not-reproduced";
    case Verdict::kNotEnoughData:
      return "v-not-enough-data";
    case Verdict::kNotComparable:
      return "v-not-comparable";
    case Verdict::kIndicativeOnly:
      return "v-indicative-only";
  }
  return "v-unknown";
}

std::string claims_table_html(const std::vector<Finding>& findings) {
  std::string h =
      "<table class=\"claims\">\n<thead><tr><th>claim (study)</th><th>verdict</th>"
      "<th>this database</th><th>scale of the deciding runs</th></tr></thead>\n<tbody>\n";
  for (const Finding& f : findings) {
    const std::string& headline = f.headline.empty() ? f.measured : f.headline;
    h += fmt::format(
        "<tr class=\"claim-row\" id=\"claim-{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "</tr>\n",
        html_escape(file_slug(f.id)), html_escape(f.claim), verdict_badge(f.verdict),
        html_escape(headline), html_escape(f.scale));
    h += "<tr class=\"claim-more\"><td colspan=\"4\">" + claim_details(f) + "</td></tr>\n";
  }
  return h + "</tbody></table>\n";
}

std::string recommendations_table_html(const ReportData& data) {
  std::string h =
      "<table class=\"recommendations\">\n<thead><tr><th>model</th><th>memory budget</th>"
      "<th>use</th><th>loss at equal gradient evaluations</th><th>read</th>"
      "<th>not significantly worse</th></tr></thead>\n<tbody>\n";
  for (const Recommendation& r : data.recommendations) {
    const RecommendationView v = recommendation_view(data, r);
    h += fmt::format(
        "<tr class=\"rec-row\"><td>{}</td><td>{}</td><td><b>{}</b></td><td>{}</td><td>{}</td>"
        "<td>{}</td></tr>\n",
        html_escape(r.model), html_escape(v.budget), html_escape(v.pick), html_escape(v.loss),
        html_escape(v.scale), html_escape(v.alternatives));
    h += "<tr class=\"rec-more\"><td colspan=\"6\"><details class=\"more\"><summary>what "
         "stands behind it</summary>\n<dl class=\"more\">\n";
    for (const auto& [label, items] : v.details) h += detail_entry(label, items);
    h += "</dl>\n</details></td></tr>\n";
  }
  return h + "</tbody></table>\n";
}

std::string report_html(const ReportData& data, const std::vector<Figure>& figures,
                        const std::string& dir) {
  const fs::path figures_dir = fs::path(dir) / "figures";
  std::string h = page_head(data);
  h += recommendations_section(data);
  h += findings_section(data);
  for (const std::string& model : data.models)
    h += model_section(data, model, figures, figures_dir);
  h += across_models_section(figures, figures_dir);
  h += timeline_section_html(data.timelines);
  h += page_end();
  return h;
}

}  // namespace gradscope
