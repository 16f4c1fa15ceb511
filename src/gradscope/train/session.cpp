#include "gradscope/train/session.h"

#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/core/rng.h"
#include "gradscope/core/settings.h"
#include "gradscope/core/tensors.h"
#include "gradscope/data/tokenizer.h"
#include "gradscope/measure/memory.h"
#include "gradscope/measure/peak.h"
#include "gradscope/models/common/arch.h"
#include "gradscope/models/common/layers.h"
#include "gradscope/optim/factory.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/train/estimate.h"
#include "gradscope/train/rank_meeting.h"
#include "gradscope/train/train_state.h"
#include "gradscope/train/weights_io.h"

namespace gradscope {
namespace {

// The stream of the default generator's seed (dropout), apart from the data's streams.
constexpr uint64_t kDropoutStream = 0xd50;
// The stream of the LoRA adapters' initial A matrices, apart from the weights' and the data's.
constexpr uint64_t kLoraStream = 0x10a;

}  // namespace

nlohmann::json resolve_arch(const RunConfig& config) {
  const ModelFamily& family = model_registry().get(config.model);
  nlohmann::json arch = family.preset(config.preset);
  // An --init-from folder's config.json gives the architecture; --arch overrides still apply
  // (a shape they change is then refused by the weights' shapes).
  std::optional<InitSource> init;
  if (!config.init_from.empty()) {
    check_usage(family.kind != ModelKind::kToy,
                "toy problem '" + config.model + "' takes no --init-from",
                "a toy problem starts from its own fixed point; leave --init-from out");
    init = read_init_source(config.init_from);
    arch = apply_init_config(config.model, *init, arch);
  }
  if (family.kind == ModelKind::kToy)
    check_usage(config.tokenizer.empty() && config.dataset.empty() && !config.dropout &&
                    config.seq_len <= 0,
                "toy problem '" + config.model +
                    "' takes no --tokenizer, --dataset, --dropout "
                    "or --seq",
                "set its size with --arch dim=N (and --arch condition=K for the quadratic)");
  apply_arch_overrides(config.model, config.arch_overrides, arch);
  check_arch_limits(arch, "the architecture (--arch)");
  if (family.kind == ModelKind::kImageClassification)
    check_usage(config.tokenizer.empty() && config.seq_len <= 0,
                "model '" + config.model + "' reads images: it takes no --tokenizer or --seq",
                "its tokens are the image's patches: change --arch image_size=N or patch_size=N");
  const std::string preset_tokenizer = arch.value("tokenizer", "");
  // Weights fix the vocabulary: a folder's config.json says it, and the tokenizer must fit.
  const bool vocab_from_weights = init && init->config;
  const bool names_tokenizer = vocab_from_weights && init->config->contains("gradscope") &&
                               (*init->config)["gradscope"].is_object() &&
                               (*init->config)["gradscope"].contains("tokenizer");
  if (!config.tokenizer.empty()) {
    if (!is_tokenizer_file(config.tokenizer))
      tokenizer_registry().get(config.tokenizer);  // validates the name
    arch["tokenizer"] = config.tokenizer;
  } else if (names_tokenizer) {
    // A folder gradscope wrote names its tokenizer in config.json's "gradscope" object (which
    // apply_init_config has read): a registry name, or "tokenizer.json", the copy beside the
    // weights. Nothing else is read from a path a file gives.
    const std::string name = arch.value("tokenizer", "");
    if (is_tokenizer_file(name)) {
      check_usage(name == "tokenizer.json" && !init->tokenizer_json.empty(),
                  "'" + init->config_path + "' names tokenizer '" + name +
                      "', which is not the folder's tokenizer.json",
                  "pass --tokenizer, or put the tokenizer.json beside config.json");
      arch["tokenizer"] = std::filesystem::absolute(init->tokenizer_json).string();
    }
  } else if (vocab_from_weights && arch.contains("tokenizer")) {
    // A published folder of a model that reads text: its own tokenizer.json, and no guessing
    // without one.
    check_usage(!init->tokenizer_json.empty(),
                "folder '" + config.init_from + "' has config.json but no tokenizer.json",
                "pass --tokenizer with the tokenizer the weights were trained with");
    arch["tokenizer"] = std::filesystem::absolute(init->tokenizer_json).string();
  }
  if (arch.contains("tokenizer")) {
    const std::string name = arch["tokenizer"].get<std::string>();
    const int64_t tokens = tokenizer_vocab_size(name);
    const int64_t preset_vocab = arch.value("vocab_size", int64_t{0});
    if (vocab_from_weights) {
      check_usage(preset_vocab >= tokens,
                  fmt::format("tokenizer '{}' has {} ids but the weights of '{}' have a "
                              "vocabulary of {}",
                              name, tokens, config.init_from, preset_vocab),
                  "pass the --tokenizer the weights were trained with");
    } else {
      const bool keep = arch["tokenizer"] == preset_tokenizer && preset_vocab >= tokens;
      if (!keep) arch["vocab_size"] = padded_vocab(tokens);
    }
  }
  if (config.seq_len > 0) arch["seq_len"] = config.seq_len;
  if (!config.dataset.empty()) arch["dataset"] = config.dataset;
  if (config.dropout) {
    check_usage(*config.dropout >= 0 && *config.dropout < 1,
                fmt::format("dropout {} must lie in [0, 1)", *config.dropout),
                "pass --dropout 0 to turn dropout off, or a probability below 1");
    arch["hidden_dropout"] = *config.dropout;
    arch["attention_dropout"] = *config.dropout;
  }
  if (family.finalize) family.finalize(arch);
  // The weights must be what the architecture describes, checked from their headers before
  // anything of the architecture's sizes is built.
  if (init) check_init_weights(config.model, arch, *init);
  return arch;
}

double learning_rate_of(const RunConfig& config) {
  return config.lr > 0 ? config.lr : default_lr(config.optimizer, config.model);
}

void seed_dropout(const RunConfig& config, int rank) {
  torch::manual_seed(hash3(config.seed, kDropoutStream, static_cast<uint64_t>(rank)));
}

// A step holds all its micro-batches on the host before the first forward (Strategy), each
// at least a token id and its target per position (16 bytes). A batch and accumulation count
// whose step needs more bytes than a 64-bit process can address (2^47, the user address space
// of x86-64 and AArch64 Linux) cannot be sized on any machine: refused before the run. Counted
// in a double, which overflows no product of these flags.
namespace {
void check_step_buffers(const RunConfig& c) {
  constexpr double kAddressable = 140737488355328.0;  // 2^47 bytes, 128 TiB
  const double bytes = static_cast<double>(c.batch) * static_cast<double>(c.accum_steps) *
                       static_cast<double>(c.seq_len) * 16.0;
  check_usage(bytes <= kAddressable,
              fmt::format("--batch {} x --accum-steps {} x {} positions would need {} for one "
                          "step's token ids and targets alone, more than a process can address "
                          "(128 TiB)",
                          c.batch, c.accum_steps, c.seq_len, format_bytes(bytes)),
              "pass a smaller --batch or --accum-steps; `gradscope estimate --memory-budget "
              "BYTES --max-batch` finds the largest batch that fits");
}
// The parameters are allocated under the cap as the model is built: a cap below their bytes
// (the estimate's params_bytes, of the whole model: every rank builds it whole before any
// sharding) could never hold the model, which is bad input, not a run that ran out of memory.
// A configuration the estimate has no model of is left to the build.
void check_cap_holds_parameters(const RunConfig& given, int64_t cap_bytes) {
  RunConfig whole = given;
  whole.set_ranks_on_one_host(1);
  whole.shard = Shard::kNone;
  int64_t params_bytes = 0;
  try {
    params_bytes = estimate_run(whole, 0).params_bytes;
  } catch (const std::exception&) {
    return;
  }
  check_usage(cap_bytes >= params_bytes,
              fmt::format("--memory-cap {} is below the {} that {}'s parameters alone need",
                          format_bytes(static_cast<double>(cap_bytes)),
                          format_bytes(static_cast<double>(params_bytes)), given.model),
              fmt::format("pass at least --memory-cap {}B; `gradscope estimate` gives the "
                          "whole peak",
                          params_bytes));
}
}  // namespace

ResolvedRun resolve_run(const RunConfig& config) {
  check_config(config);
  ResolvedRun r;
  r.given = config;
  r.arch = resolve_arch(config);
  check_usage(r.arch.at("seq_len").get<int64_t>() > 0, "sequence length must be positive",
              "pass --seq with a value of at least 1");
  r.config = config;
  r.config.lr = learning_rate_of(config);  // validates the optimizer's name
  // The --opt names, before anything is built (their values are checked as the optimizer is):
  // a sweep refuses a run with an unknown setting when it plans it, not when it starts it.
  OptReader(config.optimizer, config.opt, optimizer_registry().get(config.optimizer).keys);
  r.config.seq_len = r.arch.at("seq_len").get<int64_t>();
  check_step_buffers(r.config);
  r.config.dataset = r.arch.value("dataset", "");
  r.config.tokenizer = r.arch.value("tokenizer", "");
  nlohmann::json canonical = canonical_config_json(config);
  canonical["arch"] = r.arch;
  r.run_id = run_id_of(canonical);
  return r;
}

std::string run_id_for(const RunConfig& config) { return resolve_run(config).run_id; }

Session::Session(const RunConfig& config, const SessionOptions& options)
    : resolved_(resolve_run(config)), device_(torch::kCPU) {
  const RunConfig& c = resolved_.config;
  family_ = &model_registry().get(c.model);
  const StepPlan plan = c.step_plan();
  device_ = parse_device(c.device);
  // Ranks on CUDA take a device each, by their local rank (torchrun's convention).
  if (device_.is_cuda() && !device_.has_index() && c.nproc > 1 && !options.comm)
    if (const std::optional<RankEnv> env = rank_env_from_environment())
      device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env->local_rank));
  check_usage(c.memory_snapshot.empty() || memory_snapshot_supported(device_),
              "--memory-snapshot on " + device_.str() + " needs a CUDA build of gradscope",
              "leave --memory-snapshot out, or use --device cpu");
  check_usage(c.memory_timeline.empty() || device_.is_cpu(),
              "--memory-timeline needs --device cpu",
              "on CUDA, --memory-snapshot writes the caching allocator's history");
  if (!c.memory_timeline.empty() || !c.memory_snapshot.empty()) memory_window_steps(c);
  // Checked here, on the machine that runs, not with the settings: a sweep planned (or a Slurm
  // job emitted) on one machine runs on another.
  if (c.threads > 0) check_threads_here(c.threads);
  if (c.threads > 0) process_.set_threads(c.threads);
  process_.set_attention(c.attention);
  lr_ = c.lr;
  if (!c.save_weights.empty()) {
    check_usage(family_->kind != ModelKind::kToy,
                "toy problem '" + c.model + "' has no weights to save", "leave --save-weights out");
    check_weights_folder(c.save_weights, c.save_adapters);
    // Saving over the weights a run started from would replace them (in a Hugging Face cache,
    // the shared files its links point at).
    std::error_code ec;
    check_usage(
        c.init_from.empty() || !std::filesystem::equivalent(c.init_from, c.save_weights, ec),
        "--save-weights '" + c.save_weights + "' is the --init-from folder",
        "save the trained weights to a folder of their own");
    check_usage(c.init_adapters.empty() ||
                    !std::filesystem::equivalent(c.init_adapters, c.save_weights, ec),
                "--save-weights '" + c.save_weights + "' is the --init-adapters folder",
                "save the trained adapters to a folder of their own");
  }

  if (options.data) {
    data_ = options.data;
  } else {
    // What the data set keeps in the device's memory (CPU runs), for the estimate.
    data_ =
        make_data_source(*family_, resolved_.arch, c, device_.is_cpu() ? &data_bytes_ : nullptr);
  }

  if (c.memory_cap_bytes > 0) {
    check_cap_holds_parameters(resolved_.given, c.memory_cap_bytes);
    process_.set_memory_cap(device_, c.memory_cap_bytes);
  }
  build_model();
  if (c.lora()) add_lora_adapters();
  check_usage(plan.loss == LossKind::kFull || model_->has_lm_head(),
              fmt::format("--loss chunked needs a language-model head, and {} has none", c.model),
              "use --loss chunked with llama, nanovlm or modernbert, or leave --loss out");
  model_->set_packed_projections(c.projections == Projections::kPacked);
  model_->to(device_);
  model_->train();
  // Frozen parameters (the base under LoRA) get no gradient and no optimizer state.
  std::vector<torch::Tensor> frozen;
  for (const auto& item : model_->named_parameters()) {
    params_ += item.value().numel();
    if (!item.value().requires_grad()) {
      frozen.push_back(item.value());
      continue;
    }
    parameters_.push_back(item.value());
    parameter_names_.push_back(item.key());
    trainable_params_ += item.value().numel();
  }
  frozen_params_bytes_ = tensors_bytes(frozen);  // shared storage counted once
  check_shard(plan, c.shard, c.optimizer);
  // The ranks meet last, once this one has refused what it would refuse: a rank that stops
  // on bad input stops before the others wait for it.
  meet_ranks(options);
  strategy_ = std::make_unique<Strategy>(plan);
  strategy_->attach(*model_);
  strategy_->set_communicator(comm_);
  if (options.updater) build_updater();
}

