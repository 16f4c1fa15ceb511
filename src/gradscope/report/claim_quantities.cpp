#include "gradscope/report/claim_quantities.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "gradscope/core/statistics.h"
#include "gradscope/report/format.h"

namespace gradscope {

bool rate_tuned(const RunConfig& c) { return c.lr_auto || !c.lr_chosen_by.empty(); }

namespace {

// The models a rule looks at: its own, else every model in the data.
std::vector<std::string> models_of(const GroupedRuns& data, const ClaimRule& rule) {
  return rule.measure.models.empty() ? data.models : rule.measure.models;
}

std::string models_text(const GroupedRuns& data, const ClaimRule& rule) {
  std::string text;
  for (const std::string& m : models_of(data, rule)) text += (text.empty() ? "" : ", ") + m;
  return text;
}

std::string& basis_text(Evidence& e, int basis) {
  return basis == 0 ? e.steps : basis == 1 ? e.samples : e.evaluations;
}


// Whether a group has a run the claims count: ok, or diverged (counted_losses_at).
bool has_counted_run(const GroupedRuns& data, const Group& g) {
  return std::any_of(g.runs.begin(), g.runs.end(), [&](size_t i) {
    return data.runs[i].ok() || data.runs[i].record.status == RunStatus::kDiverged;
  });
}

// Per seed, a group's training loss at x over its ok runs and its diverged ones. A run that
// diverged counts as no better than it began: the larger of its first loss and its loss at x
// (the last tenth of its steps up to x), so a configuration that blows up is held against its
// rivals instead of dropped.
struct SeedValues {
  std::vector<double> values;
  std::vector<uint64_t> seeds;
  int diverged = 0;
};
SeedValues counted_losses_at(const GroupedRuns& data, const Group& g, Axis axis, double x) {
  SeedValues s;
  for (size_t i : g.runs) {
    const ReportRun& r = data.runs[i];
    const bool diverged = r.record.status == RunStatus::kDiverged;
    if ((!r.ok() && !diverged) || (measured_axis(axis) && r.timing_disturbed())) continue;
    std::optional<double> l = loss_at(r.curve, axis, x);
    if (diverged && !r.curve.empty()) {
      l = std::max(r.curve.front().loss, l.value_or(r.curve.front().loss));
      ++s.diverged;
    }
    if (!l || !std::isfinite(*l)) continue;
    s.values.push_back(*l);
    s.seeds.push_back(r.seed());
  }
  return s;
}

// One value per ok run of a group that has it, with its seed (what a t test is given).
SeedValues seed_values(const GroupedRuns& data, const Group& g,
                       const std::function<std::optional<double>(const RunRecord&)>& f) {
  SeedValues v;
  for (size_t i : g.ok_runs)
    if (const auto x = f(data.runs[i].record); x && std::isfinite(*x)) {
      v.values.push_back(*x);
      v.seeds.push_back(data.runs[i].seed());
    }
  return v;
}

// ---- pairs of a strategy and the standard step ----

struct Pair {
  size_t a, b;  // groups: the treatment and the baseline
  // Accumulation only: the standard run has the treatment's micro-batch (the study's setup,
  // k times fewer samples per step) rather than its effective batch.
  bool same_micro = false;
  // Accumulation only: the two ran at different rates, each tuned for its own step.
  bool own_rates = false;
};

// Groups of `model` with strategy `treatment` matched to those with strategy "standard" whose
// configuration is the same apart from the strategy's own settings. Accumulation (k micro-
// batches of b, effective batch k x b) is matched both ways it is run: against standard at
// the same micro-batch b (the same memory, k times fewer samples per step: the study's setup)
// and at the same effective batch k x b (the same gradient, by construction). Other
// treatments are matched at the same batch.
std::vector<Pair> strategy_pairs(const GroupedRuns& data, const std::string& model,
                                 const std::string& treatment) {
  // eval_batches counts effective batches, so a grid that evaluates every run on the same
  // samples gives accumulation fewer of them; evaluation never changes training, and the
  // claims compare training losses.
  const std::set<std::string> erase = {"strategy",          "accum_steps", "checkpoint_every",
                                       "checkpoint_policy", "batch",       "eval_batches"};
  std::vector<Pair> pairs;
  for (size_t a = 0; a < data.groups.size(); ++a) {
    const Group& ga = data.groups[a];
    if (ga.model != model || ga.strategy != treatment || !has_counted_run(data, ga)) continue;
    const std::string key = key_without(ga, erase);
    std::set<std::string> erase_rate = erase;
    erase_rate.insert("lr");
    const std::string key_any_rate = key_without(ga, erase_rate);
    const int64_t micro = ga.config.batch;
    const int64_t effective = ga.config.accum_steps * micro;
    for (size_t b = 0; b < data.groups.size(); ++b) {
      const Group& gb = data.groups[b];
      if (gb.model != model || gb.strategy != "standard" || !has_counted_run(data, gb)) continue;
      if (gb.config.accum_steps != 1) continue;
      // Accumulation at a rate fixed for it by a recorded choice meets the standard step at the
      // rate fixed for that (a searched rate, --lr auto, is the run's own: those groups match
      // by their settings, not their found rates).
      const bool same = key_without(gb, erase) == key;
      const bool own_rates = !same && treatment == "accumulation" &&
                             ga.config.lr != gb.config.lr && !ga.config.lr_auto &&
                             !gb.config.lr_auto && !ga.config.lr_chosen_by.empty() &&
                             !gb.config.lr_chosen_by.empty() &&
                             key_without(gb, erase_rate) == key_any_rate;
      if (!same && !own_rates) continue;
      const int64_t other = gb.config.batch;
      if (treatment == "accumulation" && ga.config.accum_steps > 1) {
        if (other == micro) pairs.push_back({a, b, true, own_rates});
        if (other == effective) pairs.push_back({a, b, false, own_rates});
      } else if (other == micro) {
        pairs.push_back({a, b, false});
      }
    }
  }
  // Groups that differ only in eval_batches (a grid changed between sweeps on one database,
  // on either side) would make one comparison twice: keep one pair per pair of configurations
  // apart from eval_batches, the one evaluated on the same samples where there is one.
  const auto evaluated = [&](size_t g) {
    const RunConfig& c = data.groups[g].config;
    return c.eval_batches * c.effective_batch();
  };
  std::map<std::tuple<std::string, bool, std::string>, size_t> kept;  // -> index in `unique`
  std::vector<Pair> unique;
  for (const Pair& p : pairs) {
    const auto key = std::make_tuple(key_without(data.groups[p.b], {"eval_batches"}), p.same_micro,
                                     key_without(data.groups[p.a], {"eval_batches"}));
    const auto it = kept.find(key);
    if (it == kept.end()) {
      kept.emplace(key, unique.size());
      unique.push_back(p);
    } else if (evaluated(p.a) == evaluated(p.b) &&
               evaluated(unique[it->second].a) != evaluated(p.b)) {
      unique[it->second] = p;
    }
  }
  return unique;
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
  if (a.config.accum_steps > 1) {
    const int64_t k = a.config.accum_steps;
    text += p.same_micro
                ? fmt::format(" (same micro-batch {}: effective batch {} vs {}, the study's setup)",
                              b.config.batch, k * a.config.batch, b.config.batch)
                : fmt::format(
                      " (same effective batch {}: micro-batch {} vs {}, the same "
                      "gradient by construction)",
                      b.config.batch, a.config.batch, b.config.batch);
  }
  if (p.own_rates)
    text += fmt::format(" at rates {:.3g} vs {:.3g}, each tuned for its own step", a.config.lr,
                        b.config.lr);
  return text;
}

// A pair as a contrast's name: "nanovlm tiny, adam: standard vs accumulation, same micro-batch".
std::string contrast_name(const GroupedRuns& data, const Pair& p) {
  const Group& a = data.groups[p.a];
  const Group& b = data.groups[p.b];
  std::string text = fmt::format("{} {}: {} vs {}", a.model, a.preset, a.label, b.label);
  if (a.config.accum_steps > 1)
    text += p.same_micro ? ", same micro-batch" : ", same effective batch";
  if (p.own_rates) text += ", each at its own tuned rate";
  return text;
}

// A pair in a few words: "nanovlm adam, same micro-batch".
std::string contrast_brief(const GroupedRuns& data, const Pair& p) {
  const Group& a = data.groups[p.a];
  std::string text = a.model + " " + a.optimizer;
  if (a.config.accum_steps > 1)
    text += p.same_micro ? ", same micro-batch" : ", same effective batch";
  if (p.own_rates) text += ", own rates";
  return text;
}

// The common point of two groups on an axis: the smaller of their totals (a side whose runs
// all diverged has none: the other side's).
double common_point(const Group& a, const Group& b, Axis axis) {
  const double x = a.total(axis), y = b.total(axis);
  return std::isnan(x) ? y : std::isnan(y) ? x : std::min(x, y);
}

// A contrast of a's losses against b's at x: per seed, diverged runs counted.
ClaimTest loss_test(const SeedValues& a, const SeedValues& b, size_t evidence, std::string name,
                    std::vector<size_t> groups) {
  ClaimTest t;
  t.a = a.values;
  t.b = b.values;
  t.seeds_a = a.seeds;
  t.seeds_b = b.seeds;
  t.evidence = evidence;
  t.name = std::move(name);
  t.groups = std::move(groups);
  return t;
}

std::string diverged_text(const SeedValues& a, const SeedValues& b) {
  if (a.diverged + b.diverged == 0) return "";
  return fmt::format(" ({} and {} diverged seed(s) counted as no better than they began)",
                     a.diverged, b.diverged);
}

std::string seeds_text(const std::vector<double>& v) { return fmt::format("{} seed(s)", v.size()); }

// ---- the quantities ----

ClaimMeasurement loss_ratio(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  const std::vector<Pair> pairs = pairs_of(data, rule);
  // The study's setup (same micro-batch) decides where the data has it.
  const bool have_micro =
      std::any_of(pairs.begin(), pairs.end(), [](const Pair& p) { return p.same_micro; });
  std::vector<double> ratios[2][kBases];  // [same micro-batch][basis]: ratios of the means
  for (const Pair& p : pairs) {
    const Group& a = data.groups[p.a];
    const Group& b = data.groups[p.b];
    // Accumulation at its own tuned rate is shown beside: the standard run's rate is the
    // study's reading, and one cell gets one vote.
    const bool decides = p.same_micro == have_micro && !p.own_rates;
    Evidence e;
    e.what = pair_name(data, p) + (decides ? "" : " [shown, does not decide]");
    const double mem = a.peak_bytes.mean / b.peak_bytes.mean;
    if (decides && std::isfinite(mem)) m.peak_ratio = std::max(m.peak_ratio, mem);
    for (int basis = 0; basis < kBases; ++basis) {
      const Axis axis = basis_axis(basis);
      const double x = common_point(a, b, axis);
      const SeedValues sa = counted_losses_at(data, a, axis, x);
      const SeedValues sb = counted_losses_at(data, b, axis, x);
      const Interval ia = mean_interval(sa.values), ib = mean_interval(sb.values);
      std::string& text = basis_text(e, basis);
      if (ia.n == 0 || ib.n == 0 || !(ia.mean > 0)) {
        text = "n/a";
        continue;
      }
      const double r = ib.mean / ia.mean;
      ratios[p.same_micro][basis].push_back(r);
      text = fmt::format("at {} {}: loss {} vs {} ({} vs {}){}, {} lower; peak memory {}",
                         format_count(x), axis_name(axis), format_interval(ia), format_interval(ib),
                         seeds_text(sa.values), seeds_text(sb.values), diverged_text(sa, sb),
                         format_ratio(r), format_ratio(mem));
      // Standard (b) against the threshold times accumulation (a).
      if (decides)
        m.tests[basis].push_back(
            loss_test(sb, sa, m.evidence.size(), contrast_name(data, p), {p.b, p.a}));
      if (decides) m.tests[basis].back().brief = contrast_brief(data, p);
    }
    m.evidence.push_back(e);
  }
  if (pairs.empty()) {
    m.measured = fmt::format("no {} run with {} has a standard run to compare with",
                             models_text(data, rule), rule.measure.treatment);
    return m;
  }
  const auto summary = [&](bool micro) {
    return fmt::format(
        "loss ratio standard / accumulation at the same {} (median over {} pair(s)): {} at equal "
        "steps, {} at equal samples, {} at equal evaluations",
        micro ? "micro-batch" : "effective batch", ratios[micro][0].size(),
        format_ratio(median(ratios[micro][0])), format_ratio(median(ratios[micro][1])),
        format_ratio(median(ratios[micro][2])));
  };
  m.measured = summary(have_micro);
  if (have_micro && !ratios[0][0].empty()) m.measured += "; " + summary(false) + " (shown only)";
  m.measured += fmt::format("; peak memory up to {}", format_ratio(m.peak_ratio));
  m.notes.push_back(
      "At the same micro-batch (the study's setup), accumulation has seen k times the samples of "
      "the standard run at equal steps; at equal samples both have seen the same data.");
  if (!ratios[0][0].empty())
    m.notes.push_back(
        "At the same effective batch, accumulation computes the same gradient as the standard run "
        "(gradscope verify proves it), so the same loss is what the math says.");
  if (!have_micro)
    m.notes.push_back(
        "No accumulation run here has a standard run at its micro-batch (the study's setup); "
        "the verdict rests on the same effective batch.");
  return m;
}

// Whether a group (another optimizer's, against Adam) is one of the contrasts the claim names.
bool names_contrast(const ClaimMeasure& measure, const Group& g) {
  const auto in = [](const std::vector<std::string>& names, const std::string& name) {
    return names.empty() || std::find(names.begin(), names.end(), name) != names.end();
  };
  return in(measure.contrast_models, g.model) && in(measure.contrast_optimizers, g.optimizer) &&
         (measure.contrast_strategy.empty() || measure.contrast_strategy == g.strategy);
}

ClaimMeasurement cells_beating_adam(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  const std::vector<std::string> models = models_of(data, rule);
  const std::set<std::string> erase = {"optimizer", "opt", "lr", "weight_decay"};
  std::map<std::string, std::vector<size_t>> cells;
  for (size_t i = 0; i < data.groups.size(); ++i) {
    const Group& g = data.groups[i];
    if (!has_counted_run(data, g) ||
        std::find(models.begin(), models.end(), g.model) == models.end())
      continue;
    cells[key_without(g, erase)].push_back(i);
  }
  int adam_cells = 0, lower[kBases] = {0, 0, 0};
  for (const auto& [key, members] : cells) {
    // A cell may hold Adam more than once (two learning rates, say): another optimizer is held
    // against Adam's best group of the cell at each basis, and Adam is never its own rival.
    std::vector<size_t> adams, others;
    for (size_t i : members) (data.groups[i].optimizer == "adam" ? adams : others).push_back(i);
    if (adams.empty() || others.empty()) continue;
    ++adam_cells;
    // Every basis, and equal time beside them (shown, no verdict).
    double x[kBases + 1];
    for (int basis = 0; basis <= kBases; ++basis) {
      const Axis axis = basis < kBases ? basis_axis(basis) : Axis::kTime;
      x[basis] = std::numeric_limits<double>::infinity();
      for (size_t i : members) x[basis] = std::min(x[basis], data.groups[i].total(axis));
    }
    size_t best_adam[kBases + 1];
    for (int basis = 0; basis <= kBases; ++basis) {
      const Axis axis = basis < kBases ? basis_axis(basis) : Axis::kTime;
      best_adam[basis] = adams.front();
      double best = std::numeric_limits<double>::infinity();
      for (size_t i : adams) {
        const Interval l = group_loss_at(data, data.groups[i], axis, x[basis]);
        if (l.n > 0 && l.mean < best) {
          best = l.mean;
          best_adam[basis] = i;
        }
      }
    }
    for (size_t i : others) {
      const Group& go = data.groups[i];
      const Group& first = data.groups[adams.front()];
      const bool decides = names_contrast(rule.measure, go);
      Evidence e;
      e.what = fmt::format("{} {}, {}: {} vs Adam{}{}", first.model, first.preset, first.strategy,
                           go.label, adams.size() > 1 ? " (its best group at each point)" : "",
                           decides ? "" : " [shown, does not decide]");
      for (int basis = 0; basis <= kBases; ++basis) {
        const Axis axis = basis < kBases ? basis_axis(basis) : Axis::kTime;
        const Group& ga = data.groups[best_adam[basis]];
        const SeedValues so = counted_losses_at(data, go, axis, x[basis]);
        const SeedValues sa = counted_losses_at(data, ga, axis, x[basis]);
        const Interval io = mean_interval(so.values), ia = mean_interval(sa.values);
        std::string text =
            fmt::format("at {} {}: {} vs Adam {}{}", format_count(x[basis]), axis_name(axis),
                        format_interval(io), format_interval(ia), diverged_text(so, sa));
        if (basis < kBases && io.n > 0 && ia.n > 0) {
          if (io.mean < ia.mean) ++lower[basis];
          if (decides)
            m.tests[basis].push_back(loss_test(
                so, sa, m.evidence.size(),
                fmt::format("{} {}, {}: {} vs adam", go.model, go.preset, go.strategy,
                            go.optimizer),
                {i, best_adam[basis]}));
          if (decides) m.tests[basis].back().brief = go.model + " " + go.optimizer + " vs adam";
        }
        (basis < kBases ? basis_text(e, basis) : e.time) = text;
      }
      m.evidence.push_back(e);
    }
  }
  m.measured =
      adam_cells == 0
          ? "no configuration ran Adam beside another optimizer"
          : fmt::format(
                "in {} cell(s) with Adam, {} comparison(s) with a lower mean loss than Adam's at "
                "equal steps, {} at equal samples, {} at equal gradient evaluations (the "
                "verdicts count only significant ones)",
                adam_cells, lower[0], lower[1], lower[2]);
  return m;
}

// Per seed, |log(a's loss / b's loss)| at x over the seeds both ran ok: how far apart two runs
// that differ only in how a step is computed ended, free of the seeds' spread.
SeedValues abs_log_ratios(const GroupedRuns& data, const Group& a, const Group& b, Axis axis,
                          double x) {
  std::map<uint64_t, double> of_b;
  for (size_t i : b.ok_runs)
    if (auto l = loss_at(data.runs[i].curve, axis, x)) of_b[data.runs[i].seed()] = *l;
  SeedValues s;
  for (size_t i : a.ok_runs) {
    const auto l = loss_at(data.runs[i].curve, axis, x);
    const auto other = of_b.find(data.runs[i].seed());
    if (l && other != of_b.end() && *l > 0 && other->second > 0) {
      s.values.push_back(std::abs(std::log(*l / other->second)));
      s.seeds.push_back(data.runs[i].seed());
    }
  }
  return s;
}

// A model's noise floor at a basis: the per-seed |log ratio| of every run of accumulation at
// the standard runs' effective batch (the same gradient by construction, summed in another
// order) against its standard run, over the model's optimizers at the same preset on the same
// device as `like`. Two runs that should train alike drift this far apart.
std::vector<double> noise_floor(const GroupedRuns& data, const Group& like, Axis axis) {
  std::vector<double> floor;
  for (const Pair& p : strategy_pairs(data, like.model, "accumulation")) {
    if (p.same_micro || p.own_rates) continue;
    const Group& a = data.groups[p.a];
    const Group& b = data.groups[p.b];
    if (b.preset != like.preset || b.config.device != like.config.device) continue;
    for (double v : abs_log_ratios(data, a, b, axis, common_point(a, b, axis)).values)
      floor.push_back(v);
  }
  return floor;
}

ClaimMeasurement loss_difference(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  double worst[kBases] = {0, 0, 0};
  const std::vector<Pair> pairs = pairs_of(data, rule);
  std::set<std::string> without_floor;
  std::map<std::string, std::vector<double>> floors[kBases];
  for (const Pair& p : pairs) {
    const Group& a = data.groups[p.a];
    const Group& b = data.groups[p.b];
    Evidence e;
    e.what = pair_name(data, p);
    for (int basis = 0; basis < kBases; ++basis) {
      const Axis axis = basis_axis(basis);
      const double x = common_point(a, b, axis);
      const SeedValues d = abs_log_ratios(data, a, b, axis, x);
      std::string& text = basis_text(e, basis);
      if (d.values.empty()) {
        text = "n/a";
        continue;
      }
      const double most = *std::max_element(d.values.begin(), d.values.end());
      worst[basis] = std::max(worst[basis], most);
      text = fmt::format("at {}: |log ratio| per seed up to {:.2e} over {}", format_count(x), most,
                         seeds_text(d.values));
      ClaimTest t;
      t.a = d.values;
      t.evidence = m.evidence.size();
      t.name = contrast_name(data, p);
      t.brief = contrast_brief(data, p);
      t.groups = {p.a, p.b};
      // The same losses bit for bit in every seed: no floor is needed to say nothing changed.
      t.identical = most == 0;
      if (!t.identical) {
        // One floor per model, preset, device and basis, however many pairs share it.
        const std::string where = b.model + '\n' + b.preset + '\n' + b.config.device;
        const auto [slot, fresh] = floors[basis].try_emplace(where);
        if (fresh) slot->second = noise_floor(data, b, axis);
        const std::vector<double>& floor = slot->second;
        if (floor.empty()) {
          without_floor.insert(a.model);
          text += "; no noise floor for this model: shown, does not count";
          continue;
        }
        text += fmt::format("; noise floor median {:.2e} over {} seed pair(s)", median(floor),
                            floor.size());
        t.b = floor;
        t.name += " against the noise floor";
        t.brief += " vs noise floor";
      }
      m.tests[basis].push_back(t);
    }
    m.evidence.push_back(e);
  }
  m.measured = pairs.empty() ? "no checkpointed run has a standard run to compare with"
                             : fmt::format("largest per-seed |log ratio| of the losses {:.2e} "
                                           "over {} pair(s)",
                                           worst[0], pairs.size());
  for (const std::string& model : without_floor)
    m.notes.push_back(fmt::format(
        "{} has no accumulation run at the standard runs' effective batch, so no noise floor: "
        "its pairs are shown and do not count.",
        model));
  return m;
}

ClaimMeasurement step_time_ratio(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  std::vector<double> ratios;
  // A run whose timings were disturbed is no evidence about time (groups.h).
  const auto step_s = [](const RunRecord& r) -> std::optional<double> {
    if (r.contention && r.contention->disturbed) return std::nullopt;
    return r.time ? r.time->step_median_s : std::nullopt;
  };
  size_t pairs = 0;
  for (const Pair& p : pairs_of(data, rule)) {
    ++pairs;
    const Group& a = data.groups[p.a];
    const Group& b = data.groups[p.b];
    const SeedValues ta = seed_values(data, a, step_s);
    const SeedValues tb = seed_values(data, b, step_s);
    if (ta.values.empty() || tb.values.empty()) continue;
    const double r = a.step_s.mean / b.step_s.mean;  // treatment time / baseline time
    ratios.push_back(r);
    Evidence e;
    e.what = pair_name(data, p);
    e.steps = fmt::format("step {:.4g} s vs {:.4g} s ({} vs {}): {}", a.step_s.mean, b.step_s.mean,
                          seeds_text(ta.values), seeds_text(tb.values), format_ratio(r));
    e.samples = e.evaluations = e.steps;
    ClaimTest t;
    t.a = ta.values;
    t.b = tb.values;
    t.seeds_a = ta.seeds;
    t.seeds_b = tb.seeds;
    t.evidence = m.evidence.size();
    t.name = contrast_name(data, p);
    t.brief = contrast_brief(data, p);
    t.groups = {p.a, p.b};
    m.tests[0].push_back(t);
    m.evidence.push_back(e);
  }
  if (ratios.empty()) {
    m.measured = pairs == 0 ? "no checkpointed run has a standard run to compare with"
                            : fmt::format("each of the {} pair(s) has a side with no step time "
                                          "outside runs whose timings were disturbed",
                                          pairs);
    return m;
  }
  m.same_at_every_basis();
  m.measured =
      fmt::format("step time {} to {} of standard over {} pair(s)",
                  format_ratio(*std::min_element(ratios.begin(), ratios.end())),
                  format_ratio(*std::max_element(ratios.begin(), ratios.end())), ratios.size());
  return m;
}

bool is_gpu(const std::string& device) { return device == "gpu" || device.rfind("cuda", 0) == 0; }

ClaimMeasurement median_utilization(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m;
  const std::vector<std::string> models = models_of(data, rule);
  std::vector<double> gpu_means;
  std::set<std::string> other_devices, other_sources;
  int other_runs = 0, disturbed_gpu_runs = 0;
  // A run whose timings were disturbed is no evidence about time (groups.h): its utilization
  // measured the queue as much as the work.
  const auto gpu_util = [](const RunRecord& r) -> std::optional<double> {
    if (r.contention && r.contention->disturbed) return std::nullopt;
    const auto& u = r.utilization;
    if (!u || !is_gpu(u->device)) return std::nullopt;
    return u->mean_pct;
  };
  for (const Group& g : data.groups) {
    if (std::find(models.begin(), models.end(), g.model) == models.end()) continue;
    for (size_t i : g.ok_runs) {
      const auto& u = data.runs[i].record.utilization;
      if (u && u->mean_pct && is_gpu(u->device) && data.runs[i].timing_disturbed())
        ++disturbed_gpu_runs;
      if (u && u->mean_pct && std::isfinite(*u->mean_pct) && !is_gpu(u->device)) {
        ++other_runs;
        other_devices.insert(u->device.empty() ? "an unnamed device" : u->device);
        if (!u->source.empty()) other_sources.insert(u->source);
      }
    }
    const std::vector<double> v = seed_values(data, g, gpu_util).values;
    if (v.empty()) continue;
    const Interval i = mean_interval(v);
    gpu_means.push_back(i.mean);
    Evidence e;
    e.what = fmt::format("{} {}: {}", g.model, g.preset, g.label);
    e.steps = e.samples = e.evaluations =
        fmt::format("GPU utilization {}% ({})", format_interval(i, "{:.1f}"), seeds_text(v));
    ClaimTest t;
    t.a = v;
    t.evidence = m.evidence.size();
    t.name = fmt::format("{} {}: {}", g.model, g.preset, g.label);
    t.groups = {static_cast<size_t>(&g - data.groups.data())};
    m.tests[0].push_back(t);
    m.evidence.push_back(e);
  }
  m.same_at_every_basis();
  const std::string what = models_text(data, rule);
  std::string others;
  for (const std::string& d : other_devices) others += (others.empty() ? "" : ", ") + d;
  if (gpu_means.empty()) {
    m.not_comparable = other_runs > 0;
    m.measured = other_runs > 0 ? fmt::format(
                                      "no {} run on a GPU; {} run(s) measured {} "
                                      "utilization, which is not the study's quantity",
                                      what, other_runs, others)
                                : disturbed_gpu_runs > 0
                                      ? fmt::format("the {} GPU run(s) of {} that measured "
                                                    "utilization had disturbed timings",
                                                    disturbed_gpu_runs, what)
                                      : fmt::format("no {} run measured utilization", what);
  } else {
    m.measured = fmt::format("GPU utilization: median {:.1f}% over {} configuration(s)",
                             median(gpu_means), gpu_means.size());
  }
  // A CPU's utilization is CPU time over wall time: not what the study measured.
  if (other_runs > 0)
    m.notes.push_back(fmt::format(
        "{} run(s) measured on {} ({}); the study measured GPU utilization, which means "
        "something else, so they are left out of the verdict.",
        other_runs, others, other_sources.empty() ? "unknown source" : *other_sources.begin()));
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
