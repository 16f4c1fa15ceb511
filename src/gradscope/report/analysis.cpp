#include "gradscope/report/analysis.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/store/db.h"

namespace gradscope {

using json = nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Configuration fields that do not change what is trained: runs differing only in these are
// one group (seeds) or one configuration (the rest).
const std::set<std::string> kNotTheConfiguration = {
    "seed",         "threads",         "timeout_s",      "sample_period_s",
    "phase_timing", "memory_snapshot", "watts_per_core", "grid_g_per_kwh",
    "eval_every",   "eval_batches"};

double num(const json& j, std::initializer_list<const char*> path) {
  return record_number(j, path);
}

// Top-level and arch.* / opt.* settings as "name" -> canonical value text.
std::map<std::string, std::string> flatten_config(const json& config) {
  std::map<std::string, std::string> flat;
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (kNotTheConfiguration.count(it.key())) continue;
    if (it.value().is_object()) {
      for (auto sub = it.value().begin(); sub != it.value().end(); ++sub)
        flat[it.key() + "." + sub.key()] = sub.value().dump();
    } else {
      flat[it.key()] = it.value().dump();
    }
  }
  return flat;
}

std::string unquote(const std::string& s) {
  return s.size() >= 2 && s.front() == '"' && s.back() == '"' ? s.substr(1, s.size() - 2) : s;
}

// The configuration with `erase` removed, as canonical text: runs with the same key differ
// only in what was erased.
std::string key_without(const json& config, const std::set<std::string>& erase) {
  std::string key;
  for (const auto& [name, value] : flatten_config(config)) {
    const std::string top = name.substr(0, name.find('.'));
    if (erase.count(name) || erase.count(top)) continue;
    key += name + "=" + value + ";";
  }
  return key;
}

int strategy_rank(const std::string& s) {
  if (s == "standard") return 0;
  if (s == "checkpoint") return 1;
  if (s == "accumulation") return 2;
  return 3;
}

std::vector<CurvePoint> curve_of(const json& record) {
  std::vector<CurvePoint> curve;
  const json& steps = record.value("steps", json::array());
  if (!steps.is_array()) return curve;
  double total_time = 0;
  for (const json& s : steps) {
    const double t = num(s, {"time_s"});
    if (std::isfinite(t) && t > 0) total_time += t;
  }
  const double joules = num(record, {"energy", "joules"});
  const double watts = std::isfinite(joules) && total_time > 0 ? joules / total_time : kNaN;
  CurvePoint at;
  for (const json& s : steps) {
    at.step = std::isfinite(num(s, {"step"})) ? num(s, {"step"}) : at.step + 1;
    const double samples = num(s, {"samples"}), tokens = num(s, {"tokens"}), t = num(s, {"time_s"});
    at.samples += std::isfinite(samples) ? samples : 0;
    at.tokens += std::isfinite(tokens) ? tokens : 0;
    at.time_s += std::isfinite(t) && t > 0 ? t : 0;
    at.energy_j = at.time_s * watts;
    at.loss = num(s, {"loss"});
    at.lr = num(s, {"lr"});
    at.grad_norm = num(s, {"grad_norm"});
    if (std::isfinite(at.loss)) curve.push_back(at);
  }
  return curve;
}

Interval interval_of(const ReportData& data, const Group& g, double (*value)(const ReportRun&)) {
  std::vector<double> v;
  for (size_t i : g.ok_runs) {
    const double x = value(data.runs[i]);
    if (std::isfinite(x)) v.push_back(x);
  }
  return mean_interval(v);
}

std::string describe_statuses(const ReportData& data, const Group& g) {
  std::map<std::string, int> count;
  for (size_t i : g.runs) ++count[data.runs[i].status];
  std::string text;
  for (const auto& [status, n] : count)
    text += (text.empty() ? "" : ", ") + (n > 1 ? fmt::format("{} x{}", status, n) : status);
  return text;
}