// The model from its architecture and seed, then the --init-from weights.
void Session::build_model() {
  const RunConfig& c = resolved_.config;
  try {
    model_ = family_->build(resolved_.arch, c.seed);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    // A model the estimate has no figures for (a toy problem) meets the cap here.
    check_usage(c.memory_cap_bytes <= 0 || what.find("memory cap") == std::string::npos,
                fmt::format("--memory-cap {} is too small to build {}'s parameters",
                            format_bytes(static_cast<double>(c.memory_cap_bytes)), c.model),
                "pass a larger --memory-cap (`gradscope estimate` gives the parameters' bytes)");
    fail_usage(
        "cannot build " + c.model + " from its architecture: " + what.substr(0, what.find('\n')),
        "check the --arch overrides against the preset (`gradscope list --json`)");
  }
  if (!c.init_from.empty()) load_init_weights(c.model, *model_, read_init_source(c.init_from));
}

// LoRA's adapters on the --lora-targets projections (the base frozen).
void Session::add_lora_adapters() {
  const RunConfig& c = resolved_.config;
  // Optimizers that pick the blocks' weight matrices by name for their own update give every
  // other parameter AdamW: under LoRA no such matrix trains, so they would be AdamW alone.
  check_usage(!optimizer_registry().get(c.optimizer).updates_block_matrices,
              "optimizer '" + c.optimizer +
                  "' updates the blocks' weight matrices its own way and the rest with "
                  "AdamW; with --lora-targets those matrices are frozen, so it would be "
                  "AdamW alone",
              "use adamw or adam with LoRA, or train without --lora-targets");
  check_usage(family_->kind != ModelKind::kToy,
              "toy problem '" + c.model + "' has no projections to adapt",
              "leave --lora-targets out");
  LoraOptions& lora = lora_options_;
  lora.targets = c.lora_targets;
  lora.rank = c.lora_rank;
  lora.alpha = c.lora_alpha;
  lora.dropout = c.lora_dropout;
  auto gen = at::detail::createCPUGenerator(hash3(c.seed, kLoraStream, 0));
  std::vector<std::string> adapted;
  try {
    adapted = model_->add_lora(lora, gen);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    fail_usage("cannot add LoRA adapters to " + c.model + ": " + what.substr(0, what.find('\n')),
               "check --lora-rank against the model's widths");
  }
  std::string names;
  for (const auto& t : c.lora_targets) names += (names.empty() ? "" : ",") + t;
  check_usage(!adapted.empty(),
              c.model + " has no projection that --lora-targets " + names + " names",
              "name projections the model has (docs/lora.md lists them per model)");
  if (!c.init_adapters.empty()) load_init_adapters(c.model, *model_, lora, c.init_adapters);
}

