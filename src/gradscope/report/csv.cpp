#include "gradscope/report/csv.h"

#include <functional>
#include <optional>
#include <type_traits>

#include "gradscope/report/encode.h"

namespace gradscope {

namespace {

template <typename T>
std::string cell(const std::optional<T>& v) {
  return v ? csv_number(static_cast<double>(*v)) : "";
}

// A member of an optional part of the record; empty when either is missing.
template <typename S, typename T>
std::string cell(const std::optional<S>& section, T S::*member) {
  if (!section) return "";
  if constexpr (std::is_arithmetic_v<T>) {
    return csv_number(static_cast<double>((*section).*member));
  } else {
    return cell((*section).*member);
  }
}

std::string breakdown_cell(const RunRecord& r, int64_t MemoryBreakdown::*member) {
  return r.memory ? csv_number(static_cast<double>(r.memory->breakdown.*member)) : "";
}

std::string breakdown_cell(const RunRecord& r, std::optional<int64_t> MemoryBreakdown::*member) {
  return r.memory ? cell(r.memory->breakdown.*member) : "";
}

// One row of runs.csv: a run, its group (the configuration it belongs to) and its loss at the
// curve's last step (loss_at: the loss_last_tenth column).
struct CsvRun {
  const Group& group;
  const ReportRun& run;
  const RunRecord& r;
  const RunConfig& c;
  std::optional<double> tail;
};

// A column of runs.csv: its header and how a run's cell is written.
struct CsvColumn {
  const char* name;
  std::function<std::string(const CsvRun&)> value;
};

// Which run, of which configuration, and the settings that define it.
const std::vector<CsvColumn>& configuration_columns() {
  static const std::vector<CsvColumn> columns = {
      {"run_id", [](const CsvRun& x) { return x.r.run_id; }},
      {"sweep", [](const CsvRun& x) { return x.r.sweep.value_or(""); }},
      {"configuration", [](const CsvRun& x) { return x.group.label; }},
      {"model", [](const CsvRun& x) { return x.group.model; }},
      {"preset", [](const CsvRun& x) { return x.group.preset; }},
      {"optimizer", [](const CsvRun& x) { return x.group.optimizer; }},
      {"strategy", [](const CsvRun& x) { return x.group.strategy; }},
      {"seed", [](const CsvRun& x) { return std::to_string(x.c.seed); }},
      {"lr", [](const CsvRun& x) { return csv_number(x.c.lr); }},
      {"batch", [](const CsvRun& x) { return csv_number(static_cast<double>(x.c.batch)); }},
      {"accum_steps",
       [](const CsvRun& x) { return csv_number(static_cast<double>(x.c.accum_steps)); }},
      {"seq_len", [](const CsvRun& x) { return csv_number(static_cast<double>(x.c.seq_len)); }},
      {"steps", [](const CsvRun& x) { return csv_number(static_cast<double>(x.c.steps)); }},
      {"dtype", [](const CsvRun& x) { return dtype_name(x.c.dtype); }},
      {"device", [](const CsvRun& x) { return x.c.device; }},
      {"nproc", [](const CsvRun& x) { return std::to_string(x.c.nproc); }},
      {"shard", [](const CsvRun& x) { return shard_name(x.c.shard); }},
  };
  return columns;
}

// How the run ended: its status, losses, accuracy, times and throughput.
const std::vector<CsvColumn>& outcome_columns() {
  static const std::vector<CsvColumn> columns = {
      {"status", [](const CsvRun& x) { return status_name(x.r.status); }},
      {"final_loss", [](const CsvRun& x) { return cell(x.r.final_loss); }},
      {"loss_last_tenth", [](const CsvRun& x) { return cell(x.tail); }},
      {"final_val_loss", [](const CsvRun& x) { return cell(x.r.final_val_loss); }},
      {"final_accuracy", [](const CsvRun& x) { return cell(x.r.final_accuracy); }},
      {"step_median_s", [](const CsvRun& x) { return cell(x.r.time, &RunTime::step_median_s); }},
      {"total_s", [](const CsvRun& x) { return cell(x.r.time, &RunTime::total_s); }},
      {"comm_s", [](const CsvRun& x) { return cell(x.r.time, &RunTime::comm_s); }},
      {"samples_per_s",
       [](const CsvRun& x) { return cell(x.r.throughput, &RunThroughput::samples_per_s); }},
      {"tokens_per_s",
       [](const CsvRun& x) { return cell(x.r.throughput, &RunThroughput::tokens_per_s); }},
  };
  return columns;
}

// The peak memory and its parts.
const std::vector<CsvColumn>& memory_columns() {
  static const std::vector<CsvColumn> columns = {
      {"peak_bytes", [](const CsvRun& x) { return cell(x.r.memory, &RunMemory::peak_bytes); }},
      {"params_bytes",
       [](const CsvRun& x) { return breakdown_cell(x.r, &MemoryBreakdown::params); }},
      {"frozen_params_bytes",
       [](const CsvRun& x) { return breakdown_cell(x.r, &MemoryBreakdown::frozen_params); }},
      {"grads_bytes", [](const CsvRun& x) { return breakdown_cell(x.r, &MemoryBreakdown::grads); }},
      {"optimizer_state_bytes",
       [](const CsvRun& x) { return breakdown_cell(x.r, &MemoryBreakdown::optimizer_state); }},
      {"activations_bytes",
       [](const CsvRun& x) { return breakdown_cell(x.r, &MemoryBreakdown::activations); }},
      {"activations_logits_bytes",
       [](const CsvRun& x) { return breakdown_cell(x.r, &MemoryBreakdown::logits); }},
      {"other_bytes", [](const CsvRun& x) { return breakdown_cell(x.r, &MemoryBreakdown::other); }},
      {"collective_buffers_bytes",
       [](const CsvRun& x) { return breakdown_cell(x.r, &MemoryBreakdown::collective_buffers); }},
  };
  return columns;
}

// What else was measured: communication, energy, utilization, FLOPs and what competed with
// the run for the CPUs.
const std::vector<CsvColumn>& measurement_columns() {
  static const std::vector<CsvColumn> columns = {
      {"bytes_sent_per_step",
       [](const CsvRun& x) -> std::string {
         const RankFigures* zero = rank_zero_figures(x.r);
         return zero ? cell(zero->bytes_sent_per_step) : "";
       }},
      {"overlapped_share", [](const CsvRun& x) { return cell(mean_overlapped_share(x.r)); }},
      {"energy_j", [](const CsvRun& x) { return cell(x.r.energy, &RunEnergy::joules); }},
      {"energy_source",
       [](const CsvRun& x) -> std::string {
         return x.r.energy && x.r.energy->source ? *x.r.energy->source : "";
       }},
      {"utilization_mean_pct",
       [](const CsvRun& x) { return cell(x.r.utilization, &RunUtilization::mean_pct); }},
      {"flops_per_step", [](const CsvRun& x) { return cell(x.r.flops, &RunFlops::per_step); }},
      {"achieved_flops_per_s",
       [](const CsvRun& x) { return cell(x.r.flops, &RunFlops::achieved_per_s); }},
      {"mfu", [](const CsvRun& x) { return cell(x.r.flops, &RunFlops::mfu); }},
      {"timing_disturbed",
       [](const CsvRun& x) -> std::string {
         return x.r.contention ? (x.r.contention->disturbed ? "true" : "false") : "";
       }},
      {"involuntary_switches_per_s",
       [](const CsvRun& x) {
         return cell(x.r.contention, &RunContention::involuntary_switches_per_s);
       }},
      {"steal_pct",
       [](const CsvRun& x) { return cell(x.r.contention, &RunContention::steal_pct); }},
      {"competing_tasks_mean",
       [](const CsvRun& x) { return cell(x.r.contention, &RunContention::competing_tasks_mean); }},
  };
  return columns;
}

// Every column of runs.csv, in order.
std::vector<const CsvColumn*> runs_columns() {
  std::vector<const CsvColumn*> out;
  for (const auto* part :
       {&configuration_columns(), &outcome_columns(), &memory_columns(), &measurement_columns()})
    for (const CsvColumn& column : *part) out.push_back(&column);
  return out;
}

}  // namespace

std::string runs_csv(const GroupedRuns& data) {
  const std::vector<const CsvColumn*> columns = runs_columns();
  std::vector<std::string> cells;
  for (const CsvColumn* column : columns) cells.push_back(column->name);
  std::string csv = csv_row(cells);
  for (const Group& g : data.groups) {
    for (size_t i : g.runs) {
      const ReportRun& run = data.runs[i];
      const auto tail = run.curve.empty() ? std::nullopt
                                          : loss_at(run.curve, Axis::kSteps, run.curve.back().step);
      const CsvRun row{g, run, run.record, run.record.config, tail};
      cells.clear();
      for (const CsvColumn* column : columns) cells.push_back(column->value(row));
      csv += csv_row(cells);
    }
  }
  return csv;
}

std::string steps_csv(const GroupedRuns& data) {
  std::string csv = csv_row({"run_id", "step", "samples", "tokens", "evaluations", "flops",
                             "time_s", "energy_j", "loss", "lr", "grad_norm"});
  for (const Group& g : data.groups)
    for (size_t i : g.runs)
      for (const CurvePoint& p : data.runs[i].curve)
        csv += csv_row({data.runs[i].run_id(), csv_number(p.step), csv_number(p.samples),
                        csv_number(p.tokens), csv_number(p.evaluations), csv_number(p.flops),
                        csv_number(p.time_s), csv_number(p.energy_j), csv_number(p.loss),
                        csv_number(p.lr), csv_number(p.grad_norm)});
  return csv;
}

std::string claims_csv(const std::vector<Finding>& findings) {
  // The first seven columns keep their order; later ones are appended, so a reader of the
  // earlier columns keeps working.
  std::string csv = csv_row({"claim_id", "claim", "verdict_equal_steps", "verdict_equal_samples",
                             "verdict_equal_evaluations", "measured", "rule", "headline", "scale",
                             "correction", "contrasts", "verdict_rule_gave"});
  for (const Finding& f : findings) {
    std::string contrasts;
    for (const std::string& c : f.contrasts) contrasts += (contrasts.empty() ? "" : " | ") + c;
    // What the rule gave: the verdict itself, unless the runs could carry none.
    const Verdict gave = f.verdict == Verdict::kIndicativeOnly ? f.leaning : f.verdict;
    csv += csv_row({f.id, f.claim, verdict_name(f.verdict), verdict_name(f.verdict_equal_samples),
                    verdict_name(f.verdict_equal_evaluations), f.measured, f.rule, f.headline,
                    f.scale, f.correction, contrasts, verdict_name(gave)});
  }
  return csv;
}

}  // namespace gradscope
