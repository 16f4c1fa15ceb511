#include "gradscope/report/csv.h"

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

}  // namespace

std::string runs_csv(const GroupedRuns& data) {
  std::string csv = csv_row({"run_id",
                             "sweep",
                             "configuration",
                             "model",
                             "preset",
                             "optimizer",
                             "strategy",
                             "seed",
                             "lr",
                             "batch",
                             "accum_steps",
                             "seq_len",
                             "steps",
                             "dtype",
                             "device",
                             "nproc",
                             "shard",
                             "status",
                             "final_loss",
                             "loss_last_tenth",
                             "final_val_loss",
                             "final_accuracy",
                             "step_median_s",
                             "total_s",
                             "comm_s",
                             "samples_per_s",
                             "tokens_per_s",
                             "peak_bytes",
                             "params_bytes",
                             "frozen_params_bytes",
                             "grads_bytes",
                             "optimizer_state_bytes",
                             "activations_bytes",
                             "activations_logits_bytes",
                             "other_bytes",
                             "collective_buffers_bytes",
                             "bytes_sent_per_step",
                             "overlapped_share",
                             "energy_j",
                             "energy_source",
                             "utilization_mean_pct",
                             "flops_per_step",
                             "achieved_flops_per_s",
                             "mfu",
                             "timing_disturbed",
                             "involuntary_switches_per_s",
                             "steal_pct",
                             "competing_tasks_mean"});
  for (const Group& g : data.groups) {
    for (size_t i : g.runs) {
      const ReportRun& run = data.runs[i];
      const RunRecord& r = run.record;
      const RunConfig& c = r.config;
      const auto tail = run.curve.empty() ? std::nullopt
                                          : loss_at(run.curve, Axis::kSteps, run.curve.back().step);
      csv += csv_row({r.run_id,
                      r.sweep.value_or(""),
                      g.label,
                      g.model,
                      g.preset,
                      g.optimizer,
                      g.strategy,
                      std::to_string(c.seed),
                      csv_number(c.lr),
                      csv_number(static_cast<double>(c.batch)),
                      csv_number(static_cast<double>(c.accum_steps)),
                      csv_number(static_cast<double>(c.seq_len)),
                      csv_number(static_cast<double>(c.steps)),
                      dtype_name(c.dtype),
                      c.device,
                      std::to_string(c.nproc),
                      shard_name(c.shard),
                      status_name(r.status),
                      cell(r.final_loss),
                      cell(tail),
                      cell(r.final_val_loss),
                      cell(r.final_accuracy),
                      cell(r.time, &RunTime::step_median_s),
                      cell(r.time, &RunTime::total_s),
                      cell(r.time, &RunTime::comm_s),
                      cell(r.throughput, &RunThroughput::samples_per_s),
                      cell(r.throughput, &RunThroughput::tokens_per_s),
                      cell(r.memory, &RunMemory::peak_bytes),
                      breakdown_cell(r, &MemoryBreakdown::params),
                      breakdown_cell(r, &MemoryBreakdown::frozen_params),
                      breakdown_cell(r, &MemoryBreakdown::grads),
                      breakdown_cell(r, &MemoryBreakdown::optimizer_state),
                      breakdown_cell(r, &MemoryBreakdown::activations),
                      breakdown_cell(r, &MemoryBreakdown::logits),
                      breakdown_cell(r, &MemoryBreakdown::other),
                      breakdown_cell(r, &MemoryBreakdown::collective_buffers),
                      rank_zero_figures(r) ? cell(rank_zero_figures(r)->bytes_sent_per_step) : "",
                      cell(mean_overlapped_share(r)),
                      cell(r.energy, &RunEnergy::joules),
                      r.energy && r.energy->source ? *r.energy->source : "",
                      cell(r.utilization, &RunUtilization::mean_pct),
                      cell(r.flops, &RunFlops::per_step),
                      cell(r.flops, &RunFlops::achieved_per_s),
                      cell(r.flops, &RunFlops::mfu),
                      r.contention ? (r.contention->disturbed ? "true" : "false") : "",
                      cell(r.contention, &RunContention::involuntary_switches_per_s),
                      cell(r.contention, &RunContention::steal_pct),
                      cell(r.contention, &RunContention::competing_tasks_mean)});
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
  std::string csv = csv_row({"claim_id", "claim", "verdict_equal_steps", "verdict_equal_samples",
                             "verdict_equal_evaluations", "measured", "rule"});
  for (const Finding& f : findings)
    csv += csv_row({f.id, f.claim, verdict_name(f.verdict), verdict_name(f.verdict_equal_samples),
                    verdict_name(f.verdict_equal_evaluations), f.measured, f.rule});
  return csv;
}

}  // namespace gradscope