// The collectives with the other ranks: the given ones, the launcher's, or a single rank's
// for --shard alone.
void Session::meet_ranks(const SessionOptions& options) {
  const RunConfig& c = resolved_.config;
  if (options.comm) {
    comm_ = options.comm;
  } else if (c.nproc > 1) {
    const std::optional<RankEnv> env = rank_env_from_environment();
    check_usage(env.has_value(),
                fmt::format("--nproc {} needs its ranks started by gradscope run, torchrun or srun",
                            c.nproc),
                "run `gradscope run --nproc N ...` (it starts the ranks), or start each rank "
                "with torchrun or srun (docs/distributed.md)");
    check_usage(
        env->world == c.nproc,
        fmt::format("--nproc {} but {} started {} ranks", c.nproc, env->launcher, env->world),
        "pass --nproc equal to the launcher's number of ranks");
    RankEnv meeting = *env;
    if (!c.ifname.empty()) meeting.ifname = c.ifname;
    comm_ = connect_ranks(meeting, device_, c.dist_timeout_s);
    launcher_ = env->launcher;
    check_same_run(*comm_, c);
    if (comm_->rank() == 0 && comm_->host_count() != c.nnodes)
      log_warn("the ranks are on {} hosts (by their host names) but --nnodes is {}: the run id "
               "and the record's config say {}, distributed.nnodes says {}",
               comm_->host_count(), c.nnodes, c.nnodes, comm_->host_count());
    link_ = probe_hosts_link(*comm_);
  } else if (c.shard != Shard::kNone) {
    comm_ = single_rank_communicator();
    launcher_ = "single";
  }
}