void summarize(ReportData& data, Group& g) {
  for (size_t i : g.runs)
    if (data.runs[i].status == "ok") g.ok_runs.push_back(i);
  g.statuses = describe_statuses(data, g);
  g.final_loss = interval_of(data, g, [](const ReportRun& r) {
    return r.curve.empty() ? kNaN : loss_at(r.curve, Axis::kSteps, r.curve.back().step).value();
  });
  g.val_loss =
      interval_of(data, g, [](const ReportRun& r) { return num(r.record, {"final_val_loss"}); });
  g.step_s = interval_of(data, g, [](const ReportRun& r) {
    return num(r.record, {"time", "step_median_s"});
  });
  g.peak_bytes = interval_of(data, g, [](const ReportRun& r) {
    return num(r.record, {"memory", "peak_bytes"});
  });
  g.energy_j = interval_of(data, g, [](const ReportRun& r) {
    return num(r.record, {"energy", "joules"});
  });
  g.util_pct = interval_of(data, g, [](const ReportRun& r) {
    return num(r.record, {"utilization", "mean_pct"});
  });
  for (const char* part : {"params", "grads", "optimizer_state", "activations", "other"}) {
    std::vector<double> v;
    for (size_t i : g.ok_runs) {
      const double x = num(data.runs[i].record, {"memory", "breakdown", part});
      if (std::isfinite(x)) v.push_back(x);
    }
    if (!v.empty()) g.memory[part] = mean_interval(v);
  }
  for (const char* phase : {"data", "forward", "backward", "optimizer"}) {
    std::vector<double> v;
    for (size_t i : g.ok_runs) {
      const json& r = data.runs[i].record;
      const double s = num(r, {"time", (std::string(phase) + "_s").c_str()});
      const double n = num(r, {"time", "timed_steps"});
      if (std::isfinite(s) && n > 0) v.push_back(s / n);
    }
    if (!v.empty()) g.phase_s[phase] = mean_interval(v);
  }
  g.samples_total = kNaN;
  g.steps_total = kNaN;
  for (size_t i : g.ok_runs) {
    const auto& c = data.runs[i].curve;
    if (c.empty()) continue;
    g.samples_total = std::isfinite(g.samples_total) ? std::min(g.samples_total, c.back().samples)
                                                     : c.back().samples;
    g.steps_total =
        std::isfinite(g.steps_total) ? std::min(g.steps_total, c.back().step) : c.back().step;
  }
}

// Labels: optimizer and strategy, plus each setting in which the group differs from another
// group of the same model, optimizer and strategy (the preset first; the preset's own
// settings only where they differ within one preset).
void label_groups(ReportData& data) {
  for (const std::string& model : data.models) {
    std::vector<Group*> mine;
    for (Group& g : data.groups)
      if (g.model == model) mine.push_back(&g);
    std::vector<std::set<std::string>> differing(mine.size());
    for (size_t a = 0; a < mine.size(); ++a) {
      const auto fa = flatten_config(mine[a]->config);
      for (size_t b = a + 1; b < mine.size(); ++b) {
        if (mine[a]->optimizer != mine[b]->optimizer || mine[a]->strategy != mine[b]->strategy)
          continue;
        const auto fb = flatten_config(mine[b]->config);
        const bool same_preset = mine[a]->preset == mine[b]->preset;
        std::set<std::string> names;
        for (const auto& [k, v] : fa) names.insert(k);
        for (const auto& [k, v] : fb) names.insert(k);
        for (const std::string& k : names) {
          if (k == "optimizer" || k == "strategy" || k == "model") continue;
          const bool preset_bound = k.rfind("arch.", 0) == 0 || k == "seq_len" || k == "tokenizer";
          if (preset_bound && !same_preset) continue;
          auto ia = fa.find(k), ib = fb.find(k);
          const std::string va = ia == fa.end() ? "" : ia->second;
          const std::string vb = ib == fb.end() ? "" : ib->second;
          if (va != vb) {
            differing[a].insert(k);
            differing[b].insert(k);
          }
        }
      }
    }
    for (size_t i = 0; i < mine.size(); ++i) {
      Group* g = mine[i];
      const auto flat = flatten_config(g->config);
      g->label = g->optimizer + ", " + g->strategy;
      if (g->strategy == "accumulation")
        g->label += fmt::format(" k={}", g->config.value("accum_steps", 1));
      if (differing[i].count("preset")) g->label += " " + g->preset;
      for (const std::string& k : differing[i]) {
        if (k == "preset" || (k == "accum_steps" && g->strategy == "accumulation")) continue;
        auto it = flat.find(k);
        g->label += fmt::format(" {}={}", k, it == flat.end() ? "-" : unquote(it->second));
      }
    }
  }
}

// ---- findings ----

struct Pair {
  size_t a, b;  // groups: the treatment and the baseline
};

// Groups of `model` with strategy `treatment` matched to those with strategy "standard" whose
// configuration is the same apart from the strategy's own settings. Accumulation (k micro-
// batches of b) is matched both ways it is run: against standard at the same micro-batch b
// (the same memory, k times the samples per step) and at the same effective batch k x b.
std::vector<Pair> strategy_pairs(const ReportData& data, const std::string& model,
                                 const std::string& treatment) {
  const std::set<std::string> erase = {"strategy", "accum_steps", "checkpoint_every",
                                       "checkpoint_policy", "batch"};
  std::vector<Pair> pairs;
  for (size_t a = 0; a < data.groups.size(); ++a) {
    const Group& ga = data.groups[a];
    if (ga.model != model || ga.strategy != treatment || ga.ok_runs.empty()) continue;
    const std::string key = key_without(ga.config, erase);
    const int64_t batch = ga.config.value("batch", int64_t{0});
    const int64_t k = ga.config.value("accum_steps", int64_t{1});
    for (size_t b = 0; b < data.groups.size(); ++b) {
      const Group& gb = data.groups[b];
      if (gb.model != model || gb.strategy != "standard" || gb.ok_runs.empty()) continue;
      if (gb.config.value("accum_steps", int64_t{1}) != 1) continue;
      const int64_t other = gb.config.value("batch", int64_t{0});
      const bool same_batch = other == batch || (treatment == "accumulation" && other == k * batch);
      if (same_batch && key_without(gb.config, erase) == key) pairs.push_back({a, b});
    }
  }
  return pairs;
}

