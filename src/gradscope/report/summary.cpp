#include "gradscope/report/summary.h"

#include <functional>
#include <optional>

#include <fmt/format.h>

#include "gradscope/core/env.h"

namespace gradscope {
namespace {

template <typename T>
std::string or_na(const std::optional<T>& v, const std::function<std::string(double)>& f) {
  return v ? f(static_cast<double>(*v)) : "n/a";
}

}  // namespace

std::string summary_table(const RunRecord& r,
                          const std::vector<std::pair<std::string, std::string>>& extra) {
  const RunConfig& c = r.config;
  const auto bytes = [](double v) { return format_bytes(v); };
  const auto fixed4 = [](double v) { return fmt::format("{:.4f}", v); };
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
