// What a report says, computed from the results database alone: the runs grouped by
// configuration (seeds pooled, with 95% intervals), loss at equal steps and at equal samples,
// the study's claims re-examined against the data (findings), and per model and memory budget
// the combination to use (recommendations). Rendering (tables, figures, HTML) is in render.h.
//
// Definitions (docs/reports.md explains them for readers):
// - A run is the latest attempt of one run_id. A group is the runs whose configurations differ
//   only in seed (and threads); its figures are means over seeds with a 95% Student-t interval.
// - The loss "at" a point x of an axis (steps, samples, time, energy) is the mean training loss
//   over the last tenth (at least one) of the steps whose axis value is at most x: training
//   losses are noisy from step to step, and the study compares training loss.
// - Equal steps / equal samples: compared runs are all read at the smallest step count /
//   sample count that every one of them reached.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscope {

class Database;

// The x axes of loss curves.
enum class Axis { kSteps, kSamples, kTime, kEnergy };
const char* axis_name(Axis a);   // "steps", "samples", "time", "energy"
const char* axis_label(Axis a);  // "optimizer steps", "samples", "wall time (s)", "energy (J)"

// One step of a run with its cumulative position on every axis.
struct CurvePoint {
  double step = 0, samples = 0, tokens = 0, time_s = 0, energy_j = 0, loss = 0;
  double lr = 0, grad_norm = 0;  // NaN when not recorded
  double at(Axis a) const;
};

// A mean over seeds with its 95% confidence half-width (NaN with fewer than two values).
struct Interval {
  double mean = 0;
  double half_width = 0;
  int n = 0;
  bool has_interval() const { return n >= 2; }
  double lo() const { return mean - (has_interval() ? half_width : 0); }
  double hi() const { return mean + (has_interval() ? half_width : 0); }
};
// The mean of `values` and, with n >= 2, t(0.975, n-1) * sd / sqrt(n). Empty: n = 0.
Interval mean_interval(const std::vector<double>& values);
// The p-quantile of Student's t distribution with `df` degrees of freedom (p in (0, 1)).
double student_t_quantile(double p, double df);

struct ReportRun {
  std::string run_id, sweep, status;
  nlohmann::json record;
  // Every step with a finite loss, in order. Energy is the run's measured (or estimated)
  // joules spread over its steps in proportion to their time; NaN without an energy figure.
  std::vector<CurvePoint> curve;
  int64_t seed = 0;
};

struct Group {
  std::string key;    // canonical JSON of the configuration without seed and threads
  std::string label;  // "adam, checkpoint" plus what else differs between the model's groups
  std::string model, preset, optimizer, strategy;
  nlohmann::json config;        // the first run's configuration
  std::vector<size_t> runs;     // indices into ReportData::runs, in seed order
  std::vector<size_t> ok_runs;  // those whose status is "ok"
  // Figures over the ok runs (NaN-free; n = 0 when none has the value).
  Interval final_loss, val_loss, step_s, peak_bytes, energy_j, util_pct;
  std::map<std::string, Interval> memory;   // breakdown component -> bytes
  std::map<std::string, Interval> phase_s;  // data/forward/backward/optimizer -> s per step
  double samples_total = 0;                 // smallest over its ok runs
  double steps_total = 0;
  std::string statuses;  // "ok" or e.g. "ok x2, oom x1"
};

// The loss of one run at x on an axis (see above); nullopt when no step is at or before x.
std::optional<double> loss_at(const std::vector<CurvePoint>& curve, Axis axis, double x);
// The loss of a group's ok runs at x, pooled over seeds.
Interval group_loss_at(const struct ReportData& data, const Group& g, Axis axis, double x);

enum class Verdict { kReproduced, kNotReproduced, kNotEnoughData };
const char* verdict_name(Verdict v);  // "reproduced", "not reproduced", "not enough data"

// One compared pair or cell behind a finding, at one basis.
struct Evidence {
  std::string what;     // "nanovlm tiny, adam: accumulation vs standard"
  std::string steps;    // the figure at equal steps, as text
  std::string samples;  // the figure at equal samples, as text
};

struct Finding {
  std::string id;                             // "accumulation-vlm", ...
  std::string claim;                          // the study's claim, in words
  std::string rule;                           // how the verdict is decided
  Verdict verdict = Verdict::kNotEnoughData;  // on the study's basis
  Verdict verdict_equal_samples = Verdict::kNotEnoughData;
  std::string measured;  // the headline figure(s) this database gives
  std::vector<Evidence> evidence;
  std::vector<std::string> notes;  // intervals overlapping, device caveats, ...
};

struct Recommendation {
  std::string model;
  double budget_bytes = 0;     // 0: no limit
  std::string budget_source;   // "memory cap in the data", "--memory-budget", "data: ..."
  std::optional<size_t> best;  // group index
  Interval best_loss;          // at equal samples
  double equal_samples = 0;
  double time_to_samples_s = 0, energy_to_samples_j = 0;  // the best group's, to equal_samples
  bool energy_known = false;
  std::vector<size_t> fits, misses;  // group indices
  std::vector<std::string> miss_reasons;
};

struct ReportOptions {
  std::vector<int64_t> memory_budgets;  // --memory-budget, bytes
};

struct ReportData {
  std::string db_path;
  std::vector<ReportRun> runs;
  std::vector<Group> groups;        // sorted: model, preset, strategy, optimizer, label
  std::vector<std::string> models;  // sorted
  std::vector<Finding> findings;
  std::vector<Recommendation> recommendations;
  int64_t attempts = 0;  // every stored attempt, the superseded ones included
};

// Reads the database and computes everything above. Throws a usage error for a database with
// no runs.
ReportData analyze(Database& db, const ReportOptions& options);
// The same from records (the latest attempt of each run_id wins; `attempts` = records.size()).
ReportData analyze_records(const std::vector<nlohmann::json>& records,
                           const ReportOptions& options);

// The number at a path of nested objects of a record, or NaN when absent, null or not a
// number (JSON holds no NaN, so NaN always means "not there").
double record_number(const nlohmann::json& j, std::initializer_list<const char*> path);

// "1.23x", "+12%" and friends, shared with the renderers.
std::string format_ratio(double r);
std::string format_interval(const Interval& i, const char* spec = "{:.4f}");

}  // namespace gradscope