std::string pair_name(const ReportData& data, const Pair& p) {
  const Group& a = data.groups[p.a];
  const Group& b = data.groups[p.b];
  std::string text = fmt::format("{} {}: {} vs {}", a.model, a.preset, a.label, b.label);
  const int64_t k = a.config.value("accum_steps", int64_t{1});
  if (k > 1)
    text += a.config.value("batch", int64_t{0}) == b.config.value("batch", int64_t{0})
                ? fmt::format(" (same micro-batch {})", b.config.value("batch", int64_t{0}))
                : fmt::format(" (same effective batch {})", b.config.value("batch", int64_t{0}));
  return text;
}

// The common point of two groups on an axis: the smaller of their totals.
double common_point(const Group& a, const Group& b, Axis axis) {
  return axis == Axis::kSteps ? std::min(a.steps_total, b.steps_total)
                              : std::min(a.samples_total, b.samples_total);
}

std::string samples_text(double x) { return fmt::format("{:.0f}", x); }

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Ratio baseline / treatment of two loss intervals, with the range the intervals allow.
struct Ratio {
  double value = kNaN, lo = kNaN, hi = kNaN;
};
Ratio loss_ratio(const Interval& baseline, const Interval& treatment) {
  Ratio r;
  if (baseline.n == 0 || treatment.n == 0 || treatment.mean <= 0) return r;
  r.value = baseline.mean / treatment.mean;
  r.lo = treatment.hi() > 0 ? baseline.lo() / treatment.hi() : r.value;
  r.hi =
      treatment.lo() > 0 ? baseline.hi() / treatment.lo() : std::numeric_limits<double>::infinity();
  return r;
}

// "The study's claim: accumulation lowers loss ~factor x with no extra memory."
Finding accumulation_finding(const ReportData& data, const std::string& id,
                             const std::string& model, const std::string& what, double factor) {
  Finding f;
  f.id = id;
  f.claim = fmt::format(
      "Gradient accumulation lowers the {}'s training loss about {:g}x, with no extra memory.",
      what, factor);
  f.rule = fmt::format(
      "{} runs with accumulation against standard runs of the same settings, at the same "
      "micro-batch (the study's setup) and at the same effective batch: reproduced when the median "
      "loss ratio (standard / accumulation) is at least {:g} (half "
      "the claimed factor) and no accumulation run needs more than 1.10x the standard run's "
      "peak memory.",
      model, factor / 2);
  auto pairs = strategy_pairs(data, model, "accumulation");
  // The study's setup (same micro-batch) decides where the data has it.
  const auto same_micro = [&](const Pair& p) {
    return data.groups[p.a].config.value("batch", int64_t{0}) ==
           data.groups[p.b].config.value("batch", int64_t{0});
  };
  const bool have_micro = std::any_of(pairs.begin(), pairs.end(), same_micro);
  std::vector<double> by_steps, by_samples;
  double memory_worst = 0;
  bool straddles_steps = false, straddles_samples = false;
  for (const Pair& p : pairs) {
    const Group& a = data.groups[p.a];
    const Group& b = data.groups[p.b];
    Evidence e;
    e.what = pair_name(data, p);
    const double mem = a.peak_bytes.mean / b.peak_bytes.mean;
    const bool decides = !have_micro || same_micro(p);
    if (decides) memory_worst = std::max(memory_worst, mem);
    for (Axis axis : {Axis::kSteps, Axis::kSamples}) {
      const double x = common_point(a, b, axis);
      const Interval la = group_loss_at(data, a, axis, x), lb = group_loss_at(data, b, axis, x);
      const Ratio r = loss_ratio(lb, la);
      std::string text = "n/a";
      if (std::isfinite(r.value)) {
        const bool straddle =
            r.lo <= factor / 2 && factor / 2 <= r.hi && (la.has_interval() || lb.has_interval());
        text = fmt::format("at {} {}: loss {} vs {}, {} lower; peak memory {}", samples_text(x),
                           axis == Axis::kSteps ? "steps" : "samples", format_interval(la),
                           format_interval(lb), format_ratio(r.value), format_ratio(mem));
        if (!decides) {
        } else if (axis == Axis::kSteps) {
          by_steps.push_back(r.value);
          straddles_steps = straddles_steps || straddle;
        } else {
          by_samples.push_back(r.value);
          straddles_samples = straddles_samples || straddle;
        }
      }
      (axis == Axis::kSteps ? e.steps : e.samples) = text;
    }
    f.evidence.push_back(e);
  }
  auto decide = [&](const std::vector<double>& ratios, bool straddles) {
    if (ratios.empty()) return Verdict::kNotEnoughData;
    if (straddles) return Verdict::kNotEnoughData;
    return median(ratios) >= factor / 2 && memory_worst <= 1.10 ? Verdict::kReproduced
                                                                : Verdict::kNotReproduced;
  };
  f.verdict = decide(by_steps, straddles_steps);
  f.verdict_equal_samples = decide(by_samples, straddles_samples);
  if (pairs.empty()) {
    f.measured =
        fmt::format("no {} run with accumulation has a standard run to compare with", model);
  } else {
    f.measured = fmt::format(
        "loss ratio (median over {} pair(s) at the same {}) {} at equal steps, {} at equal "
        "samples; peak memory up to {}",
        by_steps.size(), have_micro ? "micro-batch" : "effective batch",
        format_ratio(median(by_steps)), format_ratio(median(by_samples)),
        format_ratio(memory_worst));
    f.notes.push_back(
        have_micro ? "At the same micro-batch, accumulation has seen k times the samples of the "
                     "standard run at equal steps; at equal samples both have seen the same data."
                   : "At the same effective batch, accumulation computes the same gradient as the "
                     "standard run (gradscope verify proves it), so the same loss is what the math "
                     "says; the study's setup keeps the micro-batch instead.");
  }
  if (straddles_steps || straddles_samples)
    f.notes.push_back(
        "The verdict turns on a difference smaller than its 95% interval: more seeds are needed.");
  return f;
}

