// What one configuration needs to take a step, built in one place: the trainer, `verify` and
// `--lr auto` (whose trials are trainers) all assemble a run here, so the default learning
// rate, the resolved architecture, the dropout stream and the order in which things are built
// cannot differ between them.
//
// Bad usage or input is refused (a usage error) before anything is written: settings first,
// then the names (model, optimizer, strategy), the architecture, the data and the model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"
#include "gradscope/comm/comm.h"
#include "gradscope/models/registry.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/strategy/updater.h"
#include "gradscope/train/data_source.h"

namespace gradscope {

// A configuration resolved without loading anything: what its record's config says and what
// its run id is, known before the run starts (a sweep plans with it, and writes it into the
// record of a run that ended without one).
struct ResolvedRun {
  RunConfig given;   // as asked; its canonical JSON and `arch` are the run id
  RunConfig config;  // with the defaults resolved: learning rate, sequence length, data set,
                     // tokenizer (what the record's config holds)
  nlohmann::json arch;
  std::string run_id;
};

// Checks the settings (check_config), the model's name and its architecture, and resolves
// them. A usage error names the first problem.
ResolvedRun resolve_run(const RunConfig& config);
// The id of a run: a digest of its canonical configuration and resolved architecture. Known
// without building anything, so a sweep can tell finished runs from pending ones first.
std::string run_id_for(const RunConfig& config);

// The architecture of the run: the preset, with the run's --arch overrides, tokenizer,
// sequence length and dropout applied. The vocabulary is the preset's when it uses the
// preset's own tokenizer and holds its ids (ModernBERT-base's published 50368), else the
// tokenizer's size padded up to a multiple of 64.
nlohmann::json resolve_arch(const RunConfig& config);

// --lr, or the optimizer's default for the model when it is not given (0).
double learning_rate_of(const RunConfig& config);

// Seeds the default generator, which dropout draws from, for the run's seed: every run of the
// same seed draws the same masks, whatever else it does.
// Rank r > 0 of several draws from a stream of its own, so that ranks do not share masks.
void seed_dropout(const RunConfig& config, int rank = 0);

struct SessionOptions {
  // A data source already loaded for this architecture (verify builds several models over
  // one); null = load the configuration's own.
  std::shared_ptr<const DataSource> data;
  // Whether to build the updater (and so the optimizer); verify's gradient checks do not.
  bool updater = true;
  // The ranks of a run with --shard, already met (verify's runs share one meeting); null =
  // meet them here when --nproc asks for several (from the launcher's environment).
  std::shared_ptr<Communicator> comm;
};

// Threads, a memory cap and the attention path set for one run, and put back as they were when it ends (or when
// building the run fails half-way). A CUDA cap is lifted on restore: the caching allocator
// cannot say what it was before.
class ProcessSettings {
 public:
  ProcessSettings() = default;
  ~ProcessSettings();
  ProcessSettings(const ProcessSettings&) = delete;
  ProcessSettings& operator=(const ProcessSettings&) = delete;
  void set_threads(int threads);
  void set_memory_cap(const torch::Device& device, int64_t cap_bytes);
  void set_attention(Attention attention);

 private:
  bool threads_set_ = false, cap_set_ = false, attention_set_ = false;
  Attention attention_before_ = Attention::kAuto;
  int threads_before_ = 0;
  int64_t cap_before_ = 0;
  torch::Device cap_device_ = torch::kCPU;
};

class Session {
 public:
  // Builds everything; a usage error (before anything is written) for bad settings or input.
  // Process-wide settings the run asks for (threads, a memory cap) hold until it is destroyed.
  explicit Session(const RunConfig& config, const SessionOptions& options = {});
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const ResolvedRun& resolved() const { return resolved_; }
  const RunConfig& config() const { return resolved_.config; }
  const nlohmann::json& arch() const { return resolved_.arch; }
  const ModelFamily& family() const { return *family_; }
  const torch::Device& device() const { return device_; }
  const DataSource& data() const { return *data_; }
  // What the data set keeps in the device's memory (CPU runs, when it was loaded here).
  int64_t data_bytes() const { return data_bytes_; }
  Model& model() { return *model_; }
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }
  int64_t params() const { return params_; }  // every parameter's elements, frozen included
  // The parameters that train (all but those LoRA freezes): parameters() holds them.
  int64_t trainable_params() const { return trainable_params_; }
  int64_t frozen_params_bytes() const { return frozen_params_bytes_; }
  // The adapters' settings (empty targets without LoRA).
  const LoraOptions& lora_options() const { return lora_options_; }
  const Strategy& strategy() const { return *strategy_; }
  // Null when built without one (SessionOptions::updater).
  Updater* updater() { return updater_.get(); }
  double lr() const { return lr_; }
  // The ranks the run shares its steps with (null for one process without --shard).
  const std::shared_ptr<Communicator>& communicator() const { return comm_; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int world() const { return comm_ ? comm_->world() : 1; }
  // How the ranks were started ("" for one process).
  const std::string& launcher() const { return launcher_; }
  // The link between the ranks' hosts, measured when they met; nullopt on one host.
  const std::optional<LinkProbe>& link() const { return link_; }

  // With several ranks each keeps its own training state: --save-state DIR and --resume DIR
  // become DIR/rank-R (every rank's shard of the optimizer state and its dropout stream).
  void use_rank_state_folders();

  // Trains with this learning rate instead (what --lr auto found); the schedule scales it as
  // usual. A usage error unless it is positive.
  void use_learning_rate(double lr);

  // The micro-batch source of step `step` (0-based, warm-up included): the step trains on
  // samples [step * E, (step + 1) * E) of the data stream, E the global batch; with N ranks,
  // micro-batch i of rank r is samples [i N b + r b, i N b + (r + 1) b) of them, b the
  // micro-batch, so the ranks together read micro-batch i of one process of batch N b. Its
  // batches come on the host and are moved to the run's device one at a time, as the
  // strategy reaches them.
  MicroBatchSource step_batches(int64_t step) const;

 private:
  void build_model();
  void add_lora_adapters();
  void meet_ranks(const SessionOptions& options);
  void build_updater();

  ProcessSettings process_;  // first: restored last, after everything built under it
  ResolvedRun resolved_;
  const ModelFamily* family_ = nullptr;
  torch::Device device_;
  std::shared_ptr<const DataSource> data_;
  int64_t data_bytes_ = 0;
  std::shared_ptr<Model> model_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::string> parameter_names_;  // of parameters_, as the model names them
  int64_t params_ = 0;
  int64_t trainable_params_ = 0;
  int64_t frozen_params_bytes_ = 0;
  LoraOptions lora_options_;
  std::shared_ptr<Communicator> comm_;
  std::string launcher_;
  std::optional<LinkProbe> link_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<Updater> updater_;
  double lr_ = 0;
};

}  // namespace gradscope
