#include "gradscope/report/console.h"

#include <chrono>
#include <cmath>

#include "gradscope/core/env.h"

namespace gradscope {
namespace {

double wall_now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

class ConsoleProgress : public ProgressSink {
 public:
  ConsoleProgress(FILE* out, bool tty, double interval_s)
      : out_(out), tty_(tty), interval_s_(interval_s) {}

  void on_start(const nlohmann::json& config, int64_t total_steps) override {
    fmt::print(out_, "training {} ({}) with {} / {}: {} steps, batch {} x {}, seq {}\n",
               config.value("model", ""), config.value("preset", ""), config.value("optimizer", ""),
               config.value("strategy", ""), total_steps, config.value("batch", 0),
               config.value("accum_steps", 1), config.value("seq_len", 0));
    std::fflush(out_);
    last_print_ = wall_now_s();
  }

  void on_step(int64_t step, int64_t total, double loss, double tokens_per_s,
               double elapsed_s) override {
    if (step == 1) first_step_done_s_ = elapsed_s;
    const double pace = step > 1 ? (elapsed_s - first_step_done_s_) / (step - 1) : elapsed_s;
    const double eta = pace * static_cast<double>(total - step);
    const std::string speed = tokens_per_s > 0 ? format_si(tokens_per_s) : "-";
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(kWidth * step / std::max<int64_t>(total, 1));
      fmt::print(out_, "\r[{}{}] {}/{} loss {:.4f} | {} tok/s | ETA {}   ",
                 std::string(filled, '#'), std::string(kWidth - filled, '.'), step, total, loss,
                 speed, format_duration(eta));
      if (step == total) fmt::print(out_, "\n");
      std::fflush(out_);
      return;
    }
    const double now = wall_now_s();
    if (step == 1 || step == total || now - last_print_ >= interval_s_) {
      fmt::print(out_, "step {}/{} loss {:.4f} tokens/s {} elapsed {} eta {}\n", step, total, loss,
                 speed, format_duration(elapsed_s), format_duration(eta));
      std::fflush(out_);
      last_print_ = now;
    }
  }

  void on_eval(int64_t step, double val_loss) override {
    if (tty_) fmt::print(out_, "\n");
    fmt::print(out_, "eval at step {}: validation loss {:.4f}\n", step, val_loss);
    std::fflush(out_);
  }

 private:
  FILE* out_;
  bool tty_;
  double interval_s_;
  double last_print_ = 0;
  double first_step_done_s_ = 0;
};

// Reads a number at a JSON path, or nullopt when it is absent or null.
std::optional<double> num(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const nlohmann::json* cur = &j;
  for (const char* key : path) {
    if (!cur->is_object() || !cur->contains(key)) return std::nullopt;
    cur = &(*cur)[key];
  }
  if (!cur->is_number()) return std::nullopt;
  return cur->get<double>();
}

std::string or_na(std::optional<double> v, const std::function<std::string(double)>& f) {
  return v ? f(*v) : "n/a";
}

}  // namespace

std::unique_ptr<ProgressSink> make_console_progress(FILE* out, bool is_terminal,
                                                    double interval_s) {
  return std::make_unique<ConsoleProgress>(out, is_terminal, interval_s);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "n/a";
  if (s < 1) return fmt::format("{:.0f}ms", s * 1000);
  if (s < 60) return fmt::format("{:.1f}s", s);
  if (s < 3600)
    return fmt::format("{}m{:02d}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return fmt::format("{}h{:02d}m", static_cast<int>(s) / 3600, static_cast<int>(s) % 3600 / 60);
}

std::string summary_table(const nlohmann::json& r,
                          const std::vector<std::pair<std::string, std::string>>& extra) {
  const auto& c = r.at("config");
  auto bytes = [](double v) { return format_bytes(v); };
  auto fixed4 = [](double v) { return fmt::format("{:.4f}", v); };
  auto pct = [](double v) { return fmt::format("{:.0f}%", v); };
  auto count = [](double v) { return fmt::format("{:.0f}", v); };
  auto pct100 = [](double v) { return fmt::format("{:.1f}%", 100.0 * v); };
  std::vector<std::pair<std::string, std::string>> rows = {
      {"run", r.value("run_id", "")},
      {"status", r.value("status", "")},
      {"model", fmt::format("{} ({}), {} parameters", c.value("model", ""), c.value("preset", ""),
                            format_si(r.value("params", 0.0)))},
      {"optimizer / strategy", fmt::format("{} (lr {:g}) / {}", c.value("optimizer", ""),
                                           c.value("lr", 0.0), c.value("strategy", ""))},
      {"batch x accum x seq", fmt::format("{} x {} x {}", c.value("batch", 0),
                                          c.value("accum_steps", 1), c.value("seq_len", 0))},
      {"final train loss", or_na(num(r, {"final_loss"}), fixed4)},
      {"final val loss", or_na(num(r, {"final_val_loss"}), fixed4)},
      {"timed steps", or_na(num(r, {"time", "timed_steps"}), count)},
      {"step time (median)", or_na(num(r, {"time", "step_median_s"}), format_duration)},
      {"  data / fwd / bwd / opt",
       fmt::format("{} / {} / {} / {}", or_na(num(r, {"time", "data_s"}), format_duration),
                   or_na(num(r, {"time", "forward_s"}), format_duration),
                   or_na(num(r, {"time", "backward_s"}), format_duration),
                   or_na(num(r, {"time", "optimizer_s"}), format_duration))},
      {"throughput", fmt::format("{} tokens/s, {} samples/s",
                                 or_na(num(r, {"throughput", "tokens_per_s"}), format_si),
                                 or_na(num(r, {"throughput", "samples_per_s"}), format_si))},
      {"FLOP/s (achieved)", or_na(num(r, {"flops", "achieved_per_s"}), format_si)},
      {"peak memory (allocator)", or_na(num(r, {"memory", "peak_bytes"}), bytes)},
      {"  params / grads / optimizer",
       fmt::format("{} / {} / {}", or_na(num(r, {"memory", "params_bytes"}), bytes),
                   or_na(num(r, {"memory", "grads_bytes"}), bytes),
                   or_na(num(r, {"memory", "optimizer_state_bytes"}), bytes))},
      {"  activations (peak)", or_na(num(r, {"memory", "activations_peak_bytes"}), bytes)},
      {"peak RSS", or_na(num(r, {"memory", "peak_rss_bytes"}), bytes)},
      {"utilization (mean)", fmt::format("{} ({})", or_na(num(r, {"utilization", "mean_pct"}), pct),
                                         r.at("utilization").value("device", ""))},
      {"threads", fmt::format("{} intra-op, {} BLAS", or_na(num(r, {"env", "threads"}), count),
                              or_na(num(r, {"env", "blas_threads"}), count))},
  };
  if (auto accuracy = num(r, {"final_accuracy"}))  // classifiers only
    rows.insert(rows.begin() + 7, {"final val accuracy", pct100(*accuracy)});
  rows.insert(rows.end(), extra.begin(), extra.end());
  if (r.contains("failure") && r["failure"].is_object())
    rows.push_back({"failure", fmt::format("step {} ({}): {}", r["failure"].value("step", 0),
                                           r["failure"].value("phase", ""),
                                           r["failure"].value("message", ""))});
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  std::string out;
  for (const auto& [key, value] : rows) out += fmt::format("  {:<{}}  {}\n", key, width, value);
  return out;
}

}  // namespace gradscope