Finding adam_finding(const ReportData& data) {
  Finding f;
  f.id = "adam-not-best";
  f.claim = "Adam is not the best optimizer everywhere.";
  f.rule =
      "In each cell (model, strategy and settings other than the optimizer's) with Adam and at "
      "least one other optimizer, the lowest loss at equal steps (and at equal samples) wins: "
      "reproduced when another optimizer beats Adam in at least one cell by more than their "
      "95% intervals; not reproduced when Adam wins every cell.";
  const std::set<std::string> erase = {"optimizer", "opt", "lr", "lr_auto", "weight_decay"};
  std::map<std::string, std::vector<size_t>> cells;
  for (size_t i = 0; i < data.groups.size(); ++i)
    if (!data.groups[i].ok_runs.empty())
      cells[key_without(data.groups[i].config, erase)].push_back(i);
  int adam_cells = 0, beaten[2] = {0, 0}, noisy[2] = {0, 0};
  for (const auto& [key, members] : cells) {
    auto adam = std::find_if(members.begin(), members.end(),
                             [&](size_t i) { return data.groups[i].optimizer == "adam"; });
    if (adam == members.end() || members.size() < 2) continue;
    ++adam_cells;
    Evidence e;
    const Group& ga = data.groups[*adam];
    e.what = fmt::format("{} {}, {}", ga.model, ga.preset, ga.strategy);
    int axis_index = 0;
    for (Axis axis : {Axis::kSteps, Axis::kSamples}) {
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
        ++(clear ? beaten[axis_index] : noisy[axis_index]);
        text = fmt::format("{} {} < Adam {}{}", data.groups[best].label, format_interval(best_loss),
                           format_interval(adam_loss), clear ? "" : " (within the 95% intervals)");
      }
      (axis == Axis::kSteps ? e.steps : e.samples) =
          fmt::format("at {}: {}", samples_text(x), text);
      ++axis_index;
    }
    f.evidence.push_back(e);
  }
  auto decide = [&](int i) {
    if (adam_cells == 0) return Verdict::kNotEnoughData;
    if (beaten[i] > 0) return Verdict::kReproduced;
    if (noisy[i] > 0) return Verdict::kNotEnoughData;
    return Verdict::kNotReproduced;
  };
  f.verdict = decide(0);
  f.verdict_equal_samples = decide(1);
  f.measured = adam_cells == 0
                   ? "no configuration ran Adam beside another optimizer"
                   : fmt::format(
                         "another optimizer beats Adam in {} of {} cell(s) at equal steps, "
                         "{} at equal samples",
                         beaten[0], adam_cells, beaten[1]);
  if (noisy[0] + noisy[1] > 0)
    f.notes.push_back(fmt::format(
        "{} comparison(s) where another optimizer is ahead of Adam by less than the 95% "
        "intervals: too close to call.",
        noisy[0] + noisy[1]));
  return f;
}

