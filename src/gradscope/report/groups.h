// Runs, their loss curves and their groups: the part of the analysis every other part reads.
//
// - A run is the latest attempt of one run_id (a retried or resumed run counts once), and of
//   one configuration and seed (two run ids that resolve to the same configuration, such as
//   the default learning rate given and left out, count once).
// - A group is the runs whose identity settings (core/settings.h) differ only in the seed: its
//   key is grouping_key(config, arch). Its figures are means over its ok runs with a 95%
//   Student-t interval (core/statistics.h).
// - The loss "at" a point x of an axis (steps, samples, gradient evaluations, FLOPs, time,
//   energy) is the mean training loss over the last tenth (at least one) of the steps whose
//   axis value is at most x: training losses are noisy from step to step, and the study
//   compares training loss. The validation loss at x is the last evaluation at or before x.
// - Compute axes: a step's `evaluations` are forward + backward passes over its batch (more
//   than one for a line search such as CG's strong-Wolfe search). "Gradient evaluations" count
//   one per sample per pass, sum over steps of evaluations x samples: at equal evaluations two
//   optimizers have spent the same forward and backward work, whatever their step count. FLOPs
//   are hardware FLOPs, sum over steps of evaluations x record.flops.hardware_per_step: the
//   model FLOPs of a pass (3 x forward) plus the forward a checkpoint recomputes, so they
//   charge checkpointing for its recomputation where evaluations do not; NaN when the record
//   has no FLOP count (toy problems excepted, every model run has one).
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
enum class Axis { kSteps, kSamples, kEvaluations, kFlops, kTime, kEnergy };
// "steps", "samples", "evaluations", "flops", "time", "energy"
const char* axis_name(Axis a);
// "optimizer steps", "samples", "gradient evaluations (samples x passes)", ...
const char* axis_label(Axis a);
// Whether positions on the axis were measured on the machine while the run went (time, and
// the energy its meter counted over that time): a run whose timings were disturbed has none.
bool measured_axis(Axis a);

// One step of a run with its cumulative position on every axis.
struct CurvePoint {
  double step = 0, samples = 0, tokens = 0, time_s = 0, energy_j = 0, loss = 0;
  double evaluations = 0;        // sum of evaluations x samples (see above)
  double flops = 0;              // sum of evaluations x hardware FLOPs per step; NaN when unknown
  double lr = 0, grad_norm = 0;  // grad_norm NaN when not recorded
  double at(Axis a) const;
};

// One evaluation of a run on the validation set, at the position of the step it followed.
struct ValPoint {
  CurvePoint at;  // the position (the step's loss is not the validation loss)
  double val_loss = 0;
};

struct ReportRun {
  RunRecord record;
  // Every step with a finite loss, in order. Energy is each timed step's own reading
  // (StepEntry::energy_j); a step without one (warm-up) is charged at the run's mean power
  // over the steps that have one. Records without per-step readings spread the run's joules
  // over the timed steps by their time, warm-up charged at the same power. NaN without an
  // energy figure.
  std::vector<CurvePoint> curve;
  // Every evaluation with a finite validation loss, in order.
  std::vector<ValPoint> val;

  const std::string& run_id() const { return record.run_id; }
  // Its timings measured a busy machine (record.contention, docs/metrics.md "Disturbance"):
  // left out of every figure and comparison of time.
  bool timing_disturbed() const { return record.contention && record.contention->disturbed; }
  uint64_t seed() const { return record.config.seed; }
  bool ok() const { return record.ok(); }
};