void ProcessSettings::set_threads(int threads) {
  if (!threads_set_) {
    threads_before_ = at::get_num_threads();
    threads_set_ = true;
  }
  at::set_num_threads(threads);
}

void ProcessSettings::set_attention(Attention attention) {
  if (!attention_set_) attention_before_ = attention_path();
  attention_set_ = true;
  set_attention_path(attention);
}

void ProcessSettings::set_memory_cap(const torch::Device& device, int64_t cap_bytes) {
  if (device.is_cpu()) {
    auto& tracker = CpuMemoryTracker::install();
    if (!cap_set_) cap_before_ = tracker.cap_bytes();
    tracker.set_cap(cap_bytes);
  } else {
    set_cuda_memory_cap(device, cap_bytes);
  }
  cap_set_ = true;
  cap_device_ = device;
}

ProcessSettings::~ProcessSettings() {
  if (attention_set_) set_attention_path(attention_before_);
  if (cap_set_) {
    if (cap_device_.is_cpu())
      CpuMemoryTracker::install().set_cap(cap_before_);
    else
      clear_cuda_memory_cap(cap_device_);
  }
  if (threads_set_) {
    at::set_num_threads(threads_before_);
  }
}

void Session::build_updater() {
  const RunConfig& c = resolved_.config;
  OptimizerSpec spec{c.optimizer, lr_, c.weight_decay, c.opt, parameter_names_};
  const auto heads = attention_head_sizes(*model_);
  for (const auto& name : parameter_names_) {
    auto it = heads.find(name);
    spec.param_head_sizes.push_back(it == heads.end() ? 0 : it->second);
  }
  UpdaterOptions options;
  options.clip_grad_norm = c.clip_grad_norm;
  options.log_grad_norm = c.log_grad_norm;
  if (c.shard != Shard::kNone)
    updater_ = make_sharded_updater(strategy_->plan(), c.shard, parameters_, spec, options,
                                    comm_ ? comm_ : single_rank_communicator(), c.bucket_bytes,
                                    model_.get(), c.grad_reduce);
  else
    updater_ = make_updater(strategy_->plan(), parameters_, spec, options);
  strategy_->set_micro_batch_listener(updater_->micro_batch_listener());
}