Finding checkpoint_loss_finding(const ReportData& data) {
  Finding f;
  f.id = "checkpoint-loss";
  f.claim = "Gradient checkpointing changes the training loss.";
  f.rule =
      "Checkpointed runs against standard runs of the same settings, seed by seed where both "
      "ran the same seeds: reproduced when the loss differs by more than 0.1% (relative) in "
      "any pair; recomputing activations gives the same gradients, so only floating-point "
      "reordering should show.";
  std::vector<double> worst(2, 0.0);
  size_t compared = 0;
  for (const std::string& model : data.models) {
    for (const Pair& p : strategy_pairs(data, model, "checkpoint")) {
      const Group& a = data.groups[p.a];
      const Group& b = data.groups[p.b];
      Evidence e;
      e.what = pair_name(data, p);
      int axis_index = 0;
      for (Axis axis : {Axis::kSteps, Axis::kSamples}) {
        const double x = common_point(a, b, axis);
        double diff = 0;
        int matched = 0;
        for (size_t ia : a.ok_runs)
          for (size_t ib : b.ok_runs) {
            if (data.runs[ia].seed != data.runs[ib].seed) continue;
            const auto la = loss_at(data.runs[ia].curve, axis, x);
            const auto lb = loss_at(data.runs[ib].curve, axis, x);
            if (!la || !lb || *lb == 0) continue;
            diff = std::max(diff, std::abs(*la - *lb) / std::abs(*lb));
            ++matched;
          }
        if (matched == 0) {
          const Interval la = group_loss_at(data, a, axis, x), lb = group_loss_at(data, b, axis, x);
          if (la.n > 0 && lb.n > 0 && lb.mean != 0) {
            diff = std::abs(la.mean - lb.mean) / std::abs(lb.mean);
            matched = 1;
          }
        }
        std::string text = "n/a";
        if (matched > 0) {
          worst[axis_index] = std::max(worst[axis_index], diff);
          text =
              fmt::format("at {}: largest relative loss difference {:.2e}", samples_text(x), diff);
        }
        (axis == Axis::kSteps ? e.steps : e.samples) = text;
        ++axis_index;
      }
      ++compared;
      f.evidence.push_back(e);
    }
  }
  auto decide = [&](int i) {
    if (compared == 0) return Verdict::kNotEnoughData;
    return worst[i] > 1e-3 ? Verdict::kReproduced : Verdict::kNotReproduced;
  };
  f.verdict = decide(0);
  f.verdict_equal_samples = decide(1);
  f.measured = compared == 0
                   ? "no checkpointed run has a standard run to compare with"
                   : fmt::format("largest relative loss difference {:.2e} over {} pair(s)",
                                 worst[0], compared);
  return f;
}

Finding checkpoint_time_finding(const ReportData& data) {
  Finding f;
  f.id = "checkpoint-time";
  f.claim = "Gradient checkpointing adds up to 60% training time.";
  f.rule =
      "Median step time of checkpointed runs against standard runs of the same settings: "
      "reproduced when every pair's overhead is at most 75% (the claim plus a quarter of it) "
      "and the largest is at least 15% (a quarter of it).";
  double worst = -1;
  bool straddles = false;
  std::vector<double> ratios;
  for (const std::string& model : data.models) {
    for (const Pair& p : strategy_pairs(data, model, "checkpoint")) {
      const Group& a = data.groups[p.a];
      const Group& b = data.groups[p.b];
      if (a.step_s.n == 0 || b.step_s.n == 0) continue;
      const Ratio r = loss_ratio(a.step_s, b.step_s);  // treatment time / baseline time
      ratios.push_back(r.value);
      worst = std::max(worst, r.value);
      if ((a.step_s.has_interval() || b.step_s.has_interval()) && r.lo <= 1.75 && 1.75 <= r.hi)
        straddles = true;
      Evidence e;
      e.what = pair_name(data, p);
      e.steps = fmt::format("step {:.4g} s vs {:.4g} s: {}", a.step_s.mean, b.step_s.mean,
                            format_ratio(r.value));
      e.samples = e.steps;
      f.evidence.push_back(e);
    }
  }
  if (ratios.empty()) {
    f.verdict = Verdict::kNotEnoughData;
    f.measured = "no checkpointed run has a standard run to compare with";
  } else {
    f.verdict = straddles                        ? Verdict::kNotEnoughData
                : worst <= 1.75 && worst >= 1.15 ? Verdict::kReproduced
                                                 : Verdict::kNotReproduced;
    f.measured = fmt::format("step time {} to {} of standard over {} pair(s)",
                             format_ratio(*std::min_element(ratios.begin(), ratios.end())),
                             format_ratio(worst), ratios.size());
    if (straddles)
      f.notes.push_back(
          "The verdict turns on a difference smaller than its 95% interval: more seeds are "
          "needed.");
  }
  f.verdict_equal_samples = f.verdict;
  return f;
}

