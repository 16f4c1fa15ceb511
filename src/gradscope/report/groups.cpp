#include "gradscope/report/groups.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <tuple>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"
#include "gradscope/core/statistics.h"

namespace gradscope {
namespace {

double or_nan(const std::optional<double>& v) { return v ? *v : kNaN; }

// The study's strategies first, in the order it discusses them.
int strategy_rank(const std::string& s) {
  if (s == "standard") return 0;
  if (s == "checkpoint") return 1;
  if (s == "accumulation") return 2;
  return 3;
}

std::vector<CurvePoint> curve_of(const RunRecord& record) {
  std::vector<CurvePoint> curve;
  auto seconds = [](const StepEntry& s) {
    return std::isfinite(s.time_s) && s.time_s > 0 ? s.time_s : 0.0;
  };
  // Steps measured their own energy (the timed ones); the run's mean power over them charges
  // the steps that did not (warm-up). Records without per-step energy spread the run's joules
  // over its timed steps by their time, and charge warm-up steps at the same power.
  double metered_j = 0, metered_s = 0, timed_s = 0;
  for (const StepEntry& s : record.steps) {
    if (s.energy_j && std::isfinite(*s.energy_j)) {
      metered_j += *s.energy_j;
      metered_s += seconds(s);
    }
    if (!s.warmup) timed_s += seconds(s);
  }
  const double joules = record.energy ? or_nan(record.energy->joules) : kNaN;
  const double watts = metered_s > 0                          ? metered_j / metered_s
                       : std::isfinite(joules) && timed_s > 0 ? joules / timed_s
                                                              : kNaN;
  const double flops_per_evaluation =
      record.flops && record.flops->hardware_per_step > 0 ? record.flops->hardware_per_step : kNaN;
  CurvePoint at;
  for (const StepEntry& s : record.steps) {
    at.step = static_cast<double>(s.step);
    at.samples += static_cast<double>(s.samples);
    const double passes = static_cast<double>(std::max<int64_t>(1, s.evaluations));
    at.evaluations += passes * static_cast<double>(s.samples);
    at.flops += passes * flops_per_evaluation;
    at.tokens += static_cast<double>(s.tokens);
    at.time_s += seconds(s);
    at.energy_j += s.energy_j && std::isfinite(*s.energy_j) && metered_s > 0 ? *s.energy_j
                                                                             : seconds(s) * watts;
    at.loss = or_nan(s.loss);
    at.lr = s.lr;
    at.grad_norm = or_nan(s.grad_norm);
    if (std::isfinite(at.loss)) curve.push_back(at);
  }
  return curve;
}

// The evaluations at the positions of the steps they followed. An evaluation after the last
// step (final_val_loss) is the last entry of evals.
std::vector<ValPoint> val_of(const RunRecord& record, const std::vector<CurvePoint>& curve) {
  std::vector<ValPoint> val;
  for (const EvalEntry& e : record.evals) {
    if (!e.val_loss || !std::isfinite(*e.val_loss)) continue;
    const auto it = std::find_if(curve.begin(), curve.end(), [&](const CurvePoint& p) {
      return p.step == static_cast<double>(e.step);
    });
    if (it != curve.end()) val.push_back({*it, *e.val_loss});
  }
  return val;
}

// The interval of one figure over a group's ok runs that have it.
Interval interval_of(const GroupedRuns& data, const Group& g,
                     const std::function<std::optional<double>(const ReportRun&)>& value) {
  std::vector<double> v;
  for (size_t i : g.ok_runs) {
    const std::optional<double> x = value(data.runs[i]);
    if (x && std::isfinite(*x)) v.push_back(*x);
  }
  return mean_interval(v);
}

// The same over the ok runs whose timings were not disturbed: for figures of time.
Interval timed_interval_of(const GroupedRuns& data, const Group& g,
                           const std::function<std::optional<double>(const ReportRun&)>& value) {
  std::vector<double> v;
  for (size_t i : g.ok_runs) {
    if (data.runs[i].timing_disturbed()) continue;
    const std::optional<double> x = value(data.runs[i]);
    if (x && std::isfinite(*x)) v.push_back(*x);
  }
  return mean_interval(v);
}

std::string describe_statuses(const GroupedRuns& data, const Group& g) {
  std::map<std::string, int> count;
  for (size_t i : g.runs) ++count[status_name(data.runs[i].record.status)];
  std::string text;
  for (const auto& [status, n] : count)
    text += (text.empty() ? "" : ", ") + (n > 1 ? fmt::format("{} x{}", status, n) : status);
  return text;
}

std::optional<double> as_double(const std::optional<int64_t>& v) {
  return v ? std::optional<double>(static_cast<double>(*v)) : std::nullopt;
}

std::optional<double> phase_seconds(const RunTime& t, const std::string& phase) {
  if (phase == "data") return t.data_s;
  if (phase == "forward") return t.forward_s;
  if (phase == "backward") return t.backward_s;
  if (phase == "communication") return t.comm_s;
  return t.optimizer_s;
}

// A rank's figures in a run, by its rank number; nullptr when the run has none for it.
const RankFigures* rank_of(const RunRecord& r, int64_t rank) {
  if (!r.distributed) return nullptr;
  for (const RankFigures& f : r.distributed->ranks)
    if (f.rank == rank) return &f;
  return nullptr;
}

// The figures of a group with several ranks (groups.h).
void summarize_ranks(const GroupedRuns& data, Group& g) {
  g.shard = shard_name(g.config.shard);
  for (size_t i : g.runs) {
    const auto& d = data.runs[i].record.distributed;
    if (d && !d->shard.empty()) {
      g.shard = d->shard;
      break;
    }
  }
  if (!distributed_group(g)) return;
  g.bytes_sent_per_step = interval_of(data, g, [](const ReportRun& r) -> std::optional<double> {
    const RankFigures* f = rank_zero_figures(r.record);
    return f ? f->bytes_sent_per_step : std::nullopt;
  });
  g.overlapped_share =
      interval_of(data, g, [](const ReportRun& r) { return mean_overlapped_share(r.record); });
  // Rank numbers beyond the configuration's count are not ranks of this run.
  const int64_t world = std::clamp<int64_t>(g.config.nproc, 1, 1024);
  int64_t ranks = 0;
  for (size_t i : g.ok_runs)
    if (const auto& d = data.runs[i].record.distributed)
      for (const RankFigures& f : d->ranks)
        if (f.rank >= 0 && f.rank < world) ranks = std::max(ranks, f.rank + 1);
  g.rank_memory.resize(static_cast<size_t>(ranks));
  g.rank_peak_bytes.resize(static_cast<size_t>(ranks));
  for (int64_t k = 0; k < ranks; ++k) {
    for (const std::string& part : breakdown_parts()) {
      const Interval i = interval_of(data, g, [&](const ReportRun& r) -> std::optional<double> {
        const RankFigures* f = rank_of(r.record, k);
        return f ? breakdown_part(f->breakdown, part) : std::nullopt;
      });
      if (i.n > 0) g.rank_memory[k][part] = i;
    }
    g.rank_peak_bytes[k] = interval_of(data, g, [&](const ReportRun& r) -> std::optional<double> {
      const RankFigures* f = rank_of(r.record, k);
      return f ? std::optional<double>(static_cast<double>(f->peak_bytes)) : std::nullopt;
    });
  }
}

void summarize(const GroupedRuns& data, Group& g) {
  for (size_t i : g.runs)
    if (data.runs[i].ok()) g.ok_runs.push_back(i);
  for (size_t i : g.ok_runs)
    if (data.runs[i].timing_disturbed()) g.disturbed_runs.push_back(i);
  g.statuses = describe_statuses(data, g);
  g.final_loss = interval_of(data, g, [](const ReportRun& r) -> std::optional<double> {
    if (r.curve.empty()) return std::nullopt;
    return loss_at(r.curve, Axis::kSteps, r.curve.back().step);
  });
  g.val_loss = interval_of(data, g, [](const ReportRun& r) { return r.record.final_val_loss; });
  g.step_s = timed_interval_of(data, g, [](const ReportRun& r) -> std::optional<double> {
    return r.record.time ? r.record.time->step_median_s : std::nullopt;
  });
  g.peak_bytes = interval_of(data, g, [](const ReportRun& r) -> std::optional<double> {
    if (!r.record.memory) return std::nullopt;
    return static_cast<double>(r.record.memory->peak_bytes);
  });
  g.energy_j = timed_interval_of(data, g, [](const ReportRun& r) -> std::optional<double> {
    return r.record.energy ? r.record.energy->joules : std::nullopt;
  });
  g.util_pct = timed_interval_of(data, g, [](const ReportRun& r) -> std::optional<double> {
    return r.record.utilization ? r.record.utilization->mean_pct : std::nullopt;
  });
  g.tokens_per_s = timed_interval_of(data, g, [](const ReportRun& r) -> std::optional<double> {
    return r.record.throughput ? r.record.throughput->tokens_per_s : std::nullopt;
  });
  for (const std::string& part : breakdown_parts()) {
    const Interval i = interval_of(data, g, [&part](const ReportRun& r) -> std::optional<double> {
      if (!r.record.memory) return std::nullopt;
      return breakdown_part(r.record.memory->breakdown, part);
    });
    if (i.n > 0) g.memory[part] = i;
  }
  for (const char* phase : {"data", "forward", "backward", "communication", "optimizer"}) {
    const Interval i =
        timed_interval_of(data, g, [phase](const ReportRun& r) -> std::optional<double> {
      const auto& t = r.record.time;
      if (!t || !t->timed_steps || *t->timed_steps <= 0) return std::nullopt;
      const auto s = phase_seconds(*t, phase);
      if (!s) return std::nullopt;
      return *s / static_cast<double>(*t->timed_steps);
    });
    if (i.n > 0) g.phase_s[phase] = i;
  }
  const auto smallest = [&](Axis axis) {
    double total = kNaN;
    for (size_t i : g.ok_runs) {
      if (measured_axis(axis) && data.runs[i].timing_disturbed()) continue;
      const auto& c = data.runs[i].curve;
      if (c.empty() || !std::isfinite(c.back().at(axis))) continue;
      total = std::isfinite(total) ? std::min(total, c.back().at(axis)) : c.back().at(axis);
    }
    return total;
  };
  g.samples_total = smallest(Axis::kSamples);
  g.steps_total = smallest(Axis::kSteps);
  g.evaluations_total = smallest(Axis::kEvaluations);
  g.flops_total = smallest(Axis::kFlops);
  g.time_total = smallest(Axis::kTime);
  summarize_ranks(data, g);
}

std::string unquote(const std::string& s) {
  return s.size() >= 2 && s.front() == '"' && s.back() == '"' ? s.substr(1, s.size() - 2) : s;
}

// Settings that take their value from the preset: across presets they differ because the
// presets do, which the preset in the label already says.
bool preset_bound(const std::string& name) {
  return name.rfind("arch.", 0) == 0 || name == "seq_len" || name == "tokenizer";
}

// The settings a label names to tell groups a and b (same model, optimizer and strategy)
// apart. Evaluation settings change what a record measures, not what is trained, so they are
// named only when nothing else tells the two apart.
std::set<std::string> telling_apart(const Group& a, const Group& b) {
  std::set<std::string> names;
  for (const auto& [k, v] : a.settings) names.insert(k);
  for (const auto& [k, v] : b.settings) names.insert(k);
  std::set<std::string> others, evaluation;
  for (const std::string& k : names) {
    if (k == "optimizer" || k == "strategy" || k == "model") continue;
    if (preset_bound(k) && a.preset != b.preset) continue;
    const auto ia = a.settings.find(k), ib = b.settings.find(k);
    const std::string va = ia == a.settings.end() ? "" : ia->second;
    const std::string vb = ib == b.settings.end() ? "" : ib->second;
    if (va == vb) continue;
    (identity_section(k) == SettingSection::kEvaluation ? evaluation : others).insert(k);
  }
  return others.empty() ? evaluation : others;
}

// The settings of how a step is spread over ranks, named together as ranks_text.
bool ranks_setting(const std::string& name) {
  return name == "nproc" || name == "shard" || name == "grad_reduce" || name == "bucket_bytes";
}

// Labels: optimizer and strategy, plus each setting in which the group differs from another
// group of the same model, optimizer and strategy (the preset first; the preset's own
// settings only where they differ within one preset; the ranks last, in words, with the
// bucket size only between sharded groups that differ in it).
void label_groups(GroupedRuns& data) {
  for (const std::string& model : data.models) {
    std::vector<Group*> mine;
    for (Group& g : data.groups)
      if (g.model == model) mine.push_back(&g);
    std::vector<std::set<std::string>> differing(mine.size());
    std::vector<bool> bucket_differs(mine.size(), false);
    for (size_t a = 0; a < mine.size(); ++a) {
      for (size_t b = a + 1; b < mine.size(); ++b) {
        if (mine[a]->optimizer != mine[b]->optimizer || mine[a]->strategy != mine[b]->strategy)
          continue;
        for (const std::string& k : telling_apart(*mine[a], *mine[b])) {
          differing[a].insert(k);
          differing[b].insert(k);
        }
        if (mine[a]->config.shard != Shard::kNone &&
            mine[b]->config.shard != Shard::kNone &&
            mine[a]->config.bucket_bytes != mine[b]->config.bucket_bytes)
          bucket_differs[a] = bucket_differs[b] = true;
      }
    }
    for (size_t i = 0; i < mine.size(); ++i) {
      Group* g = mine[i];
      g->label = g->optimizer + ", " + g->strategy;
      if (g->strategy == "accumulation") g->label += fmt::format(" k={}", g->config.accum_steps);
      if (differing[i].count("preset")) g->label += " " + g->preset;
      bool ranks = false;
      for (const std::string& k : differing[i]) {
        if (k == "preset" || (k == "accum_steps" && g->strategy == "accumulation")) continue;
        if (ranks_setting(k)) {
          ranks = true;
          continue;
        }
        const auto it = g->settings.find(k);
        g->label += fmt::format(" {}={}", k, it == g->settings.end() ? "-" : unquote(it->second));
      }
      g->base_label = g->label;
      if (ranks) g->label += " " + ranks_text(*g);
      if (ranks && bucket_differs[i] && g->config.shard != Shard::kNone)
        g->label += " bucket " + format_bytes(static_cast<double>(g->config.bucket_bytes));
    }
  }
}

}  // namespace

const RankFigures* rank_zero_figures(const RunRecord& r) {
  if (!r.distributed || r.distributed->ranks.empty()) return nullptr;
  for (const RankFigures& f : r.distributed->ranks)
    if (f.rank == 0) return &f;
  return &r.distributed->ranks.front();
}

std::optional<double> mean_overlapped_share(const RunRecord& r) {
  if (!r.distributed) return std::nullopt;
  double sum = 0;
  int n = 0;
  for (const RankFigures& f : r.distributed->ranks)
    if (f.overlapped_share && std::isfinite(*f.overlapped_share)) {
      sum += *f.overlapped_share;
      ++n;
    }
  return n > 0 ? std::optional<double>(sum / n) : std::nullopt;
}

bool distributed_group(const Group& g) {
  return g.config.nproc > 1 || g.config.shard != Shard::kNone;
}

std::string ranks_text(const Group& g) {
  if (!distributed_group(g)) return "1 process";
  return fmt::format("{}{} x{}", g.shard.empty() ? shard_name(g.config.shard) : g.shard,
                     g.config.grad_reduce == GradReduce::kReduceScatter ? " reduce-scatter" : "",
                     g.config.nproc);
}

const std::vector<std::string>& breakdown_parts() {
  static const std::vector<std::string> parts = {
      "params",      "frozen_params", "grads", "optimizer_state", "collective_buffers",
      "activations", "other"};
  return parts;
}

std::string breakdown_label(const std::string& part) {
  if (part == "params") return "parameters";
  if (part == "frozen_params") return "frozen parameters";
  if (part == "grads") return "gradients";
  if (part == "optimizer_state") return "optimizer state";
  if (part == "collective_buffers") return "collective buffers";
  return part;  // activations, other
}

std::optional<double> breakdown_part(const MemoryBreakdown& b, const std::string& part) {
  if (part == "params") return static_cast<double>(b.params);
  if (part == "frozen_params") return static_cast<double>(b.frozen_params);
  if (part == "grads") return as_double(b.grads);
  if (part == "optimizer_state") return static_cast<double>(b.optimizer_state);
  if (part == "collective_buffers") return as_double(b.collective_buffers);
  if (part == "activations") return as_double(b.activations);
  if (part == "other") return static_cast<double>(b.other);
  return std::nullopt;
}

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::kSteps:
      return "steps";
    case Axis::kSamples:
      return "samples";
    case Axis::kEvaluations:
      return "evaluations";
    case Axis::kFlops:
      return "flops";
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
    case Axis::kEvaluations:
      return "gradient evaluations (samples x forward-backward passes)";
    case Axis::kFlops:
      return "hardware FLOPs";
    case Axis::kTime:
      return "training time (s)";
    case Axis::kEnergy:
      return "energy (J)";
  }
  return "?";
}