void Session::use_rank_state_folders() {
  if (world() <= 1) return;
  RunConfig& c = resolved_.config;
  if (!c.save_state.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c.save_state, ec);
    c.save_state = rank_state_folder(c.save_state, world(), rank());
  }
  if (!c.resume.empty()) c.resume = rank_state_folder(c.resume, world(), rank());
}

void Session::use_learning_rate(double lr) {
  check_usage(std::isfinite(lr) && lr > 0, fmt::format("learning rate {} must be > 0", lr),
              "pass a positive --lr");
  // The schedule hands the updater its rate before every step, so nothing else changes.
  lr_ = lr;
  resolved_.config.lr = lr;
}

MicroBatchSource Session::step_batches(int64_t step) const {
  const int64_t micro = resolved_.config.batch;
  const int64_t first = step * resolved_.config.effective_batch() * world();
  const int64_t world_micro = micro * world(), mine = micro * rank();
  const DataSource* data = data_.get();
  const torch::Device device = device_;
  // Host batches; the strategy moves each to the device just before its forward.
  return MicroBatchSource(
      [data, first, micro, world_micro, mine](int64_t index) {
        return data->train_batch(first + index * world_micro + mine, micro);
      },
      [device](const Batch& host) { return host.to(device); });
}

}  // namespace gradscope
