#include "gradscope/report/recommendations.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/statistics.h"
#include "gradscope/report/claims.h"
#include "gradscope/report/format.h"

namespace gradscope {

namespace {

// Step time breaks a tie only between groups that both have one: a group whose every run's
// timings were disturbed has none (groups.h).
bool faster(const Interval& a, const Interval& b) { return a.n > 0 && b.n > 0 && a.mean < b.mean; }

double memory_cap(const ReportRun& r) {
  return static_cast<double>(r.record.config.memory_cap_bytes);
}

// Budgets of one model's groups: the caps runs ran under, those given, else the data's own
// range of peaks.
std::map<double, std::string> budgets_of(const GroupedRuns& data, const std::vector<size_t>& mine,
                                         const std::vector<int64_t>& memory_budgets) {
  std::map<double, std::string> budgets;
  for (size_t i : mine)
    for (size_t r : data.groups[i].runs) {
      const double cap = memory_cap(data.runs[r]);
      if (cap > 0) budgets.emplace(cap, "a memory cap in the data");
    }
  for (int64_t b : memory_budgets) budgets[static_cast<double>(b)] = "--memory-budget";
  std::vector<double> peaks;
  for (size_t i : mine)
    if (data.groups[i].peak_bytes.n > 0) peaks.push_back(data.groups[i].peak_bytes.mean);
  if (budgets.empty() && !peaks.empty()) {
    std::sort(peaks.begin(), peaks.end());
    budgets.emplace(peaks.front(), "the leanest run's peak");
    budgets.emplace(peaks[peaks.size() / 2], "the median run's peak");
    budgets.emplace(0.0, "no limit");
  }
  return budgets;
}

// Why a group does not fit a budget, or "" when it does.
std::string miss_reason(const GroupedRuns& data, const Group& g, double budget) {
  std::string reason;
  // A run that ran out of memory under a cap within this budget does not fit.
  for (size_t r : g.runs) {
    const double cap = memory_cap(data.runs[r]);
    if (data.runs[r].record.status == RunStatus::kOom &&
        (budget == 0 || (cap > 0 && cap <= budget)))
      reason = cap > 0 ? fmt::format("ran out of memory under a {} cap", format_bytes(cap))
                       : "ran out of memory";
  }
  if (reason.empty() && g.ok_runs.empty()) reason = "no successful run (" + g.statuses + ")";
  if (reason.empty() && budget > 0 && g.peak_bytes.n > 0 && g.peak_bytes.mean > budget)
    reason = fmt::format("peak {}", format_bytes(g.peak_bytes.mean));
  if (reason.empty() && budget > 0 && g.peak_bytes.n == 0) reason = "peak not measured";
  return reason;
}

// The time, energy and samples the best group's runs took to reach `equal` evaluations, over
// seeds; time and energy over the runs whose timings were not disturbed (groups.h).
void time_to_point(const GroupedRuns& data, double equal, Recommendation& rec) {
  std::vector<double> t, e, n;
  for (size_t r : data.groups[*rec.best].ok_runs) {
    for (const CurvePoint& p : data.runs[r].curve)
      if (p.evaluations >= equal * (1 - 1e-12)) {
        n.push_back(p.samples);
        if (data.runs[r].timing_disturbed()) break;
        t.push_back(p.time_s);
        if (std::isfinite(p.energy_j)) e.push_back(p.energy_j);
        break;
      }
  }
  rec.time_to_point_s = t.empty() ? kNaN : mean_interval(t).mean;
  rec.equal_samples = n.empty() ? kNaN : mean_interval(n).mean;
  rec.energy_known = !e.empty() && e.size() == t.size();
  rec.energy_to_point_j = rec.energy_known ? mean_interval(e).mean : kNaN;
}

// Why a group that fits is not ranked, or "" when it is: a run that did not end ok (it
// diverged, or failed), or one whose last loss is above its first (it blew up without a NaN).
std::string unranked_reason(const GroupedRuns& data, const Group& g) {
  if (g.ok_runs.size() != g.runs.size())
    return fmt::format("{} of {} runs ok", g.ok_runs.size(), g.runs.size());
  for (size_t r : g.ok_runs) {
    const std::vector<CurvePoint>& c = data.runs[r].curve;
    if (c.size() >= 2 && c.back().loss > c.front().loss)
      return fmt::format("seed {} ended at loss {:.4g}, above its first {:.4g}",
                         data.runs[r].seed(), c.back().loss, c.front().loss);
  }
  return "";
}

// The ranked groups other than `best` whose per-seed losses are not significantly above the
// best's: Welch's t test of each against the best, Holm's step-down over those with kMinSeeds
// seeds a side (the family errs at most kAlpha); with fewer seeds, none can be told apart.
template <typename SeedLosses>
std::vector<size_t> not_significantly_worse(const SeedLosses& seed_losses, size_t best,
                                            const std::vector<size_t>& ranked) {
  const std::vector<double> b = seed_losses(best);
  std::vector<size_t> out, tested;
  std::vector<double> p;
  for (size_t i : ranked) {
    if (i == best) continue;
    const std::vector<double> other = seed_losses(i);
    if (other.empty()) continue;
    const bool counts =
        static_cast<int>(b.size()) >= kMinSeeds && static_cast<int>(other.size()) >= kMinSeeds;
    const WelchTest w = welch_t_test(other, b);
    if (!counts || !w.valid || !(w.mean_a > w.mean_b)) {
      out.push_back(i);
    } else {
      tested.push_back(i);
      p.push_back(w.p);
    }
  }
  const std::vector<bool> worse = holm_rejections(p, kAlpha);
  for (size_t j = 0; j < tested.size(); ++j)
    if (!worse[j]) out.push_back(tested[j]);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<Recommendation> recommend(const GroupedRuns& data,
                                      const std::vector<int64_t>& memory_budgets) {
  std::vector<Recommendation> out;
  for (const std::string& model : data.models) {
    std::vector<size_t> mine;
    for (size_t i = 0; i < data.groups.size(); ++i)
      if (data.groups[i].model == model) mine.push_back(i);
    // Equal evaluations: the fewest any ok group of the model reached.
    double equal = std::numeric_limits<double>::infinity();
    for (size_t i : mine)
      if (std::isfinite(data.groups[i].evaluations_total))
        equal = std::min(equal, data.groups[i].evaluations_total);
    for (const auto& [budget, source] : budgets_of(data, mine, memory_budgets)) {
      Recommendation rec;
      rec.model = model;
      rec.budget_bytes = budget;
      rec.budget_source = source;
      rec.equal_evaluations = std::isfinite(equal) ? equal : 0;
      for (size_t i : mine) {
        const std::string reason = miss_reason(data, data.groups[i], budget);
        if (reason.empty()) {
          rec.fits.push_back(i);
        } else {
          rec.misses.push_back(i);
          rec.miss_reasons.push_back(reason);
        }
      }
      // Ranked: the fitting configurations whose every run ended ok and none above where it
      // started (a run that blew up without a NaN is not a contender); by validation loss
      // among those with one at the point, by training loss only when none has.
      std::vector<size_t> with, without;
      std::vector<std::pair<size_t, std::string>> unranked;
      for (size_t i : rec.fits) {
        const std::string why = unranked_reason(data, data.groups[i]);
        if (!why.empty())
          unranked.emplace_back(i, why);
        else
          (seed_val_losses_at(data, data.groups[i], Axis::kEvaluations, equal).empty() ? without
                                                                                       : with)
              .push_back(i);
      }
      const bool by_val = !with.empty();
      rec.loss_kind = by_val ? "validation" : "training";
      const std::vector<size_t>& ranked = by_val ? with : without;
      const auto seed_losses = [&](size_t i) {
        return by_val ? seed_val_losses_at(data, data.groups[i], Axis::kEvaluations, equal)
                      : seed_losses_at(data, data.groups[i], Axis::kEvaluations, equal);
      };
      for (size_t i : ranked) {
        const Group& g = data.groups[i];
        // The lowest loss; between losses equal to 0.01% (checkpointing, and accumulation at
        // the same effective batch, change only the rounding), the faster step.
        const Interval l = mean_interval(seed_losses(i));
        const bool tie = rec.best && std::abs(l.mean - rec.best_loss.mean) <=
                                         1e-4 * std::abs(rec.best_loss.mean);
        const bool better =
            l.n > 0 && (!rec.best || (!tie && l.mean < rec.best_loss.mean) ||
                        (tie && faster(g.step_s, data.groups[*rec.best].step_s)));
        if (better) {
          rec.best = i;
          rec.best_loss = l;
        }
      }
      std::vector<std::string> notes;
      if (!by_val && !without.empty())
        notes.push_back("no ranked configuration has a validation loss by then");
      if (rec.best) {
        time_to_point(data, equal, rec);
        rec.not_worse = not_significantly_worse(seed_losses, *rec.best, ranked);
        const auto train = [&](size_t i) {
          return format_interval(group_loss_at(data, data.groups[i], Axis::kEvaluations, equal));
        };
        // What was not ranked, with the training loss that could be compared at the point.
        if (by_val && !without.empty()) {
          std::string names;
          for (size_t i : without)
            names += fmt::format("{}{} (training {})", names.empty() ? "" : "; ",
                                 data.groups[i].label, train(i));
          notes.push_back(fmt::format(
              "not ranked, no validation loss by then: {}; the chosen one's training loss there "
              "{}",
              names, train(*rec.best)));
        }
      }
      if (!unranked.empty()) {
        std::string names;
        for (const auto& [i, why] : unranked)
          names += fmt::format("{}{} ({})", names.empty() ? "" : "; ", data.groups[i].label, why);
        notes.push_back("not ranked: " + names);
      }
      for (const std::string& n : notes) rec.loss_note += (rec.loss_note.empty() ? "" : "; ") + n;
      rec.loss_notes = std::move(notes);
      out.push_back(rec);
    }
  }
  return out;
}

}  // namespace gradscope
