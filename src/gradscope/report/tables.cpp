#include "gradscope/report/tables.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/report/encode.h"
#include "gradscope/report/scaling.h"

namespace gradscope {

namespace {

std::string budget_text(const Recommendation& r) {
  return r.budget_bytes > 0 ? format_bytes(r.budget_bytes) : std::string("no limit");
}

std::string bytes_or_na(const Interval& i) {
  return i.n > 0 ? format_bytes(i.mean) : std::string("n/a");
}

std::string seconds_or_na(const Interval& i) {
  return i.n > 0 ? format_duration(i.mean) : std::string("n/a");
}

// After a group's statuses, what would have fitted its first run that ran out of memory and
// kept the estimate's answer ("" when none did).
std::string oom_note(const ReportData& data, const Group& g) {
  for (size_t r : g.runs) {
    const RunRecord& record = data.runs[r].record;
    if (record.status == RunStatus::kOom && record.failure && record.failure->memory &&
        record.failure->memory->fit)
      return " (oom: " + fit_hint_text(*record.failure->memory->fit) + ")";
  }
  return "";
}

}  // namespace

std::string fit_hint_text(const MemoryFit& fit) {
  if (fit.estimated_peak_bytes <= fit.cap_bytes)
    return "the estimate put this run within the cap: no answer of what would have fitted";
  std::vector<std::string> parts;
  if (fit.max_batch > 0) parts.push_back(fmt::format("--batch {}", fit.max_batch));
  if (fit.cheapest) {
    std::string flags;
    for (const std::string& f : fit.cheapest->flags) flags += (flags.empty() ? "" : " ") + f;
    parts.push_back(flags + " (" + fit.cheapest->method + ")");
  }
  if (parts.empty())
    return fmt::format("nothing tried fits {}: not a micro-batch of 1, nor any of {} methods",
                       format_bytes(static_cast<double>(fit.cap_bytes)), fit.tried.size());
  return "by the estimate, would have fitted: " + parts[0] +
         (parts.size() > 1 ? ", or " + parts[1] : "");
}

std::string markdown_table(const Table& t) {
  std::string text = "|";
  for (const auto& h : t.header) text += " " + markdown_escape(h) + " |";
  text += "\n|";
  for (size_t i = 0; i < t.header.size(); ++i) text += "---|";
  text += "\n";
  for (const auto& row : t.rows) {
    text += "|";
    for (const auto& c : row) text += " " + markdown_escape(c) + " |";
    text += "\n";
  }
  return text;
}

std::string html_table(const Table& t, const std::string& css_class) {
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

Table recommendations_table(const ReportData& data) {
  Table t{{"model", "memory budget", "use", "loss at equal gradient evaluations",
           "not significantly worse (Welch, Holm, 95%)", "evaluations", "samples", "time to them",
           "energy to them", "does not fit"},
          {}};
  for (const Recommendation& r : data.recommendations) {
    std::string misses;
    for (size_t i = 0; i < r.misses.size(); ++i)
      misses += (i ? "; " : "") + data.groups[r.misses[i]].label + " (" + r.miss_reasons[i] + ")";
    std::string not_worse;
    for (size_t i : r.not_worse)
      not_worse += (not_worse.empty() ? "" : "; ") + data.groups[i].label;
    const Group* best = r.best ? &data.groups[*r.best] : nullptr;
    std::string loss = "n/a";
    if (best) loss = r.loss_kind + " " + format_interval(r.best_loss);
    if (!r.loss_note.empty()) loss += " (" + r.loss_note + ")";
    t.rows.push_back(
        {r.model,
         r.budget_bytes > 0 ? budget_text(r) + " (" + r.budget_source + ")" : budget_text(r),
         best             ? best->preset + ": " + best->label
         : r.fits.empty() ? std::string("nothing measured fits")
                          : std::string("nothing ranked"),
         loss, best ? (not_worse.empty() ? "none" : not_worse) : "-",
         format_count(r.equal_evaluations),
         best && std::isfinite(r.equal_samples) ? format_count(r.equal_samples) : "n/a",
         best && std::isfinite(r.time_to_point_s) ? format_duration(r.time_to_point_s) : "n/a",
         best && r.energy_known ? format_joules(r.energy_to_point_j) : "n/a",
         misses.empty() ? "-" : misses});
  }
  return t;
}

RecommendationView recommendation_view(const ReportData& data, const Recommendation& r) {
  RecommendationView v;
  const Group* best = r.best ? &data.groups[*r.best] : nullptr;
  v.budget = budget_text(r);
  v.pick = best             ? best->preset + ": " + best->label
           : r.fits.empty() ? std::string("nothing measured fits")
                            : std::string("nothing ranked");
  v.loss = best ? r.loss_kind + " " + format_interval(r.best_loss) : "n/a";
  v.scale = best ? fmt::format("at {} gradient evaluations, {} seed{}",
                               format_count(r.equal_evaluations), r.best_loss.n,
                               r.best_loss.n == 1 ? "" : "s")
                 : "-";
  std::vector<std::string> not_worse;
  for (size_t i : r.not_worse) not_worse.push_back(data.groups[i].label);
  v.alternatives = !best                  ? "-"
                   : not_worse.empty()    ? "none"
                   : not_worse.size() == 1 ? not_worse.front()
                                           : fmt::format("{} configurations", not_worse.size());
  // Behind the line: every figure and name the row's full table (recommendations_table) has.
  v.details.push_back({"memory budget", {r.budget_bytes > 0
                                             ? budget_text(r) + ": " + r.budget_source
                                             : budget_text(r)}});
  if (best) {
    v.details.push_back({"not significantly worse (Welch, Holm, 95%)",
                         not_worse.empty() ? std::vector<std::string>{"none"} : not_worse});
    v.details.push_back(
        {"to that point",
         {fmt::format("{} gradient evaluations, {} samples, {} of training, {} of energy",
                      format_count(r.equal_evaluations),
                      std::isfinite(r.equal_samples) ? format_count(r.equal_samples) : "n/a",
                      std::isfinite(r.time_to_point_s) ? format_duration(r.time_to_point_s)
                                                       : "n/a",
                      r.energy_known ? format_joules(r.energy_to_point_j) : "n/a")}});
  }
  if (!r.loss_notes.empty()) v.details.push_back({"ranking", r.loss_notes});
  std::vector<std::string> misses;
  for (size_t i = 0; i < r.misses.size(); ++i)
    misses.push_back(data.groups[r.misses[i]].label + " (" + r.miss_reasons[i] + ")");
  if (!misses.empty()) v.details.push_back({"does not fit", misses});
  return v;
}

Table findings_table(const ReportData& data) {
  Table t{{"claim (study)", "this database", "verdict (the study's basis: equal steps)",
           "at equal samples", "at equal gradient evaluations"},
          {}};
  for (const Finding& f : data.findings)
    t.rows.push_back({f.claim, f.measured, verdict_name(f.verdict),
                      verdict_name(f.verdict_equal_samples),
                      verdict_name(f.verdict_equal_evaluations)});
  return t;
}

// " (2 of 3 runs disturbed, left out)" after a group's step time, where any was.
std::string disturbed_note(const Group& g) {
  if (g.disturbed_runs.empty()) return "";
  return fmt::format(" ({} of {} runs disturbed, left out)", g.disturbed_runs.size(),
                     g.ok_runs.size());
}

Table groups_table(const ReportData& data, const std::string& model) {
  Table t{{"configuration", "preset", "seeds", "status", "train loss (last 10% of steps)",
           "val loss", "step time", "peak memory", "energy", "utilization"},
          {}};
  for (const Group& g : data.groups) {
    if (g.model != model) continue;
    t.rows.push_back({g.label, g.preset, std::to_string(g.runs.size()),
                      g.statuses + oom_note(data, g), format_interval(g.final_loss),
                      format_interval(g.val_loss),
                      seconds_or_na(g.step_s) + disturbed_note(g), bytes_or_na(g.peak_bytes),
                      g.energy_j.n ? format_joules(g.energy_j.mean) : "n/a",
                      g.util_pct.n ? fmt::format("{:.1f}%", g.util_pct.mean) : "n/a"});
  }
  return t;
}

Table ranks_table(const ReportData& data, const std::string& model) {
  Table t{{"configuration", "ranks", "global batch", "step time", "tokens/s", "scaling efficiency",
           "one-rank baseline", "communication per step", "overlapped with backward",
           "sent per step (rank 0)", "largest peak of a rank"},
          {}};
  for (const ScalingLine& line : scaling_lines(data, model)) {
    for (size_t i : line.groups) {
      const Group& g = data.groups[i];
      const double efficiency = scaling_efficiency(data, i);
      const std::optional<size_t> base = scaling_baseline(data, i);
      const auto comm = g.phase_s.find("communication");
      Interval peak = g.peak_bytes;
      for (const Interval& p : g.rank_peak_bytes)
        if (p.n > 0 && (peak.n == 0 || p.mean > peak.mean)) peak = p;
      t.rows.push_back(
          {g.label, ranks_text(g), std::to_string(g.config.global_batch()), seconds_or_na(g.step_s),
           g.tokens_per_s.n ? format_si(g.tokens_per_s.mean) : "n/a",
           std::isfinite(efficiency) ? fmt::format("{:.0f}%", 100 * efficiency) : "n/a",
           base ? data.groups[*base].label : std::string("none in the data"),
           comm == g.phase_s.end() ? "n/a" : seconds_or_na(comm->second),
           g.overlapped_share.n ? fmt::format("{:.0f}%", 100 * g.overlapped_share.mean) : "n/a",
           bytes_or_na(g.bytes_sent_per_step), bytes_or_na(peak)});
    }
  }
  return t;
}

Table evidence_table(const Finding& f) {
  const bool time = std::any_of(f.evidence.begin(), f.evidence.end(),
                                [](const Evidence& e) { return !e.time.empty(); });
  Table t{{"compared", "at equal steps", "at equal samples", "at equal gradient evaluations"}, {}};
  if (time) t.header.push_back("at equal time (shown, no verdict)");
  for (const Evidence& e : f.evidence) {
    t.rows.push_back({e.what, e.steps, e.samples, e.evaluations});
    if (time) t.rows.back().push_back(e.time);
  }
  return t;
}

// Hosts, devices and LibTorch versions of the runs, for the header.
std::string provenance(const ReportData& data) {
  std::set<std::string> devices, libtorch, sweeps, commits;
  // ISO 8601 UTC times order as text.
  std::string first_start, last_finish;
  for (const ReportRun& r : data.runs) {
    if (r.record.env && !r.record.env->device_name.empty())
      devices.insert(r.record.env->device_name);
    if (r.record.env && !r.record.env->libtorch.empty()) libtorch.insert(r.record.env->libtorch);
    if (r.record.env && !r.record.env->git_commit.empty()) commits.insert(r.record.env->git_commit);
    if (r.record.sweep) sweeps.insert(*r.record.sweep);
    if (!r.record.started_at.empty() && (first_start.empty() || r.record.started_at < first_start))
      first_start = r.record.started_at;
    if (r.record.finished_at > last_finish) last_finish = r.record.finished_at;
  }
  auto join = [](const std::set<std::string>& s) {
    std::string text;
    for (const auto& x : s) text += (text.empty() ? "" : ", ") + x;
    return text.empty() ? std::string("n/a") : text;
  };
  std::string text = fmt::format(
      "{} runs in {} configurations ({} attempts stored); sweeps: {}; devices: {}; "
      "LibTorch {}; gradscope commits: {}; runs started {} and finished {}",
      data.runs.size(), data.groups.size(), data.attempts, join(sweeps), join(devices),
      join(libtorch), join(commits), first_start.empty() ? "n/a" : first_start,
      last_finish.empty() ? "n/a" : last_finish);
  // Timings that measured a busy machine: the runs stay in everything but time, and are named
  // (the first few with their reasons; runs.csv marks every one).
  constexpr int64_t kNamed = 5;
  std::string disturbed;
  int64_t n_disturbed = 0;
  for (const ReportRun& r : data.runs) {
    if (!r.ok() || !r.timing_disturbed()) continue;
    if (++n_disturbed > kNamed) continue;
    const RunContention& c = *r.record.contention;
    std::string why;
    for (const std::string& reason : c.reasons) why += (why.empty() ? "" : "; ") + reason;
    disturbed += fmt::format("{}{} ({})", disturbed.empty() ? "" : "; ", r.run_id(), why);
  }
  if (n_disturbed > kNamed)
    disturbed += fmt::format("; and {} more (runs.csv: timing_disturbed)", n_disturbed - kNamed);
  if (n_disturbed > 0)
    text += fmt::format(
        "; {} run(s) had disturbed timings (other tasks competed for their cores while their "
        "timed steps ran, docs/metrics.md) and are left out of step times, throughput, phase "
        "times, utilization, energy, losses at equal time or energy, the time and energy "
        "figures and every verdict or recommendation that uses time: {}",
        n_disturbed, disturbed);
  // Left out, and said so: a record this version cannot read (a refused configuration that
  // an older version stored, a damaged row).
  if (!data.unreadable.empty()) {
    text +=
        fmt::format("; {} attempt(s) left out, their records unreadable: ", data.unreadable.size());
    for (size_t i = 0; i < data.unreadable.size(); ++i)
      text += (i ? "; " : "") + data.unreadable[i];
  }
  return text;
}

std::string markdown_summary(const ReportData& data) {
  std::string md = "# gradscope report\n\n" + markdown_escape(provenance(data)) + "\n\n";
  md +=
      "## Recommendations\n\nFor each model and memory budget: the optimizer and strategy with "
      "the lowest validation loss at equal gradient evaluations (samples x forward-backward "
      "passes) among the configurations that fit, whose every run ended ok and none above its "
      "first loss, and that have a validation loss by then (the others are named, with why or "
      "with their training loss; training loss ranks only when none has one), and the "
      "configurations not significantly worse (Welch's t test, Holm's correction, 95%).\n\n";
  md += markdown_table(recommendations_table(data));
  md += "\n## The study's claims\n\n" + markdown_table(findings_table(data));
  for (const Finding& f : data.findings) {
    md += fmt::format("\n- {}: {}", f.id, markdown_escape(f.rule));
    for (const std::string& note : f.notes) md += fmt::format("\n  - {}", markdown_escape(note));
  }
  md += "\n";
  for (const std::string& model : data.models) {
    md += "\n## " + markdown_escape(model) + "\n\n" + markdown_table(groups_table(data, model));
    const Table ranks = ranks_table(data, model);
    if (!ranks.rows.empty())
      md +=
          "\n### Ranks\n\nScaling efficiency on N ranks: tokens/s over N times the one-rank "
          "baseline's (the same configuration and per-rank batch).\n\n" +
          markdown_table(ranks);
  }
  return md;
}

}  // namespace gradscope