struct Group {
  std::string key;    // grouping_key of its runs' configuration
  std::string label;  // "adam, checkpoint" plus what else differs between the model's groups
  // The label without the ranks ("zero2 x2", "1 process"), which it names last when they tell
  // groups apart: what the same configuration on other rank counts shares.
  std::string base_label;
  std::string model, preset, optimizer, strategy;
  RunConfig config;  // the first run's configuration and resolved architecture
  nlohmann::json arch;
  std::map<std::string, std::string> settings;  // identity_settings of config and arch
  std::vector<size_t> runs;                     // indices into GroupedRuns::runs, in seed order
  std::vector<size_t> ok_runs;                  // those whose status is ok
  // Of ok_runs, those whose timings were disturbed (ReportRun::timing_disturbed): their step
  // time, throughput, phase times, utilization and losses at equal time are left out of the
  // figures below and of every comparison of time.
  std::vector<size_t> disturbed_runs;
  // Figures over the ok runs (n = 0 when none has the value).
  Interval final_loss, val_loss, step_s, peak_bytes, energy_j, util_pct;
  std::map<std::string, Interval> memory;  // breakdown component (breakdown_parts) -> bytes
  // data/forward/backward/communication/optimizer -> s per step (communication: time.comm_s,
  // with several ranks)
  std::map<std::string, Interval> phase_s;
  Interval tokens_per_s;  // every rank's tokens: the record's throughput is the whole step's
  // With several ranks (distributed_group): the shard mode as the records name it
  // (distributed.shard of the first run that has one; else the configuration's), and over the
  // ok runs rank 0's bytes sent per step and the ranks' mean share of gradients reduced while
  // backward still ran.
  std::string shard;
  Interval bytes_sent_per_step, overlapped_share;
  // Per rank (distributed.ranks[].rank; empty maps for ranks no run has): each breakdown
  // component at that rank's own peak, and the peak.
  std::vector<std::map<std::string, Interval>> rank_memory;
  std::vector<Interval> rank_peak_bytes;
  double samples_total = 0;  // smallest over its ok runs; NaN when none
  double steps_total = 0;
  double evaluations_total = 0;
  double flops_total = 0;
  double time_total = 0;
  // The smallest total over its ok runs on an axis (energy: NaN).
  double total(Axis a) const;
  std::string statuses;  // "ok" or e.g. "ok x2, oom"
};

// A group that ran with several ranks, or sharded on one (config.nproc > 1 or a --shard).
bool distributed_group(const Group& g);
// The ranks of a group in words: "zero2 x2" (its shard mode and rank count), "1 process".
std::string ranks_text(const Group& g);

// Rank 0's figures of a run with several ranks (the first listed when rank 0's are missing);
// nullptr without any.
const RankFigures* rank_zero_figures(const RunRecord& r);
// The ranks' mean share of gradients reduced while backward still ran (overlapped_share);
// nullopt when no rank measured it.
std::optional<double> mean_overlapped_share(const RunRecord& r);

// The components of a memory breakdown (MemoryBreakdown) in the order figures stack them:
// params, frozen_params, grads, optimizer_state, collective_buffers, activations, other.
const std::vector<std::string>& breakdown_parts();
// A component's name in words ("optimizer state").
std::string breakdown_label(const std::string& part);
// A component of a breakdown, in bytes; nullopt where it was not measured.
std::optional<double> breakdown_part(const MemoryBreakdown& b, const std::string& part);

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
// The loss of a group's ok runs at x, pooled over seeds (on the time axis, the runs whose
// timings were not disturbed).
Interval group_loss_at(const GroupedRuns& data, const Group& g, Axis axis, double x);
// The same per seed: one value per ok run that has one (what a t test is given).
std::vector<double> seed_losses_at(const GroupedRuns& data, const Group& g, Axis axis, double x);
// The validation loss of one run at x: its last evaluation at or before x.
std::optional<double> val_loss_at(const ReportRun& run, Axis axis, double x);
// The validation loss of a group's ok runs at x; n = 0 unless every ok run has one.
Interval group_val_loss_at(const GroupedRuns& data, const Group& g, Axis axis, double x);
// The same per seed; empty unless every ok run has one.
std::vector<double> seed_val_losses_at(const GroupedRuns& data, const Group& g, Axis axis,
                                       double x);

// A group's identity settings without those named in `erase` (a flattened name, or its part
// before the first '.'), as text: groups with the same text differ only in what was erased.
std::string key_without(const Group& g, const std::set<std::string>& erase);

}  // namespace gradscope
