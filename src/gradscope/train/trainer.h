// One training run, measured end to end. The trainer owns the clock: it times every phase of
// every optimizer step (with a device synchronize before each read), tracks memory per phase
// and writes the run record. Strategies compute gradients; optimizers update; models and data
// know nothing of either.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"
#include "gradscope/models/registry.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/train/data_source.h"

namespace gradscope {

class MemoryMeter;
class Database;

// Told about progress as the run goes; the console implements it.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  virtual void on_start(const nlohmann::json& config, int64_t total_steps) {}
  // `step` counts from 1 over all steps (warm-up included).
  virtual void on_step(int64_t step, int64_t total_steps, double loss, double tokens_per_s,
                       double elapsed_s) {}
  virtual void on_eval(int64_t step, double val_loss) {}
  virtual void on_finish(const nlohmann::json& record) {}
};

class Trainer {
 public:
  // Resolves the configuration, loads data, builds the model, strategy and optimizer.
  // Bad usage or input throws a usage error here, before anything is written.
  explicit Trainer(RunConfig config);
  ~Trainer();

  // Trains and returns the run record. A failure during training (oom, divergence, timeout,
  // an error) does not throw: it is the record's status, with the step and phase it hit.
  nlohmann::json run(ProgressSink* progress = nullptr);

  // Trains with this learning rate instead of the configured one (what --lr auto found); the
  // schedule scales it as usual. A usage error unless it is positive.
  void use_learning_rate(double lr);

  const nlohmann::json& arch() const { return arch_; }
  const RunConfig& config() const { return config_; }
  int64_t params() const { return params_; }
  Model& model() { return *model_; }

 private:
  double lr_at(int64_t step) const;  // step counts from 0 over all steps
  struct Evaluation {
    double val_loss = 0;
    std::optional<double> accuracy;  // classifiers only
  };
  Evaluation evaluate();

  RunConfig config_;
  nlohmann::json arch_;
  const ModelFamily* family_ = nullptr;
  torch::Device device_;
  std::unique_ptr<DataSource> data_;
  std::shared_ptr<Model> model_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<MemoryMeter> meter_;
  int64_t params_ = 0;
  int64_t data_bytes_ = 0;  // what the data set holds in the tracked memory
  double lr_ = 0;
  bool steps_with_closure_ = false;  // the optimizer evaluates the step's batch itself
};

// The id of a run (DESIGN.md, "Run record"): a digest of its canonical configuration and
// resolved architecture. Known without building anything, so a sweep can tell finished runs
// from pending ones before it starts any.
std::string run_id_for(const RunConfig& config);

// Fills the record's flops.peak_per_s, peak_source, mfu and hfu: the device's peak FLOP/s for
// the run's dtype from the datasheet table, else from the newest `gradscope probe` of this
// host, device and thread count in `db` (may be null), else "unknown" with nulls.
void apply_device_peak(nlohmann::json& record, Database* db);

// Loss-curve helpers the record uses.
double median(std::vector<double> values);
double percentile(std::vector<double> values, double pct);

}  // namespace gradscope
