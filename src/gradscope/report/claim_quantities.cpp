#include "gradscope/report/claim_quantities.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "gradscope/core/statistics.h"
#include "gradscope/report/format.h"

namespace gradscope {

namespace {

constexpr Axis kBases[] = {Axis::kSteps, Axis::kSamples};  // the study's basis first
constexpr const char* kTooClose =
    "The verdict turns on a difference smaller than its 95% interval: more seeds are needed.";

// The models a rule looks at: its own, else every model in the data.
std::vector<std::string> models_of(const GroupedRuns& data, const ClaimRule& rule) {
  return rule.measure.models.empty() ? data.models : rule.measure.models;
}

std::string models_text(const GroupedRuns& data, const ClaimRule& rule) {
  std::string text;
  for (const std::string& m : models_of(data, rule)) text += (text.empty() ? "" : ", ") + m;
  return text;
}

// ---- pairs of a strategy and the standard step ----

struct Pair {
  size_t a, b;  // groups: the treatment and the baseline
};

// Groups of `model` with strategy `treatment` matched to those with strategy "standard" whose
// configuration is the same apart from the strategy's own settings. Accumulation (k micro-
// batches of b) is matched both ways it is run: against standard at the same micro-batch b
// (the same memory, k times the samples per step) and at the same effective batch k x b.
std::vector<Pair> strategy_pairs(const GroupedRuns& data, const std::string& model,
                                 const std::string& treatment) {
  const std::set<std::string> erase = {"strategy", "accum_steps", "checkpoint_every",
                                       "checkpoint_policy", "batch"};
  std::vector<Pair> pairs;
  for (size_t a = 0; a < data.groups.size(); ++a) {
    const Group& ga = data.groups[a];
    if (ga.model != model || ga.strategy != treatment || ga.ok_runs.empty()) continue;
    const std::string key = key_without(ga, erase);
    const int64_t batch = ga.config.batch;
    const int64_t k = ga.config.accum_steps;
    for (size_t b = 0; b < data.groups.size(); ++b) {
      const Group& gb = data.groups[b];
      if (gb.model != model || gb.strategy != "standard" || gb.ok_runs.empty()) continue;
      if (gb.config.accum_steps != 1) continue;
      const int64_t other = gb.config.batch;
      const bool same_batch = other == batch || (treatment == "accumulation" && other == k * batch);
      if (same_batch && key_without(gb, erase) == key) pairs.push_back({a, b});
    }
  }
  return pairs;
}

std::vector<Pair> pairs_of(const GroupedRuns& data, const ClaimRule& rule) {
  std::vector<Pair> pairs;
  for (const std::string& model : models_of(data, rule))
    for (const Pair& p : strategy_pairs(data, model, rule.measure.treatment)) pairs.push_back(p);
  return pairs;
}

std::string pair_name(const GroupedRuns& data, const Pair& p) {
  const Group& a = data.groups[p.a];
  const Group& b = data.groups[p.b];
  std::string text = fmt::format("{} {}: {} vs {}", a.model, a.preset, a.label, b.label);
  if (a.config.accum_steps > 1)
    text += a.config.batch == b.config.batch
                ? fmt::format(" (same micro-batch {})", b.config.batch)
                : fmt::format(" (same effective batch {})", b.config.batch);
  return text;
}

// The common point of two groups on an axis: the smaller of their totals.
double common_point(const Group& a, const Group& b, Axis axis) {
  return axis == Axis::kSteps ? std::min(a.steps_total, b.steps_total)
                              : std::min(a.samples_total, b.samples_total);
}

// Ratio of two intervals' means, with the range the intervals allow.
struct Ratio {
  double value = kNaN, lo = kNaN, hi = kNaN;
};
Ratio ratio_of(const Interval& num, const Interval& den) {
  Ratio r;
  if (num.n == 0 || den.n == 0 || den.mean <= 0) return r;
  r.value = num.mean / den.mean;
  r.lo = den.hi() > 0 ? num.lo() / den.hi() : r.value;
  r.hi = den.lo() > 0 ? num.hi() / den.lo() : std::numeric_limits<double>::infinity();
  return r;
}

// Whether a pair's ratio is too close to the rule's per-pair threshold to call: the range its
// intervals allow holds the threshold (only when there are intervals).
bool straddles(const ClaimRule& rule, const Ratio& r, const Interval& x, const Interval& y) {
  if (!rule.thresholds.pair_threshold || !(x.has_interval() || y.has_interval())) return false;
  return r.lo <= *rule.thresholds.pair_threshold && *rule.thresholds.pair_threshold <= r.hi;
}

// ---- the quantities ----

ClaimMeasurement loss_ratio(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  const std::vector<Pair> pairs = pairs_of(data, rule);
  // The study's setup (same micro-batch) decides where the data has it.
  const auto same_micro = [&](const Pair& p) {
    return data.groups[p.a].config.batch == data.groups[p.b].config.batch;
  };
  const bool have_micro = std::any_of(pairs.begin(), pairs.end(), same_micro);
  std::vector<double> ratios[2];
  for (const Pair& p : pairs) {
    const Group& a = data.groups[p.a];
    const Group& b = data.groups[p.b];
    Evidence e;
    e.what = pair_name(data, p);
    const double mem = a.peak_bytes.mean / b.peak_bytes.mean;
    const bool decides = !have_micro || same_micro(p);
    if (decides) m.peak_ratio = std::max(m.peak_ratio, mem);
    for (int basis = 0; basis < 2; ++basis) {
      const Axis axis = kBases[basis];
      const double x = common_point(a, b, axis);
      const Interval la = group_loss_at(data, a, axis, x), lb = group_loss_at(data, b, axis, x);
      const Ratio r = ratio_of(lb, la);
      std::string text = "n/a";
      if (std::isfinite(r.value)) {
        text = fmt::format("at {} {}: loss {} vs {}, {} lower; peak memory {}", format_count(x),
                           axis_name(axis), format_interval(la), format_interval(lb),
                           format_ratio(r.value), format_ratio(mem));
        if (decides) {
          ratios[basis].push_back(r.value);
          m.too_close[basis] = m.too_close[basis] || straddles(rule, r, la, lb);
        }
      }
      (basis == 0 ? e.steps : e.samples) = text;
    }
    m.evidence.push_back(e);
  }
  for (int basis = 0; basis < 2; ++basis)
    if (!ratios[basis].empty()) m.value[basis] = median(ratios[basis]);
  if (pairs.empty()) {
    m.measured = fmt::format("no {} run with {} has a standard run to compare with",
                             models_text(data, rule), rule.measure.treatment);
  } else {
    m.measured = fmt::format(
        "loss ratio (median over {} pair(s) at the same {}) {} at equal steps, {} at equal "
        "samples; peak memory up to {}",
        ratios[0].size(), have_micro ? "micro-batch" : "effective batch",
        format_ratio(median(ratios[0])), format_ratio(median(ratios[1])),
        format_ratio(m.peak_ratio));
    m.notes.push_back(
        have_micro ? "At the same micro-batch, accumulation has seen k times the samples of the "
                     "standard run at equal steps; at equal samples both have seen the same data."
                   : "At the same effective batch, accumulation computes the same gradient as the "
                     "standard run (gradscope verify proves it), so the same loss is what the math "
                     "says; the study's setup keeps the micro-batch instead.");
  }
  if (m.too_close[0] || m.too_close[1]) m.notes.push_back(kTooClose);
  return m;
}

ClaimMeasurement cells_beating_adam(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  const std::vector<std::string> models = models_of(data, rule);
  const std::set<std::string> erase = {"optimizer", "opt", "lr", "weight_decay"};
  std::map<std::string, std::vector<size_t>> cells;
  for (size_t i = 0; i < data.groups.size(); ++i) {
    const Group& g = data.groups[i];
    if (g.ok_runs.empty() || std::find(models.begin(), models.end(), g.model) == models.end())
      continue;
    cells[key_without(g, erase)].push_back(i);
  }
  int adam_cells = 0, beaten[2] = {0, 0}, noisy[2] = {0, 0};
  for (const auto& [key, members] : cells) {
    const auto adam = std::find_if(members.begin(), members.end(),
                                   [&](size_t i) { return data.groups[i].optimizer == "adam"; });
    if (adam == members.end() || members.size() < 2) continue;
    ++adam_cells;
    const Group& ga = data.groups[*adam];
    Evidence e;
    e.what = fmt::format("{} {}, {}", ga.model, ga.preset, ga.strategy);
    for (int basis = 0; basis < 2; ++basis) {
      const Axis axis = kBases[basis];
      double x = std::numeric_limits<double>::infinity();
      for (size_t i : members)
        x = std::min(
            x, axis == Axis::kSteps ? data.groups[i].steps_total : data.groups[i].samples_total);
      const Interval adam_loss = group_loss_at(data, ga, axis, x);
      size_t best = *adam;
      Interval best_loss = adam_loss;
      for (size_t i : members) {
        const Interval l = group_loss_at(data, data.groups[i], axis, x);
        if (l.n > 0 && (best_loss.n == 0 || l.mean < best_loss.mean)) {
          best = i;
          best_loss = l;
        }
      }
      std::string text;
      if (best == *adam) {
        text = fmt::format("Adam best ({})", format_interval(adam_loss));
      } else {
        const bool clear = best_loss.hi() < adam_loss.lo() ||
                           (!best_loss.has_interval() && !adam_loss.has_interval());
        ++(clear ? beaten[basis] : noisy[basis]);
        text = fmt::format("{} {} < Adam {}{}", data.groups[best].label, format_interval(best_loss),
                           format_interval(adam_loss), clear ? "" : " (within the 95% intervals)");
      }
      (basis == 0 ? e.steps : e.samples) = fmt::format("at {}: {}", format_count(x), text);
    }
    m.evidence.push_back(e);
  }
  for (int basis = 0; basis < 2; ++basis) {
    if (adam_cells > 0) m.value[basis] = beaten[basis];
    // Cells where another optimizer leads within the intervals decide only when no cell is
    // clear.
    m.too_close[basis] = beaten[basis] == 0 && noisy[basis] > 0;
  }
  m.measured = adam_cells == 0
                   ? "no configuration ran Adam beside another optimizer"
                   : fmt::format(
                         "another optimizer beats Adam in {} of {} cell(s) at equal steps, "
                         "{} at equal samples",
                         beaten[0], adam_cells, beaten[1]);
  if (noisy[0] + noisy[1] > 0)
    m.notes.push_back(fmt::format(
        "{} comparison(s) where another optimizer is ahead of Adam by less than the 95% "
        "intervals: too close to call.",
        noisy[0] + noisy[1]));
  return m;
}

// The largest relative difference |a - b| / |b| of the loss at x, seed by seed where the two
// groups ran the same seeds, else of their means; nullopt when nothing could be compared.
std::optional<double> loss_difference_at(const GroupedRuns& data, const Group& a, const Group& b,
                                         Axis axis, double x) {
  double diff = 0;
  int matched = 0;
  for (size_t ia : a.ok_runs)
    for (size_t ib : b.ok_runs) {
      if (data.runs[ia].seed() != data.runs[ib].seed()) continue;
      const auto la = loss_at(data.runs[ia].curve, axis, x);
      const auto lb = loss_at(data.runs[ib].curve, axis, x);
      if (!la || !lb || *lb == 0) continue;
      diff = std::max(diff, std::abs(*la - *lb) / std::abs(*lb));
      ++matched;
    }
  if (matched > 0) return diff;
  const Interval la = group_loss_at(data, a, axis, x), lb = group_loss_at(data, b, axis, x);
  if (la.n > 0 && lb.n > 0 && lb.mean != 0) return std::abs(la.mean - lb.mean) / std::abs(lb.mean);
  return std::nullopt;
}

ClaimMeasurement loss_difference(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  double worst[2] = {0, 0};
  const std::vector<Pair> pairs = pairs_of(data, rule);
  for (const Pair& p : pairs) {
    const Group& a = data.groups[p.a];
    const Group& b = data.groups[p.b];
    Evidence e;
    e.what = pair_name(data, p);
    for (int basis = 0; basis < 2; ++basis) {
      const Axis axis = kBases[basis];
      const double x = common_point(a, b, axis);
      std::string text = "n/a";
      if (const auto diff = loss_difference_at(data, a, b, axis, x)) {
        worst[basis] = std::max(worst[basis], *diff);
        text =
            fmt::format("at {}: largest relative loss difference {:.2e}", format_count(x), *diff);
      }
      (basis == 0 ? e.steps : e.samples) = text;
    }
    m.evidence.push_back(e);
  }
  if (!pairs.empty()) {
    m.value[0] = worst[0];
    m.value[1] = worst[1];
  }
  m.measured = pairs.empty()
                   ? "no checkpointed run has a standard run to compare with"
                   : fmt::format("largest relative loss difference {:.2e} over {} pair(s)",
                                 worst[0], pairs.size());
  return m;
}

ClaimMeasurement step_time_ratio(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  std::vector<double> ratios;
  double worst = -1;
  for (const Pair& p : pairs_of(data, rule)) {
    const Group& a = data.groups[p.a];
    const Group& b = data.groups[p.b];
    if (a.step_s.n == 0 || b.step_s.n == 0) continue;
    const Ratio r = ratio_of(a.step_s, b.step_s);  // treatment time / baseline time
    ratios.push_back(r.value);
    worst = std::max(worst, r.value);
    m.too_close[0] = m.too_close[0] || straddles(rule, r, a.step_s, b.step_s);
    Evidence e;
    e.what = pair_name(data, p);
    e.steps = fmt::format("step {:.4g} s vs {:.4g} s: {}", a.step_s.mean, b.step_s.mean,
                          format_ratio(r.value));
    e.samples = e.steps;
    m.evidence.push_back(e);
  }
  if (ratios.empty()) {
    m.measured = "no checkpointed run has a standard run to compare with";
    return m;
  }
  m.value[0] = worst;
  m.same_at_both_bases();
  m.measured = fmt::format("step time {} to {} of standard over {} pair(s)",
                           format_ratio(*std::min_element(ratios.begin(), ratios.end())),
                           format_ratio(worst), ratios.size());
  if (m.too_close[0]) m.notes.push_back(kTooClose);
  return m;
}

bool is_gpu(const std::string& device) { return device == "gpu" || device.rfind("cuda", 0) == 0; }

ClaimMeasurement median_utilization(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  const std::vector<std::string> models = models_of(data, rule);
  std::vector<double> values;
  std::set<std::string> devices, sources;
  for (const ReportRun& r : data.runs) {
    if (!r.ok() || std::find(models.begin(), models.end(), r.record.config.model) == models.end())
      continue;
    const auto& u = r.record.utilization;
    if (!u || !u->mean_pct || !std::isfinite(*u->mean_pct)) continue;
    values.push_back(*u->mean_pct);
    if (!u->device.empty()) devices.insert(u->device);
    if (!u->source.empty()) sources.insert(u->source);
  }
  const std::string what = models_text(data, rule);
  if (values.empty()) {
    m.measured = fmt::format("no {} run measured utilization", what);
    return m;
  }
  m.value[0] = median(values);
  m.same_at_both_bases();
  m.measured = fmt::format("median {:.1f}% (range {:.1f}-{:.1f}%) over {} run(s)", *m.value[0],
                           *std::min_element(values.begin(), values.end()),
                           *std::max_element(values.begin(), values.end()), values.size());
  m.evidence.push_back({what, m.measured, m.measured});
  // A CPU's utilization is CPU time over wall time: not what the study measured.
  for (const std::string& d : devices)
    if (!is_gpu(d))
      m.notes.push_back(fmt::format(
          "Measured on {} ({}); the study measured GPU utilization, which means something "
          "else: compare GPU runs for this claim.",
          d, sources.empty() ? "unknown source" : *sources.begin()));
  return m;
}

}  // namespace

ClaimMeasurement measure_claim(const GroupedRuns& data, const ClaimRule& rule) {
  switch (rule.measure.quantity) {
    case ClaimQuantity::kLossRatio:
      return loss_ratio(data, rule);
    case ClaimQuantity::kCellsBeatingAdam:
      return cells_beating_adam(data, rule);
    case ClaimQuantity::kLossDifference:
      return loss_difference(data, rule);
    case ClaimQuantity::kStepTimeRatio:
      return step_time_ratio(data, rule);
    case ClaimQuantity::kMedianUtilization:
      return median_utilization(data, rule);
  }
  return {};
}

}  // namespace gradscope
