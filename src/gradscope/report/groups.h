// Runs, their loss curves and their groups: the part of the analysis every other part reads.
//
// - A run is the latest attempt of one run_id (a retried or resumed run counts once), and of
//   one configuration and seed (two run ids that resolve to the same configuration, such as
//   the default learning rate given and left out, count once).
// - A group is the runs whose identity settings (core/settings.h) differ only in the seed: its
//   key is grouping_key(config, arch). Its figures are means over its ok runs with a 95%
//   Student-t interval (core/statistics.h).
// - The loss "at" a point x of an axis (steps, samples, time, energy) is the mean training loss
//   over the last tenth (at least one) of the steps whose axis value is at most x: training
//   losses are noisy from step to step, and the study compares training loss.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gradscope/core/record.h"
#include "gradscope/core/statistics.h"

namespace gradscope {

// The x axes of loss curves.
enum class Axis { kSteps, kSamples, kTime, kEnergy };
const char* axis_name(Axis a);   // "steps", "samples", "time", "energy"
const char* axis_label(Axis a);  // "optimizer steps", "samples", "training time (s)", ...

// One step of a run with its cumulative position on every axis.
struct CurvePoint {
  double step = 0, samples = 0, tokens = 0, time_s = 0, energy_j = 0, loss = 0;
  double lr = 0, grad_norm = 0;  // grad_norm NaN when not recorded
  double at(Axis a) const;
};

struct ReportRun {
  RunRecord record;
  // Every step with a finite loss, in order. Energy is the run's measured (or estimated)
  // joules spread over its steps in proportion to their time; NaN without an energy figure.
  std::vector<CurvePoint> curve;

  const std::string& run_id() const { return record.run_id; }
  uint64_t seed() const { return record.config.seed; }
  bool ok() const { return record.ok(); }
};

struct Group {
  std::string key;    // grouping_key of its runs' configuration
  std::string label;  // "adam, checkpoint" plus what else differs between the model's groups
  std::string model, preset, optimizer, strategy;
  RunConfig config;  // the first run's configuration and resolved architecture
  nlohmann::json arch;
  std::map<std::string, std::string> settings;  // identity_settings of config and arch
  std::vector<size_t> runs;                     // indices into GroupedRuns::runs, in seed order
  std::vector<size_t> ok_runs;                  // those whose status is ok
  // Figures over the ok runs (n = 0 when none has the value).
  Interval final_loss, val_loss, step_s, peak_bytes, energy_j, util_pct;
  std::map<std::string, Interval> memory;   // breakdown component -> bytes
  std::map<std::string, Interval> phase_s;  // data/forward/backward/optimizer -> s per step
  double samples_total = 0;                 // smallest over its ok runs; NaN when none
  double steps_total = 0;
  std::string statuses;  // "ok" or e.g. "ok x2, oom"
};

// The runs of a database and their groups.
struct GroupedRuns {
  std::vector<ReportRun> runs;
  std::vector<Group> groups;        // sorted: model, preset, strategy, optimizer, label
  std::vector<std::string> models;  // sorted
  int64_t attempts = 0;             // every stored attempt, the superseded ones included
};

// The latest attempt of each run (later records win), its curve, and the groups with their
// figures and labels. Throws a usage error when there is no record.
GroupedRuns group_runs(std::vector<RunRecord> records);

// The loss of one run at x on an axis (see above); nullopt when no step is at or before x.
std::optional<double> loss_at(const std::vector<CurvePoint>& curve, Axis axis, double x);
// The loss of a group's ok runs at x, pooled over seeds.
Interval group_loss_at(const GroupedRuns& data, const Group& g, Axis axis, double x);

// A group's identity settings without those named in `erase` (a flattened name, or its part
// before the first '.'), as text: groups with the same text differ only in what was erased.
std::string key_without(const Group& g, const std::set<std::string>& erase);

}  // namespace gradscope