bool measured_axis(Axis a) { return a == Axis::kTime || a == Axis::kEnergy; }

double CurvePoint::at(Axis a) const {
  switch (a) {
    case Axis::kSteps:
      return step;
    case Axis::kSamples:
      return samples;
    case Axis::kEvaluations:
      return evaluations;
    case Axis::kFlops:
      return flops;
    case Axis::kTime:
      return time_s;
    case Axis::kEnergy:
      return energy_j;
  }
  return kNaN;
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

std::vector<double> seed_losses_at(const GroupedRuns& data, const Group& g, Axis axis, double x) {
  std::vector<double> v;
  for (size_t i : g.ok_runs) {
    if (measured_axis(axis) && data.runs[i].timing_disturbed()) continue;
    if (auto l = loss_at(data.runs[i].curve, axis, x)) v.push_back(*l);
  }
  return v;
}

Interval group_loss_at(const GroupedRuns& data, const Group& g, Axis axis, double x) {
  return mean_interval(seed_losses_at(data, g, axis, x));
}

std::optional<double> val_loss_at(const ReportRun& run, Axis axis, double x) {
  std::optional<double> last;
  for (const ValPoint& v : run.val)
    if (v.at.at(axis) <= x * (1 + 1e-12)) last = v.val_loss;
  return last;
}

std::vector<double> seed_val_losses_at(const GroupedRuns& data, const Group& g, Axis axis,
                                       double x) {
  std::vector<double> v;
  for (size_t i : g.ok_runs) {
    if (measured_axis(axis) && data.runs[i].timing_disturbed()) continue;
    const auto l = val_loss_at(data.runs[i], axis, x);
    if (!l) return {};
    v.push_back(*l);
  }
  return v;
}

Interval group_val_loss_at(const GroupedRuns& data, const Group& g, Axis axis, double x) {
  return mean_interval(seed_val_losses_at(data, g, axis, x));
}

double Group::total(Axis a) const {
  switch (a) {
    case Axis::kSteps:
      return steps_total;
    case Axis::kSamples:
      return samples_total;
    case Axis::kEvaluations:
      return evaluations_total;
    case Axis::kFlops:
      return flops_total;
    case Axis::kTime:
      return time_total;
    case Axis::kEnergy:
      return kNaN;
  }
  return kNaN;
}

std::string key_without(const Group& g, const std::set<std::string>& erase) {
  std::string key;
  for (const auto& [name, value] : g.settings) {
    const std::string top = name.substr(0, name.find('.'));
    if (erase.count(name) || erase.count(top)) continue;
    key += name + "=" + value + ";";
  }
  return key;
}

GroupedRuns group_runs(std::vector<RunRecord> records) {
  GroupedRuns data;
  data.attempts = static_cast<int64_t>(records.size());
  // Later records win, by run id and by resolved configuration and seed: two run ids can name
  // one experiment (the default learning rate given, or left out), and counting it twice would
  // make one seed look like two. A run keeps the place of its first attempt.
  std::map<std::string, size_t> by_id, by_seed;
  std::vector<std::optional<ReportRun>> kept;
  for (RunRecord& record : records) {
    const std::string id = record.run_id;
    const std::string seed_key =
        grouping_key(record.config, record.arch) + "\nseed=" + std::to_string(record.config.seed);
    std::vector<size_t> superseded;
    for (const auto& [index, key] : {std::pair{&by_id, id}, std::pair{&by_seed, seed_key}})
      if (auto it = index->find(key); it != index->end() && kept[it->second])
        superseded.push_back(it->second);
    // An attempt without a final status (interrupted, crashed, ...) never replaces one with
    // a final status: a run that ended stays as it ended.
    if (!is_final_status(record.status) &&
        std::any_of(superseded.begin(), superseded.end(),
                    [&](size_t j) { return is_final_status(kept[j]->record.status); }))
      continue;
    const size_t slot =
        superseded.empty() ? kept.size() : *std::min_element(superseded.begin(), superseded.end());
    for (size_t j : superseded) kept[j].reset();
    if (slot == kept.size()) kept.emplace_back();
    ReportRun run;
    run.curve = curve_of(record);
    run.val = val_of(record, run.curve);
    run.record = std::move(record);
    kept[slot] = std::move(run);
    by_id[id] = by_seed[seed_key] = slot;
  }
  for (auto& run : kept)
    if (run) data.runs.push_back(std::move(*run));
  check_usage(!data.runs.empty(), "the database holds no runs",
              "run `gradscope run` or `gradscope sweep` with --db pointing at it first");
  std::map<std::string, size_t> by_key;
  for (size_t i = 0; i < data.runs.size(); ++i) {
    const RunRecord& r = data.runs[i].record;
    const std::string key = grouping_key(r.config, r.arch);
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      Group g;
      g.key = key;
      g.config = r.config;
      g.arch = r.arch;
      g.settings = identity_settings(r.config, r.arch);
      g.model = r.config.model;
      g.preset = r.config.preset;
      g.optimizer = r.config.optimizer;
      g.strategy = r.config.strategy_label();
      it = by_key.emplace(key, data.groups.size()).first;
      data.groups.push_back(std::move(g));
    }
    data.groups[it->second].runs.push_back(i);
  }
  std::set<std::string> models;
  for (Group& g : data.groups) {
    std::sort(g.runs.begin(), g.runs.end(), [&](size_t a, size_t b) {
      return std::make_pair(data.runs[a].seed(), data.runs[a].run_id()) <
             std::make_pair(data.runs[b].seed(), data.runs[b].run_id());
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
  return data;
}

}  // namespace gradscope
