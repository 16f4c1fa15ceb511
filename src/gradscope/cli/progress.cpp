#include "gradscope/cli/progress.h"

#include <chrono>
#include <cmath>

#include <fmt/format.h>

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

  void on_start(const RunRecord& record, int64_t total_steps) override {
    const RunConfig& c = record.config;
    fmt::print(out_, "training {} ({}) with {} / {}: {} steps, batch {} x {}, seq {}\n", c.model,
               c.preset, c.optimizer, c.strategy_label(), total_steps, c.batch, c.accum_steps,
               c.seq_len);
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

}  // namespace

std::unique_ptr<ProgressSink> make_console_progress(FILE* out, bool is_terminal,
                                                    double interval_s) {
  return std::make_unique<ConsoleProgress>(out, is_terminal, interval_s);
}

}  // namespace gradscope
