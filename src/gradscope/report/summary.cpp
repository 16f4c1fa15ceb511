#include "gradscope/report/summary.h"

#include <algorithm>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/log.h"
#include "gradscope/report/groups.h"

namespace gradscope {
namespace {

template <typename T>
std::string or_na(const std::optional<T>& v, const std::function<std::string(double)>& f) {
  return v ? f(static_cast<double>(*v)) : "n/a";
}

// A few rows on how a run with several ranks spread its step: ranks and shard mode, each
// rank's peak and what it holds, communication and bytes sent. The record's text is shown as
// data (terminal_text), as everything a record names.
std::vector<std::pair<std::string, std::string>> distributed_rows(const RunRecord& r) {
  const RunDistributed& d = *r.distributed;
  const auto bytes = [](double v) { return format_bytes(v); };
  std::vector<std::pair<std::string, std::string>> rows;
  rows.push_back({"ranks / shard",
                  terminal_text(fmt::format(
                      "{} x {} ({}, started by {}); {} of {} parameters per rank", d.world, d.shard,
                      d.backend, d.launcher, format_si(static_cast<double>(d.shard_params)),
                      format_si(static_cast<double>(d.flat_params))))});
  // Every rank up to kShown; beyond, the rank with the highest peak after them.
  constexpr size_t kShown = 4;
  const RankFigures* highest = nullptr;
  for (size_t i = 0; i < d.ranks.size(); ++i) {
    const RankFigures& f = d.ranks[i];
    if (i >= kShown) {
      if (!highest || f.peak_bytes > highest->peak_bytes) highest = &f;
      continue;
    }
    rows.push_back(
        {fmt::format("  rank {} peak", f.rank),
         terminal_text(fmt::format(
             "{}{}: params {} / grads {} / optimizer {} / buffers {}",
             format_bytes(static_cast<double>(f.peak_bytes)),
             f.peak_phase ? " (" + *f.peak_phase + ")" : "",
             format_bytes(static_cast<double>(f.params_bytes)), or_na(f.grads_bytes, bytes),
             format_bytes(static_cast<double>(f.optimizer_state_bytes)),
             format_bytes(static_cast<double>(f.collective_buffer_peak_bytes))))});
  }
  if (highest)
    rows.push_back({fmt::format("  {} more ranks", d.ranks.size() - kShown),
                    fmt::format("the highest peak: rank {}, {}", highest->rank,
                                format_bytes(static_cast<double>(highest->peak_bytes)))});
  // Communication per timed step (rank 0's), and the ranks' mean overlapped share.
  const RunTime time = r.time.value_or(RunTime{});
  std::string comm = "n/a";
  if (time.comm_s && time.timed_steps && *time.timed_steps > 0)
    comm = format_duration(*time.comm_s / static_cast<double>(*time.timed_steps)) + " per step";
  const std::optional<double> overlapped = mean_overlapped_share(r);
  if (overlapped)
    comm += fmt::format(", {:.0f}% of gradients reduced during backward", 100 * *overlapped);
  rows.push_back({"  communication", comm});
  const RankFigures* zero = rank_zero_figures(r);
  rows.push_back(
      {"  sent per step (rank 0)", or_na(zero ? zero->bytes_sent_per_step : std::nullopt, bytes)});
  return rows;
}

}  // namespace

std::string summary_table(const RunRecord& r,
                          const std::vector<std::pair<std::string, std::string>>& extra) {
  const RunConfig& c = r.config;
  const auto bytes = [](double v) { return format_bytes(v); };
  const auto fixed4 = [](double v) { return fmt::format("{:.4f}", v); };
  const auto fixed2 = [](double v) { return fmt::format("{:.2f}", v); };
  const auto pct = [](double v) { return fmt::format("{:.0f}%", v); };
  const auto count = [](double v) { return fmt::format("{:.0f}", v); };
  const RunTime time = r.time.value_or(RunTime{});
  const RunThroughput put = r.throughput.value_or(RunThroughput{});
  const auto memory = [&](auto field) -> std::optional<double> {
    if (!r.memory) return std::nullopt;
    return field(*r.memory);
  };
  std::vector<std::pair<std::string, std::string>> rows = {
      {"run", r.run_id},
      {"status", status_name(r.status)},
      {"model", fmt::format("{} ({}), {} parameters", c.model, c.preset,
                            format_si(static_cast<double>(r.params.value_or(0))))},
      {"optimizer / strategy",
       fmt::format("{} (lr {:g}) / {}", c.optimizer, c.lr, c.strategy_label())},
      {"batch x accum x seq", fmt::format("{} x {} x {}", c.batch, c.accum_steps, c.seq_len)},
      {"final train loss", or_na(r.final_loss, fixed4)},
      {"final val loss", or_na(r.final_val_loss, fixed4)},
      {"timed steps", or_na(time.timed_steps, count)},
      {"step time (median)", or_na(time.step_median_s, format_duration)},
      {"  data / fwd / bwd / opt",
       fmt::format("{} / {} / {} / {}", or_na(time.data_s, format_duration),
                   or_na(time.forward_s, format_duration), or_na(time.backward_s, format_duration),
                   or_na(time.optimizer_s, format_duration))},
      {"throughput", fmt::format("{} tokens/s, {} samples/s", or_na(put.tokens_per_s, format_si),
                                 or_na(put.samples_per_s, format_si))},
      {"FLOP/s (achieved)", or_na(r.flops ? r.flops->achieved_per_s : std::nullopt, format_si)},
      {"peak memory (allocator)",
       or_na(memory([](const RunMemory& m) -> std::optional<double> { return m.peak_bytes; }),
             bytes)},
      {"  params / grads / optimizer",
       fmt::format(
           "{} / {} / {}",
           or_na(memory([](const RunMemory& m) -> std::optional<double> { return m.params_bytes; }),
                 bytes),
           or_na(r.memory ? r.memory->grads_bytes : std::nullopt, bytes),
           or_na(memory([](const RunMemory& m) -> std::optional<double> {
                   return m.optimizer_state_bytes;
                 }),
                 bytes))},
      {"  activations (peak)",
       or_na(r.memory ? r.memory->activations_peak_bytes : std::nullopt, bytes)},
      {"  logits (loss head)", or_na(r.memory ? r.memory->logits_bytes : std::nullopt, bytes)},
      {"peak RSS", or_na(r.memory ? r.memory->peak_rss_bytes : std::nullopt, bytes)},
      {"utilization (mean)",
       fmt::format("{} ({})", or_na(r.utilization ? r.utilization->mean_pct : std::nullopt, pct),
                   r.utilization ? r.utilization->device : "")},
      {"threads",
       fmt::format(
           "{} intra-op, {} BLAS",
           or_na(r.env ? std::optional<double>(r.env->threads) : std::nullopt, count),
           or_na(r.env ? std::optional<double>(r.env->blas_threads) : std::nullopt, count))},
  };
  if (r.contention) {  // what competed for the cores over the timed steps
    const RunContention& k = *r.contention;
    rows.push_back(
        {"competing for cores",
         fmt::format("{} other runnable tasks (mean), {} involuntary switches/s, steal {}",
                     or_na(k.competing_tasks_mean, fixed2),
                     or_na(k.involuntary_switches_per_s, count),
                     or_na(k.steal_pct, [](double v) { return fmt::format("{:.1f}%", v); }))});
    if (k.disturbed)
      rows.push_back({"timings", "DISTURBED, left out of a report's time comparisons: " +
                                     k.reasons.front()});
  }
  if (r.distributed) {
    // After the memory rows (peak RSS), before utilization.
    const auto at = std::find_if(rows.begin(), rows.end(),
                                 [](const auto& row) { return row.first == "peak RSS"; });
    const auto more = distributed_rows(r);
    rows.insert(at == rows.end() ? at : at + 1, more.begin(), more.end());
  }
  if (r.final_accuracy)  // classifiers only
    rows.insert(rows.begin() + 7,
                {"final val accuracy", fmt::format("{:.1f}%", 100.0 * *r.final_accuracy)});
  rows.insert(rows.end(), extra.begin(), extra.end());
  if (r.failure)
    rows.push_back({"failure", fmt::format("step {}{}: {}", r.failure->step.value_or(0),
                                           r.failure->phase ? " (" + *r.failure->phase + ")" : "",
                                           r.failure->message)});
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  std::string out;
  for (const auto& [key, value] : rows) out += fmt::format("  {:<{}}  {}\n", key, width, value);
  return out;
}

}  // namespace gradscope