Finding utilization_finding(const ReportData& data, const std::string& id, const std::string& model,
                            const std::string& what, double lo, double hi) {
  Finding f;
  f.id = id;
  f.claim = fmt::format("Device utilization is {:g}-{:g}% when training the {}.", lo, hi, what);
  f.rule = fmt::format(
      "The median of the {} runs' mean utilization: reproduced when within the claimed range "
      "widened by 5 points ({:g}-{:g}%).",
      model, lo - 5, hi + 5);
  std::vector<double> values;
  std::set<std::string> devices, sources;
  for (const ReportRun& r : data.runs) {
    if (r.status != "ok" || r.record["config"].value("model", "") != model) continue;
    const double u = num(r.record, {"utilization", "mean_pct"});
    if (!std::isfinite(u)) continue;
    values.push_back(u);
    const json& util = r.record.value("utilization", json::object());
    if (util.value("device", json()).is_string()) devices.insert(util["device"].get<std::string>());
    if (util.value("source", json()).is_string()) sources.insert(util["source"].get<std::string>());
  }
  if (values.empty()) {
    f.verdict = Verdict::kNotEnoughData;
    f.measured = fmt::format("no {} run measured utilization", model);
  } else {
    const double m = median(values);
    f.verdict = m >= lo - 5 && m <= hi + 5 ? Verdict::kReproduced : Verdict::kNotReproduced;
    f.measured = fmt::format("median {:.1f}% (range {:.1f}-{:.1f}%) over {} run(s)", m,
                             *std::min_element(values.begin(), values.end()),
                             *std::max_element(values.begin(), values.end()), values.size());
    Evidence e;
    e.what = model;
    e.steps = e.samples = f.measured;
    f.evidence.push_back(e);
    for (const std::string& d : devices)
      if (d.rfind("cuda", 0) != 0)
        f.notes.push_back(fmt::format(
            "Measured on {} ({}); the study measured GPU utilization, which means something "
            "else: compare GPU runs for this claim.",
            d, sources.empty() ? "unknown source" : *sources.begin()));
  }
  f.verdict_equal_samples = f.verdict;
  return f;
}

// ---- recommendations ----

std::vector<Recommendation> recommend(const ReportData& data, const ReportOptions& options) {
  std::vector<Recommendation> out;
  for (const std::string& model : data.models) {
    std::vector<size_t> mine;
    for (size_t i = 0; i < data.groups.size(); ++i)
      if (data.groups[i].model == model) mine.push_back(i);
    // Budgets: the caps runs ran under, those given, else the data's own range of peaks.
    std::map<double, std::string> budgets;
    for (size_t i : mine)
      for (size_t r : data.groups[i].runs) {
        const double cap = num(data.runs[r].record, {"config", "memory_cap_bytes"});
        if (cap > 0) budgets.emplace(cap, "a memory cap in the data");
      }
    for (int64_t b : options.memory_budgets) budgets[static_cast<double>(b)] = "--memory-budget";
    std::vector<double> peaks;
    for (size_t i : mine)
      if (data.groups[i].peak_bytes.n > 0) peaks.push_back(data.groups[i].peak_bytes.mean);
    if (budgets.empty() && !peaks.empty()) {
      std::sort(peaks.begin(), peaks.end());
      budgets.emplace(peaks.front(), "the leanest run's peak");
      budgets.emplace(peaks[peaks.size() / 2], "the median run's peak");
      budgets.emplace(0.0, "no limit");
    }
    // Equal samples: the fewest any ok group of the model reached.
    double equal = std::numeric_limits<double>::infinity();
    for (size_t i : mine)
      if (std::isfinite(data.groups[i].samples_total))
        equal = std::min(equal, data.groups[i].samples_total);
    for (const auto& [budget, source] : budgets) {
      Recommendation rec;
      rec.model = model;
      rec.budget_bytes = budget;
      rec.budget_source = source;
      rec.equal_samples = std::isfinite(equal) ? equal : 0;
      for (size_t i : mine) {
        const Group& g = data.groups[i];
        std::string reason;
        // A run that ran out of memory under a cap within this budget does not fit.
        for (size_t r : g.runs) {
          const double cap = num(data.runs[r].record, {"config", "memory_cap_bytes"});
          if (data.runs[r].status == "oom" && (budget == 0 || (cap > 0 && cap <= budget)))
            reason = cap > 0 ? fmt::format("ran out of memory under a {} cap", format_bytes(cap))
                             : "ran out of memory";
        }
        if (reason.empty() && g.ok_runs.empty()) reason = "no successful run (" + g.statuses + ")";
        if (reason.empty() && budget > 0 && g.peak_bytes.n > 0 && g.peak_bytes.mean > budget)
          reason = fmt::format("peak {}", format_bytes(g.peak_bytes.mean));
        if (reason.empty() && budget > 0 && g.peak_bytes.n == 0) reason = "peak not measured";
        if (!reason.empty()) {
          rec.misses.push_back(i);
          rec.miss_reasons.push_back(reason);
          continue;
        }
        rec.fits.push_back(i);
        // The lowest loss; between losses equal to 0.01% (checkpointing, and accumulation at
        // the same effective batch, change only the rounding), the faster step.
        const Interval l = group_loss_at(data, g, Axis::kSamples, equal);
        const bool tie = rec.best && std::abs(l.mean - rec.best_loss.mean) <=
                                         1e-4 * std::abs(rec.best_loss.mean);
        const bool better =
            l.n > 0 && (!rec.best || (!tie && l.mean < rec.best_loss.mean) ||
                        (tie && g.step_s.mean < data.groups[*rec.best].step_s.mean));
        if (better) {
          rec.best = i;
          rec.best_loss = l;
        }
      }
      if (rec.best) {
        std::vector<double> t, e;
        for (size_t r : data.groups[*rec.best].ok_runs) {
          for (const CurvePoint& p : data.runs[r].curve)
            if (p.samples >= equal) {
              t.push_back(p.time_s);
              if (std::isfinite(p.energy_j)) e.push_back(p.energy_j);
              break;
            }
        }
        rec.time_to_samples_s = t.empty() ? kNaN : mean_interval(t).mean;
        rec.energy_known = !e.empty() && e.size() == t.size();
        rec.energy_to_samples_j = rec.energy_known ? mean_interval(e).mean : kNaN;
      }
      out.push_back(rec);
    }
  }
  return out;
}

