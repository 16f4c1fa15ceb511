// One training run, measured end to end. The trainer owns the clock: it times every phase of
// every optimizer step (with a device synchronize before each read), tracks memory per phase
// and writes the run record. The session (session.h) builds what a step needs; the strategy
// computes gradients and the updater applies them; models and data know nothing of either.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"
#include "gradscope/core/record.h"
#include "gradscope/measure/memory.h"
#include "gradscope/train/eval.h"
#include "gradscope/train/session.h"
#include "gradscope/train/train_state.h"

namespace gradscope {

class MemoryMeter;
class PhaseTimer;
class RunSensors;
struct RunTally;
struct ShardFigures;
struct UpdateResult;

// Told about progress as the run goes; the console implements it.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // `record` holds the run's identity and configuration.
  virtual void on_start(const RunRecord& record, int64_t total_steps) {}
  // `step` counts from 1 over all steps (warm-up included).
  virtual void on_step(int64_t step, int64_t total_steps, double loss, double tokens_per_s,
                       double elapsed_s) {}
  virtual void on_eval(int64_t step, double val_loss) {}
  virtual void on_finish(const RunRecord& record) {}
};

class Trainer {
 public:
  // Resolves the configuration, loads data, builds the model, strategy and updater (session.h).
  // Bad usage or input throws a usage error here, before anything is written.
  explicit Trainer(const RunConfig& config);
  // The same over a data source already loaded (options.data): --lr auto's trials share one
  // source of its search split.
  Trainer(const RunConfig& config, const SessionOptions& options)
      : session_(std::make_unique<Session>(config, options)),
        meter_(make_memory_meter(session_->device())) {
    check_state_settings();
  }
  ~Trainer();

  // Trains and returns the run record (without the attempt's identity and times, which the
  // caller adds when it stores it). A failure during training (oom, divergence, timeout, an
  // error) does not throw: it is the record's status, with the step and phase it hit.
  RunRecord run(ProgressSink* progress = nullptr);

  // Trains with this learning rate instead of the configured one (what --lr auto found); the
  // schedule scales it as usual. A usage error unless it is positive.
  void use_learning_rate(double lr) { session_->use_learning_rate(lr); }
  // The trials of --lr auto, for the record (and for the training state, so that a resumed
  // run's record has them too).
  void set_lr_search(std::vector<LrTrial> trials) { lr_search_ = std::move(trials); }
  // With --resume: the state the run continues from (read and checked on construction).
  const std::optional<TrainStateInfo>& resumed_state() const { return resume_; }

  const nlohmann::json& arch() const { return session_->arch(); }
  // The configuration with its defaults resolved (learning rate, sequence length, data set).
  const RunConfig& config() const { return session_->config(); }
  int64_t params() const { return session_->params(); }
  Model& model() { return session_->model(); }
  // Why --save-weights could not write the weights at the end of the last run() ("" when it
  // did, or was not asked to).
  const std::string& save_error() const { return save_error_; }

 private:
  // Checks --save-state, --state-every and --resume before anything is written: a usage
  // error for a folder that cannot take a state, or a state of other settings.
  void check_state_settings();
  double lr_at(int64_t step) const;  // step counts from 0 over all steps
  Evaluation evaluate();

  // The parts of run(), each over the loop's state (trainer.cpp).
  struct Loop;
  // --resume: the weights, optimizer state, generators, tally and clocks the state holds.
  void restore_state(Loop& loop);
  // With several ranks: a usage error unless every rank resumes from `first_step`.
  void check_ranks_resume_together(int64_t first_step);
  // One optimizer step, timed and measured, into the tally; returns its loss.
  double train_step(Loop& loop, int64_t step);
  // A timed step's time, throughput, utilization, phases and timeline entry.
  void tally_timed_step(Loop& loop, int64_t step, double step_s, double step_cpu,
                        const UpdateResult& result);
  // An evaluation after `done` steps, its peak left out of training's.
  void evaluate_at(Loop& loop, int64_t done);
  // Whether the time limit is reached (with several ranks, by any; they also agree on a stop).
  bool out_of_time(Loop& loop);
  // --save-state after `done` steps; save_state_or_warn goes on when the save fails.
  void save_state(Loop& loop, int64_t done);
  void save_state_or_warn(Loop& loop, int64_t done);
  // The record of a run stopped by a signal after `step` steps (its state saved if asked).
  void record_stop(Loop& loop, int64_t step);
  // The record of a step that threw: oom, an error, or a lost peer (crashed).
  void record_failure(Loop& loop, const std::exception& e, int64_t step);
  // --save-weights once the record is complete (sets save_error_ when the save fails).
  void save_trained_weights(const RunRecord& record);
  // Everything the record says once training ends: steps, evaluations, time, memory,
  // utilization, energy, FLOPs, the estimate and the environment.
  void finish_record(RunRecord& record, RunTally& tally, const PhaseTimer& timer,
                     const RunSensors& sensors, double wall_s, int threads,
                     const CommStats& timed_comm, int64_t timed_run);

  std::unique_ptr<Session> session_;
  std::unique_ptr<MemoryMeter> meter_;
  std::string save_error_;
  std::optional<TrainStateInfo> resume_;
  std::optional<std::vector<LrTrial>> lr_search_;
};

// Fills the record's flops.peak_per_s, peak_source, mfu and hfu: the device's peak FLOP/s for
// the run's dtype from the datasheet table, else from `probe` (the newest `gradscope probe` of
// this host, device and thread count, as the database holds it; null when there is none),
// else "unknown" with nulls.
void apply_device_peak(RunRecord& record, const nlohmann::json& probe = nullptr);

}  // namespace gradscope