// The regularized incomplete beta function I_x(a, b), by its continued fraction.
double incomplete_beta(double x, double a, double b) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(1 - x, b, a);
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                                a * std::log(x) + b * std::log1p(-x)) /
                       a;
  const double tiny = 1e-300;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  d = 1 / (std::abs(d) < tiny ? tiny : d);
  double f = d;
  for (int m = 1; m <= 300; ++m) {
    for (int odd = 0; odd < 2; ++odd) {
      const double num = odd == 0 ? m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
                                  : -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
      d = 1 + num * d;
      d = 1 / (std::abs(d) < tiny ? tiny : d);
      c = 1 + num / c;
      c = std::abs(c) < tiny ? tiny : c;
      f *= c * d;
    }
    if (std::abs(c * d - 1) < 1e-15) break;
  }
  return front * f;
}

}  // namespace

double record_number(const json& j, std::initializer_list<const char*> path) {
  const json* at = &j;
  for (const char* key : path) {
    if (!at->is_object() || !at->contains(key)) return kNaN;
    at = &(*at)[key];
  }
  return at->is_number() ? at->get<double>() : kNaN;
}

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::kSteps:
      return "steps";
    case Axis::kSamples:
      return "samples";
    case Axis::kTime:
      return "time";
    case Axis::kEnergy:
      return "energy";
  }
  return "?";
}

const char* axis_label(Axis a) {
  switch (a) {
    case Axis::kSteps:
      return "optimizer steps";
    case Axis::kSamples:
      return "samples";
    case Axis::kTime:
      return "training time (s)";
    case Axis::kEnergy:
      return "energy (J)";
  }
  return "?";
}

double CurvePoint::at(Axis a) const {
  switch (a) {
    case Axis::kSteps:
      return step;
    case Axis::kSamples:
      return samples;
    case Axis::kTime:
      return time_s;
    case Axis::kEnergy:
      return energy_j;
  }
  return kNaN;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kReproduced:
      return "reproduced";
    case Verdict::kNotReproduced:
      return "not reproduced";
    case Verdict::kNotEnoughData:
      return "not enough data";
  }
  return "?";
}

double student_t_quantile(double p, double df) {
  check_usage(p > 0 && p < 1 && df > 0, "student_t_quantile: p must be in (0, 1), df positive");
  if (p < 0.5) return -student_t_quantile(1 - p, df);
  auto cdf = [df](double t) { return 1 - 0.5 * incomplete_beta(df / (df + t * t), df / 2, 0.5); };
  double lo = 0, hi = 1;
  while (cdf(hi) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (cdf(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

Interval mean_interval(const std::vector<double>& values) {
  Interval i;
  i.n = static_cast<int>(values.size());
  if (i.n == 0) {
    i.mean = kNaN;
    return i;
  }
  double sum = 0;
  for (double v : values) sum += v;
  i.mean = sum / i.n;
  if (i.n < 2) {
    i.half_width = kNaN;
    return i;
  }
  double ss = 0;
  for (double v : values) ss += (v - i.mean) * (v - i.mean);
  const double sd = std::sqrt(ss / (i.n - 1));
  i.half_width = student_t_quantile(0.975, i.n - 1) * sd / std::sqrt(static_cast<double>(i.n));
  return i;
}

std::optional<double> loss_at(const std::vector<CurvePoint>& curve, Axis axis, double x) {
  size_t end = 0;  // one past the last point at or before x
  while (end < curve.size() && curve[end].at(axis) <= x * (1 + 1e-12)) ++end;
  if (end == 0 || !std::isfinite(curve[end - 1].at(axis))) return std::nullopt;
  const size_t window = std::max<size_t>(1, end / 10);
  double sum = 0;
  for (size_t i = end - window; i < end; ++i) sum += curve[i].loss;
  return sum / static_cast<double>(window);
}

Interval group_loss_at(const ReportData& data, const Group& g, Axis axis, double x) {
  std::vector<double> v;
  for (size_t i : g.ok_runs)
    if (auto l = loss_at(data.runs[i].curve, axis, x)) v.push_back(*l);
  return mean_interval(v);
}

std::string format_ratio(double r) {
  if (!std::isfinite(r)) return "n/a";
  return r >= 100  ? fmt::format("{:.0f}x", r)
         : r >= 10 ? fmt::format("{:.1f}x", r)
                   : fmt::format("{:.2f}x", r);
}

std::string format_interval(const Interval& i, const char* spec) {
  if (i.n == 0 || !std::isfinite(i.mean)) return "n/a";
  std::string text = fmt::format(fmt::runtime(spec), i.mean);
  if (i.has_interval()) text += " ± " + fmt::format(fmt::runtime(spec), i.half_width);
  return text;
}

ReportData analyze_records(const std::vector<json>& records, const ReportOptions& options) {
  ReportData data;
  data.attempts = static_cast<int64_t>(records.size());
  std::map<std::string, size_t> latest;
  for (const json& r : records) {
    if (!r.is_object() || !r.value("config", json()).is_object()) continue;
    ReportRun run;
    run.run_id = r.value("run_id", "");
    run.sweep = r.value("sweep", json()).is_string() ? r["sweep"].get<std::string>() : "";
    run.status = r.value("status", "unknown");
    run.record = r;
    run.curve = curve_of(r);
    run.seed = r["config"].value("seed", int64_t{0});
    auto it = latest.find(run.run_id);
    if (it == latest.end()) {
      latest[run.run_id] = data.runs.size();
      data.runs.push_back(std::move(run));
    } else {
      data.runs[it->second] = std::move(run);
    }
  }
  check_usage(!data.runs.empty(), "the database holds no runs",
              "run `gradscope run` or `gradscope sweep` with --db pointing at it first");
  std::map<std::string, size_t> by_key;
  for (size_t i = 0; i < data.runs.size(); ++i) {
    const json& config = data.runs[i].record["config"];
    const std::string key = key_without(config, {});
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      Group g;
      g.key = key;
      g.config = config;
      g.model = config.value("model", "?");
      g.preset = config.value("preset", "?");
      g.optimizer = config.value("optimizer", "?");
      g.strategy = config.value("strategy", "?");
      by_key[key] = data.groups.size();
      data.groups.push_back(g);
      it = by_key.find(key);
    }
    data.groups[it->second].runs.push_back(i);
  }
  std::set<std::string> models;
  for (Group& g : data.groups) {
    std::sort(g.runs.begin(), g.runs.end(), [&](size_t a, size_t b) {
      return std::make_pair(data.runs[a].seed, data.runs[a].run_id) <
             std::make_pair(data.runs[b].seed, data.runs[b].run_id);
    });
    summarize(data, g);
    models.insert(g.model);
  }
  data.models.assign(models.begin(), models.end());
  label_groups(data);
  std::sort(data.groups.begin(), data.groups.end(), [](const Group& a, const Group& b) {
    return std::make_tuple(a.model, a.preset, strategy_rank(a.strategy), a.strategy, a.optimizer,
                           a.label, a.key) < std::make_tuple(b.model, b.preset,
                                                             strategy_rank(b.strategy), b.strategy,
                                                             b.optimizer, b.label, b.key);
  });
  data.findings.push_back(accumulation_finding(data, "accumulation-vlm", "nanovlm", "VLM", 10));
  data.findings.push_back(accumulation_finding(data, "accumulation-lm", "llama", "LM", 4));
  data.findings.push_back(adam_finding(data));
  data.findings.push_back(checkpoint_loss_finding(data));
  data.findings.push_back(checkpoint_time_finding(data));
  data.findings.push_back(utilization_finding(data, "utilization-lm", "llama", "LM", 8, 15));
  data.findings.push_back(
      utilization_finding(data, "utilization-vision", "vit", "vision model", 96, 99));
  data.recommendations = recommend(data, options);
  return data;
}

ReportData analyze(Database& db, const ReportOptions& options) {
  ReportData data = analyze_records(db.records(), options);
  data.db_path = db.path();
  return data;
}

}  // namespace gradscope
