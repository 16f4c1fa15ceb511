#include "gradscope/train/trainer.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cmath>
#include <limits>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/rng.h"
#include "gradscope/measure/clock.h"
#include "gradscope/measure/cpu.h"
#include "gradscope/measure/memory.h"
#include "gradscope/measure/peak.h"
#include "gradscope/measure/sampler.h"
#include "gradscope/measure/sensors.h"
#include "gradscope/models/toy.h"
#include "gradscope/optim/factory.h"
#include "gradscope/store/db.h"
#include "gradscope/train/estimate.h"

namespace gradscope {
namespace {

constexpr uint64_t kDropoutStream = 0xd50;
constexpr int kPhases = static_cast<int>(Phase::kPhaseCount);

void validate(const RunConfig& c) {
  auto positive = [](int64_t v, const char* flag) {
    check_usage(v > 0, fmt::format("{} {} must be positive", flag, v),
                fmt::format("pass {} with a value of at least 1", flag));
  };
  positive(c.steps, "--steps");
  positive(c.batch, "--batch");
  positive(c.accum_steps, "--accum-steps");
  positive(c.eval_batches, "--eval-batches");
  check_usage(c.seq_len >= 0, fmt::format("--seq {} must be positive", c.seq_len),
              "pass --seq with a value of at least 1, or leave it out for the preset's");
  check_usage(c.warmup_steps >= 0, fmt::format("--warmup-steps {} must be >= 0", c.warmup_steps),
              "pass 0 for no untimed warm-up steps");
  check_usage(c.eval_every >= 0, fmt::format("--eval-every {} must be >= 0", c.eval_every),
              "pass 0 to evaluate only at the end");
  check_usage(c.lr >= 0 && std::isfinite(c.lr), fmt::format("--lr {} must be > 0", c.lr),
              "pass a positive learning rate, e.g. --lr 1e-3");
  check_usage(c.clip_grad_norm >= 0,
              fmt::format("--clip-grad-norm {} must be >= 0", c.clip_grad_norm),
              "pass 0 to turn clipping off");
  check_usage(c.lr_schedule == "constant" || c.lr_schedule == "cosine",
              "unknown learning-rate schedule '" + c.lr_schedule + "'",
              "valid schedules: constant, cosine");
  check_usage(c.lr_warmup_steps >= 0,
              fmt::format("--lr-warmup-steps {} must be >= 0", c.lr_warmup_steps),
              "pass 0 for no learning-rate warm-up");
  check_usage(c.dtype == "fp32" || c.dtype == "bf16", "unknown dtype '" + c.dtype + "'",
              "use --dtype fp32, or bf16 for bfloat16 autocast");
  check_usage(c.threads >= 0, fmt::format("--threads {} must be >= 0", c.threads),
              "pass 0 for LibTorch's default");
  check_usage(c.timeout_s >= 0, fmt::format("--timeout {} must be >= 0", c.timeout_s),
              "pass 0 for no time limit");
  check_usage(c.memory_cap_bytes >= 0, "--memory-cap must be positive",
              "write a size such as 512MiB or 8GiB");
}

// bfloat16 autocast over a scope, as torch.autocast does it: ops on the autocast lists
// (matrix multiplications, linear layers) run in bfloat16, numerically sensitive ones
// (softmax, norms, losses) in float32; the parameters stay float32 and the bfloat16 copies of
// weights are cached within the outermost scope and dropped when it ends. A checkpointed
// block recomputed in backward runs inside the same scope, so it casts as its forward did.
class AutocastScope {
 public:
  AutocastScope(const torch::Device& device, bool enabled)
      : enabled_(enabled), type_(device.type()) {
    if (!enabled_) return;
    previous_enabled_ = is_enabled(type_);
    previous_dtype_ = dtype(type_);
    set(type_, true, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(type_, previous_enabled_, previous_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  static bool is_enabled(c10::DeviceType t) { return at::autocast::is_autocast_enabled(t); }
  static at::ScalarType dtype(c10::DeviceType t) { return at::autocast::get_autocast_dtype(t); }
  static void set(c10::DeviceType t, bool on, at::ScalarType type) {
    at::autocast::set_autocast_dtype(t, type);
    at::autocast::set_autocast_enabled(t, on);
  }
#else  // the per-backend functions, deprecated since 2.4
  static bool is_enabled(c10::DeviceType t) {
    return t == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
  }
  static at::ScalarType dtype(c10::DeviceType t) {
    return t == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                      : at::autocast::get_autocast_cpu_dtype();
  }
  static void set(c10::DeviceType t, bool on, at::ScalarType type) {
    if (t == c10::DeviceType::CUDA) {
      at::autocast::set_autocast_gpu_dtype(type);
      at::autocast::set_enabled(on);
    } else {
      at::autocast::set_autocast_cpu_dtype(type);
      at::autocast::set_cpu_enabled(on);
    }
  }
#endif
  bool enabled_;
  c10::DeviceType type_;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

bool is_oom(const std::string& message) {
  return message.find("out of memory") != std::string::npos ||
         message.find("DefaultCPUAllocator: can't allocate") != std::string::npos;
}

// Times phases and tracks the memory peak of each; the strategy announces phase changes.
class PhaseTimer : public PhaseObserver {
 public:
  // enabled false (--no-phase-timing): phases are tracked (for a failure's report) but neither
  // timed nor measured, so the step pays no synchronization or clock read per phase.
  PhaseTimer(const Clock& clock, MemoryMeter& meter, const torch::Device& device, bool enabled)
      : clock_(clock), meter_(meter), device_(device), enabled_(enabled) {}

  void begin_step() {
    seconds_.fill(0);
    current_ = -1;
    forward_start_bytes_ = -1;
    boundaries_ = nlohmann::json::array();
  }
  void enter(Phase phase) override {
    close();
    current_ = static_cast<int>(phase);
    if (!enabled_) return;
    meter_.reset_peak();
    start_bytes_ = meter_.current_bytes();
    // Each forward (one per micro-batch) is measured from its own start, so gradients that
    // an earlier micro-batch's backward left behind are not counted as activations.
    if (phase == Phase::kPhaseForward) forward_start_bytes_ = meter_.current_bytes();
    started_ = clock_.now_s();
  }
  // Ends the running phase (with a device synchronize before the clock read).
  void close() {
    if (current_ < 0) return;
    if (!enabled_) {
      current_ = -1;
      return;
    }
    sync(device_);
    seconds_[current_] += clock_.now_s() - started_;
    phase_peak_[current_] = std::max(phase_peak_[current_], meter_.peak_bytes());
    if (current_ == static_cast<int>(Phase::kPhaseForward) && forward_start_bytes_ >= 0)
      activations_peak_ = std::max(activations_peak_, meter_.peak_bytes() - forward_start_bytes_);
    // The step's memory at its phase boundaries: [phase, bytes at entry, peak, bytes at exit].
    boundaries_.push_back({phase_name(static_cast<Phase>(current_)), start_bytes_,
                           meter_.peak_bytes(), meter_.current_bytes()});
    current_ = -1;
  }
  const nlohmann::json& boundaries() const { return boundaries_; }
  bool enabled() const { return enabled_; }
  Phase current() const { return current_ < 0 ? Phase::kPhaseData : static_cast<Phase>(current_); }
  double seconds(int phase) const { return seconds_[phase]; }
  int64_t phase_peak(int phase) const { return phase_peak_[phase]; }
  int64_t run_peak() const { return *std::max_element(phase_peak_.begin(), phase_peak_.end()); }
  int64_t activations_peak() const { return activations_peak_; }

 private:
  const Clock& clock_;
  MemoryMeter& meter_;
  torch::Device device_;
  std::array<double, kPhases> seconds_{};
  std::array<int64_t, kPhases> phase_peak_{};
  int current_ = -1;
  double started_ = 0;
  int64_t forward_start_bytes_ = -1;
  int64_t activations_peak_ = 0;
  bool enabled_ = true;
  int64_t start_bytes_ = 0;
  nlohmann::json boundaries_ = nlohmann::json::array();
};

double grad_norm(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().norm());
  if (norms.empty()) return 0;
  return torch::stack(norms).norm().item<double>();
}

nlohmann::json null_if_nan(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

std::string run_id_for(const RunConfig& config) {
  nlohmann::json canonical = canonical_config_json(config);
  canonical["arch"] = resolve_arch(config);
  return run_id_of(canonical);
}

double median(std::vector<double> values) { return percentile(std::move(values), 50); }

double percentile(std::vector<double> values, double pct) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  // Linear interpolation between closest ranks.
  const double rank = pct / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

Trainer::Trainer(RunConfig config) : config_(std::move(config)), device_(torch::kCPU) {
  validate(config_);
  family_ = &model_registry().get(config_.model);
  const auto& strategy_entry = strategy_registry().get(config_.strategy);
  const auto& optimizer_entry = optimizer_registry().get(config_.optimizer);
  check_usage(config_.accum_steps == 1 || strategy_entry.uses_micro_batches,
              fmt::format("strategy '{}' computes a step in one batch, got --accum-steps {}",
                          config_.strategy, config_.accum_steps),
              "use --accum-steps 1, or a strategy that accumulates micro-batches");
  device_ = parse_device(config_.device);
  arch_ = resolve_arch(config_);
  check_usage(arch_.at("seq_len").get<int64_t>() > 0, "sequence length must be positive",
              "pass --seq with a value of at least 1");
  if (config_.threads > 0) {
    at::set_num_threads(config_.threads);
    set_blas_threads(config_.threads);
  }
  lr_ = config_.lr > 0 ? config_.lr : default_lr(config_.optimizer, config_.model);

  // What the data set keeps in the device's memory (CPU runs), for the estimate.
  data_ =
      make_data_source(family_->kind, arch_, config_, device_.is_cpu() ? &data_bytes_ : nullptr);
  check_usage(config_.sample_period_s >= 0 && std::isfinite(config_.sample_period_s),
              "--sample-period must be >= 0", "pass 0 to turn the sampler off, e.g. 0.1");
  check_usage(config_.watts_per_core > 0, "--watts-per-core must be positive",
              "pass the power of one busy core in watts, e.g. 10");
  check_usage(config_.grid_g_per_kwh >= 0, "--grid-intensity must be >= 0",
              "pass g CO2 per kWh, e.g. 400, or 0 for no carbon figure");
  check_usage(config_.memory_snapshot.empty() || memory_snapshot_supported(device_),
              "--memory-snapshot needs CUDA and LibTorch >= 2.1",
              "leave --memory-snapshot out, or run on a GPU with a CUDA LibTorch 2.1 or newer");

  meter_ = make_memory_meter(device_);
  if (config_.memory_cap_bytes > 0) {
    if (device_.is_cpu())
      CpuMemoryTracker::install().set_cap(config_.memory_cap_bytes);
    else
      set_cuda_memory_cap(device_, config_.memory_cap_bytes);
  }
  try {
    model_ = family_->build(arch_, config_.seed);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    fail_usage("cannot build " + config_.model +
                   " from its architecture: " + what.substr(0, what.find('\n')),
               "check the --arch overrides against the preset (`gradscope list --json`)");
  }
  model_->to(device_);
  model_->train();
  parameters_ = model_->parameters();
  for (const auto& p : parameters_) params_ += p.numel();
  strategy_ = strategy_entry.make(config_);
  strategy_->attach(*model_);
  // A strategy that steps the optimizer itself (fused) builds it; the loop then has none.
  if (strategy_->steps_optimizer())
    strategy_->attach_optimizer(parameters_, config_, lr_);
  else
    optimizer_ =
        make_optimizer(config_.optimizer, parameters_, lr_, config_.weight_decay, config_.opt);
  steps_with_closure_ = optimizer_ && optimizer_entry.steps_with_closure;
  check_usage(!steps_with_closure_ || config_.clip_grad_norm == 0,
              "optimizer '" + config_.optimizer +
                  "' evaluates its own gradients along its line "
                  "search; --clip-grad-norm cannot apply to them",
              "leave --clip-grad-norm out with " + config_.optimizer);
}

void Trainer::use_learning_rate(double lr) {
  check_usage(std::isfinite(lr) && lr > 0, fmt::format("learning rate {} must be > 0", lr),
              "pass a positive --lr");
  lr_ = lr;
}

Trainer::~Trainer() {
  if (config_.memory_cap_bytes > 0 && device_.is_cpu()) CpuMemoryTracker::install().set_cap(0);
}

double Trainer::lr_at(int64_t step) const {
  if (config_.lr_schedule == "constant") return lr_;
  const int64_t total = config_.warmup_steps + config_.steps;
  const int64_t warm = config_.lr_warmup_steps;
  if (step < warm) return lr_ * static_cast<double>(step + 1) / static_cast<double>(warm);
  const double progress =
      static_cast<double>(step - warm) / static_cast<double>(std::max<int64_t>(1, total - warm));
  return lr_ * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

Trainer::Evaluation Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  AutocastScope autocast(device_, config_.dtype == "bf16");
  model_->eval();
  // --eval-batches counts effective batches, evaluated in micro-batches: every strategy of a
  // comparison sees the same validation samples, whatever its split of the batch.
  const int64_t b = config_.batch;
  const int64_t n = std::min<int64_t>(config_.eval_batches * config_.accum_steps,
                                      std::max<int64_t>(1, data_->val_samples() / b));
  torch::Tensor sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  int64_t count = 0, correct = 0;
  bool classifier = false;
  for (int64_t i = 0; i < n; ++i) {
    Batch batch = data_->val_batch(i * b, b).to(device_);
    LossOutput out = model_->loss(batch);
    sum += out.loss_sum.to(torch::kFloat64);
    count += out.target_count;
    if (out.correct >= 0) {
      classifier = true;
      correct += out.correct;
    }
  }
  model_->train();
  Evaluation e;
  const double denominator = static_cast<double>(std::max<int64_t>(count, 1));
  e.val_loss = sum.item<double>() / denominator;
  if (classifier) e.accuracy = static_cast<double>(correct) / denominator;
  return e;
}

nlohmann::json Trainer::run(ProgressSink* progress) {
  SteadyClock clock;
  const double run_started = clock.now_s();
  const int64_t total_steps = config_.warmup_steps + config_.steps;
  const int64_t effective = config_.effective_batch();
  // Threads that compute: LibTorch's intra-op pool or OpenBLAS's, whichever is larger.
  const int threads = std::max(at::get_num_threads(), blas_threads());
  const int64_t seq_len = arch_.at("seq_len").get<int64_t>();

  nlohmann::json record;
  record["schema"] = "gradscope.run/1";
  record["run_id"] = run_id_for(config_);
  record["config"] = config_to_json(config_);
  record["config"]["lr"] = lr_;
  record["config"]["seq_len"] = seq_len;
  record["config"]["dataset"] = arch_.value("dataset", "");
  record["config"]["tokenizer"] = arch_.value("tokenizer", "");
  record["config"]["arch"] = arch_;
  record["params"] = params_;
  record["data"] = data_->describe();
  if (progress) progress->on_start(record["config"], total_steps);

  // Dropout draws from the default generator, seeded per run.
  torch::manual_seed(hash3(config_.seed, kDropoutStream, 0));

  PhaseTimer timer(clock, *meter_, device_, config_.phase_timing);
  if (!config_.memory_snapshot.empty()) start_memory_history();

  // The sampler thread: utilization, memory, power and energy over the timed steps.
  ProcCpuSensor cpu_sensor;
  std::unique_ptr<GpuSensor> gpu_sensor;
  std::string gpu_why_not = "not a GPU run";
  if (device_.is_cuda())
    gpu_sensor = open_nvml_sensor(device_.has_index() ? device_.index() : 0, &gpu_why_not);
  std::string rapl_why_not;
  std::unique_ptr<EnergyCounter> rapl = device_.is_cpu() ? open_rapl(&rapl_why_not) : nullptr;
  std::unique_ptr<Sampler> sampler;
  if (config_.sample_period_s > 0) {
    SamplerSources sources;
    sources.cpu = &cpu_sensor;
    sources.gpu = gpu_sensor.get();
    sources.rapl = rapl.get();
    MemoryMeter* meter = meter_.get();
    sources.allocated_bytes = [meter] { return meter->current_bytes(); };
    SamplerOptions options;
    options.period_s = config_.sample_period_s;
    options.threads = threads;
    options.watts_per_core = config_.watts_per_core;
    if (config_.grid_g_per_kwh > 0) options.grid_g_per_kwh = config_.grid_g_per_kwh;
    sampler = std::make_unique<Sampler>(sources, options, clock);
  }
  nlohmann::json memory_timeline = nlohmann::json::array();
  const bool bf16 = config_.dtype == "bf16";  // autocast around forward and backward
  meter_->reset_peak();
  nlohmann::json steps = nlohmann::json::array();
  nlohmann::json evals = nlohmann::json::array();
  nlohmann::json timeline = nlohmann::json::array();
  std::vector<double> step_times, step_utils;
  std::array<double, kPhases> phase_totals{};
  double timed_s = 0, timed_samples = 0, timed_tokens = 0;
  int64_t grads_bytes_max = 0, state_bytes = 0;
  int64_t tokens_per_step = 0, timed_evaluations = 0;
  double final_loss = std::numeric_limits<double>::quiet_NaN();
  double timed_cpu_start = 0, timed_wall_start = 0;
  std::string status = "ok";
  nlohmann::json failure = nullptr;
  int64_t step = 0;

  auto maybe_eval = [&](int64_t done) {
    const Evaluation e = evaluate();
    evals.push_back(
        {{"step", done},
         {"val_loss", null_if_nan(e.val_loss)},
         {"accuracy", e.accuracy ? nlohmann::json(*e.accuracy) : nlohmann::json(nullptr)}});
    if (progress) progress->on_eval(done, e.val_loss);
  };

  try {
    for (step = 0; step < total_steps; ++step) {
      const bool timed = step >= config_.warmup_steps;
      if (step == config_.warmup_steps) {
        timed_cpu_start = process_cpu_seconds();
        timed_wall_start = clock.now_s();
        if (sampler) sampler->start();
      }
      const double lr = lr_at(step);
      if (optimizer_)
        set_learning_rate(*optimizer_, lr);
      else
        strategy_->set_learning_rate(lr);
      const double step_cpu0 = process_cpu_seconds();
      sync(device_);
      const double step_t0 = clock.now_s();
      timer.begin_step();

      const int64_t first = step * effective;
      MicroBatchSource next = [&](int64_t micro) {
        return data_->train_batch(first + micro * config_.batch, config_.batch).to(device_);
      };
      StepOutput out;
      // With a fused step the parameters were updated in backward and the gradients freed
      // there: no norm can be taken (recorded as null) and nothing is left to do here.
      double norm = std::numeric_limits<double>::quiet_NaN();
      int64_t evaluations = 0;  // forward and backward passes over the step's batch
      if (steps_with_closure_) {
        // The optimizer evaluates the step's batch itself, first where the step starts (the
        // loss and gradient recorded), then at each trial point of its line search.
        auto closure = [&]() -> torch::Tensor {
          for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
          StepOutput o;
          {
            AutocastScope autocast(device_, bf16);
            o = strategy_->compute_gradients(*model_, config_.accum_steps, next, timer);
          }
          timer.enter(Phase::kPhaseOptimizer);
          if (evaluations++ == 0) {
            out = o;
            grads_bytes_max = std::max(grads_bytes_max, grads_bytes(parameters_));
            norm = grad_norm(parameters_);
          }
          return o.loss_sum / static_cast<double>(std::max<int64_t>(o.target_count, 1));
        };
        optimizer_->step(closure);
      } else {
        {
          AutocastScope autocast(device_, bf16);
          out = strategy_->compute_gradients(*model_, config_.accum_steps, next, timer);
        }
        evaluations = 1;
        timer.enter(Phase::kPhaseOptimizer);
        if (optimizer_) {
          grads_bytes_max = std::max(grads_bytes_max, grads_bytes(parameters_));
          if (config_.clip_grad_norm > 0)
            norm = torch::nn::utils::clip_grad_norm_(parameters_, config_.clip_grad_norm);
          else
            norm = grad_norm(parameters_);
          optimizer_->step();
        }
      }
      if (tokens_per_step == 0) tokens_per_step = out.tokens;
      // Free the gradients (zero_grad zeroes in place on LibTorch 1.13): memory figures then
      // agree across versions and no step carries a gradient buffer into the next.
      for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
      const double loss =
          out.loss_sum.item<double>() / static_cast<double>(std::max<int64_t>(out.target_count, 1));
      timer.close();
      const double step_s = clock.now_s() - step_t0;
      const double step_cpu = process_cpu_seconds() - step_cpu0;
      if (step == 0)
        state_bytes =
            optimizer_ ? optimizer_state_bytes(*optimizer_) : strategy_->optimizer_state_bytes();

      steps.push_back({{"step", step + 1},
                       {"loss", null_if_nan(loss)},
                       {"lr", lr},
                       {"grad_norm", null_if_nan(norm)},
                       {"time_s", step_s},
                       {"samples", out.samples},
                       {"tokens", out.tokens},
                       {"targets", out.target_count},
                       {"evaluations", evaluations},
                       {"warmup", !timed}});
      final_loss = loss;
      if (timed) {
        step_times.push_back(step_s);
        const double util = step_s > 0 ? 100.0 * step_cpu / (step_s * threads) : 0;
        step_utils.push_back(util);
        timed_s += step_s;
        timed_samples += static_cast<double>(out.samples);
        timed_tokens += static_cast<double>(out.tokens);
        timed_evaluations += evaluations;
        for (int p = 0; p < kPhases; ++p) phase_totals[p] += timer.seconds(p);
        if (timer.enabled())
          memory_timeline.push_back({{"step", step + 1}, {"phases", timer.boundaries()}});
        if (!sampler)  // without the sampler, one timeline entry per timed step
          timeline.push_back({{"t_s", clock.now_s() - timed_wall_start},
                              {"allocated_bytes", meter_->current_bytes()},
                              {"util_pct", util},
                              {"power_w", nullptr}});
      }
      if (progress)
        progress->on_step(step + 1, total_steps, loss, timed_s > 0 ? timed_tokens / timed_s : 0,
                          clock.now_s() - run_started);
      if (!std::isfinite(loss)) {
        status = "diverged";
        failure = {{"step", step + 1},
                   {"phase", "forward"},
                   {"message", fmt::format("loss is {} at step {}", loss, step + 1)}};
        ++step;
        break;
      }
      if (config_.eval_every > 0 && (step + 1) % config_.eval_every == 0 && step + 1 < total_steps)
        maybe_eval(step + 1);
      if (config_.timeout_s > 0 && clock.now_s() - run_started > config_.timeout_s) {
        status = "timeout";
        failure = {{"step", step + 1},
                   {"phase", "optimizer"},
                   {"message", fmt::format("time limit of {} s reached", config_.timeout_s)}};
        ++step;
        break;
      }
    }
    if (status == "ok") maybe_eval(total_steps);
  } catch (const std::exception& e) {
    const Phase failed_in = timer.current();
    timer.close();
    const std::string message = e.what();
    const std::string first_line = message.substr(0, message.find('\n'));
    status = is_oom(message) ? "oom" : "error";
    failure = {{"step", step + 1}, {"phase", phase_name(failed_in)}, {"message", first_line}};
    for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
  }

  if (sampler) sampler->stop();
  if (!config_.memory_snapshot.empty()) write_memory_snapshot(config_.memory_snapshot);
  const double timed_cpu = process_cpu_seconds() - timed_cpu_start;
  const double timed_wall = timed_wall_start > 0 ? clock.now_s() - timed_wall_start : 0;
  record["status"] = status;
  record["failure"] = failure;
  record["steps"] = steps;
  record["eval"] = evals;
  record["final_loss"] = null_if_nan(final_loss);
  record["final_val_loss"] = evals.empty() ? nlohmann::json(nullptr) : evals.back()["val_loss"];
  record["final_accuracy"] = evals.empty() ? nlohmann::json(nullptr) : evals.back()["accuracy"];
  record["lr_search"] = nullptr;
  if (auto* toy = dynamic_cast<ToyModel*>(model_.get())) {
    const auto x = toy->point().detach().cpu().contiguous();
    const auto best = toy->minimizer().cpu().contiguous();
    record["final_params"] =
        std::vector<double>(x.data_ptr<double>(), x.data_ptr<double>() + x.numel());
    record["known_minimum"] = {
        {"loss", toy->min_loss()},
        {"params",
         std::vector<double>(best.data_ptr<double>(), best.data_ptr<double>() + best.numel())},
        {"distance", (x - best).norm().item<double>()}};
  }
  // The prediction of `gradscope estimate` for this configuration, beside the measurement.
  try {
    record["estimate"] = estimate_to_json(estimate_run(config_, data_bytes_));
  } catch (const std::exception&) {
    record["estimate"] = nullptr;  // a toy problem, or an optimizer it has no model of
  }

  auto per_s = [&](double amount) {
    return timed_s > 0 ? nlohmann::json(amount / timed_s) : nlohmann::json(nullptr);
  };
  const bool any_timed = !step_times.empty();
  const bool phases_timed = any_timed && config_.phase_timing;
  auto phase_s = [&](int p) {
    return phases_timed ? nlohmann::json(phase_totals[p]) : nlohmann::json(nullptr);
  };
  record["time"] = {{"total_s", any_timed ? nlohmann::json(timed_s) : nlohmann::json(nullptr)},
                    {"wall_s", clock.now_s() - run_started},
                    {"step_median_s", null_if_nan(median(step_times))},
                    {"data_s", phase_s(0)},
                    {"forward_s", phase_s(1)},
                    {"backward_s", phase_s(2)},
                    {"optimizer_s", phase_s(3)},
                    {"timed_steps", static_cast<int64_t>(step_times.size())}};
  record["throughput"] = {{"samples_per_s", per_s(timed_samples)},
                          {"tokens_per_s", per_s(timed_tokens)}};

  const int64_t params_bytes = tensors_bytes(parameters_);
  auto reserved = meter_->reserved_peak_bytes();
  const int64_t peak = std::max(timer.run_peak(), meter_->peak_bytes());
  // The peak by component: what is left after parameters, gradients, optimizer state and
  // activations is "other" (the data set, the batch, temporaries of the update, caches).
  const int64_t grads_part = optimizer_ ? grads_bytes_max : 0;
  const int64_t activations_part = config_.phase_timing ? timer.activations_peak() : 0;
  nlohmann::json breakdown = {
      {"params", params_bytes},
      {"grads", optimizer_ ? nlohmann::json(grads_bytes_max) : nlohmann::json(nullptr)},
      {"optimizer_state", state_bytes},
      {"activations",
       config_.phase_timing ? nlohmann::json(activations_part) : nlohmann::json(nullptr)},
      {"other",
       std::max<int64_t>(0, peak - params_bytes - grads_part - state_bytes - activations_part)}};
  record["memory"] = {
      {"peak_bytes", peak},
      {"breakdown", breakdown},
      {"timeline", memory_timeline},
      {"params_bytes", params_bytes},
      // Not measured with a fused step: each gradient lives only until its parameter's update.
      {"grads_bytes", optimizer_ ? nlohmann::json(grads_bytes_max) : nlohmann::json(nullptr)},
      {"optimizer_state_bytes", state_bytes},
      {"activations_peak_bytes",
       config_.phase_timing ? nlohmann::json(timer.activations_peak()) : nlohmann::json(nullptr)},
      // Not measured without phase timing: null, not 0.
      {"phase_peak_bytes", config_.phase_timing ? nlohmann::json{{"data", timer.phase_peak(0)},
                                                                 {"forward", timer.phase_peak(1)},
                                                                 {"backward", timer.phase_peak(2)},
                                                                 {"optimizer", timer.phase_peak(3)}}
                                                : nlohmann::json(nullptr)},
      {"reserved_peak_bytes", reserved ? nlohmann::json(*reserved) : nlohmann::json(nullptr)},
      {"peak_rss_bytes", peak_rss_bytes()}};

  const bool on_cpu = device_.is_cpu();
  std::vector<double> gpu_utils;
  if (sampler)
    for (const auto& s : sampler->samples())
      if (s.gpu_util_pct) gpu_utils.push_back(*s.gpu_util_pct);
  if (!on_cpu) {
    // GPU utilization from NVML's samples; "not available" (nulls) without NVML.
    const bool have = !gpu_utils.empty();
    double sum = 0;
    for (double u : gpu_utils) sum += u;
    record["utilization"] = {
        {"device", "gpu"},
        {"mean_pct", have ? nlohmann::json(sum / static_cast<double>(gpu_utils.size()))
                          : nlohmann::json(nullptr)},
        {"p50_pct", have ? null_if_nan(percentile(gpu_utils, 50)) : nlohmann::json(nullptr)},
        {"p95_pct", have ? null_if_nan(percentile(gpu_utils, 95)) : nlohmann::json(nullptr)},
        {"samples", static_cast<int64_t>(gpu_utils.size())},
        {"source", have ? std::string("nvml") : "not available (" + gpu_why_not + ")"}};
  } else
    record["utilization"] = {
        {"device", on_cpu ? "cpu" : "gpu"},
        {"mean_pct", on_cpu && timed_wall > 0
                         ? nlohmann::json(100.0 * timed_cpu / (timed_wall * threads))
                         : nlohmann::json(nullptr)},
        {"p50_pct", on_cpu ? null_if_nan(percentile(step_utils, 50)) : nlohmann::json(nullptr)},
        {"p95_pct", on_cpu ? null_if_nan(percentile(step_utils, 95)) : nlohmann::json(nullptr)},
        {"samples", on_cpu ? static_cast<int64_t>(step_utils.size()) : 0},
        {"source", on_cpu ? "process cpu time / (wall x threads)" : "not available"}};
  if (sampler) {
    // The sampler's series, its time counted from the first timed step.
    record["timeline"] = samples_to_json(sampler->samples());
    const auto origin = sampler->origin_s();
    if (origin && timed_wall_start > 0)
      for (auto& s : record["timeline"])
        s["t_s"] = s["t_s"].get<double>() + *origin - timed_wall_start;
    record["energy"] = energy_to_json(sampler->energy());
    record["sampler"] = {
        {"period_s", config_.sample_period_s},
        {"samples", record["timeline"].size()},
        {"busy_s", sampler->sampling_seconds()},
        {"gpu", gpu_sensor ? gpu_sensor->name() : "not available (" + gpu_why_not + ")"},
        {"rapl", rapl ? rapl->source() : "not available (" + rapl_why_not + ")"}};
  } else {
    record["timeline"] = timeline;  // one entry per timed step
    // Without the sampler: CPU time x watts per core, labelled an estimate.
    const bool timed_any = timed_wall > 0;
    const double joules = timed_cpu * config_.watts_per_core;
    record["energy"] = {
        {"joules", timed_any && on_cpu ? nlohmann::json(joules) : nlohmann::json(nullptr)},
        {"source", timed_any && on_cpu ? nlohmann::json("estimate") : nlohmann::json(nullptr)},
        {"co2_g", timed_any && on_cpu && config_.grid_g_per_kwh > 0
                      ? nlohmann::json(joules / 3.6e6 * config_.grid_g_per_kwh)
                      : nlohmann::json(nullptr)},
        {"detail", fmt::format("cpu time x {} W per core", config_.watts_per_core)}};
    record["sampler"] = nullptr;
  }

  // Tokens as they went through the model (effective batch x sequence length for a language
  // model, evaluations of the function for a toy problem).
  if (tokens_per_step == 0) tokens_per_step = effective * seq_len;
  const double per_step =
      3.0 * family_->forward_flops_per_token(arch_, seq_len) * static_cast<double>(tokens_per_step);
  record["flops"] = {
      {"per_step", per_step},
      // A step whose optimizer searches along a line evaluates the batch several times.
      {"achieved_per_s",
       any_timed && timed_s > 0
           ? nlohmann::json(per_step * static_cast<double>(timed_evaluations) / timed_s)
           : nlohmann::json(nullptr)},
      {"mfu", nullptr},
      {"hfu", nullptr},
      {"peak_per_s", nullptr},
      {"peak_source", nullptr},
      {"formula",
       "3 x analytical forward FLOPs per token x tokens per step (x evaluations "
       "per step for achieved_per_s)"}};
  // Hardware FLOPs count the forward a checkpoint recomputes as well (the estimate's ratio).
  const auto& est = record["estimate"];
  const double hardware_ratio =
      est.is_object() && est.value("model_flops_per_step", 0.0) > 0
          ? est["hardware_flops_per_step"].get<double>() / est["model_flops_per_step"].get<double>()
          : 1.0;
  record["flops"]["hardware_per_step"] = per_step * hardware_ratio;

  EnvInfo env = current_env(config_.device);
  if (device_.is_cuda()) env.device_name = reported_device_name(device_);
  record["env"] = {{"gradscope", env.gradscope_version},
                   {"libtorch", env.libtorch},
                   {"cuda", env.cuda.empty() ? nlohmann::json(nullptr) : nlohmann::json(env.cuda)},
                   {"device_name", env.device_name},
                   {"threads", env.threads},
                   {"blas_threads", env.blas_threads},
                   {"git_commit", env.git_commit},
                   {"host", env.host},
                   {"build", env.build_type}};
  apply_device_peak(record, nullptr);
  if (progress) progress->on_finish(record);
  return record;
}

void apply_device_peak(nlohmann::json& record, Database* db) {
  auto& flops = record["flops"];
  if (!flops.is_object() || !record.contains("env")) return;
  const auto& env = record["env"];
  const DevicePeak peak =
      device_peak(env.value("device_name", ""), record["config"].value("dtype", "fp32"),
                  env.value("host", ""), env.value("threads", 0), db);
  flops["peak_source"] = peak.source;
  if (!peak.flops_per_s || *peak.flops_per_s <= 0) {
    flops["peak_per_s"] = nullptr;
    flops["mfu"] = nullptr;
    flops["hfu"] = nullptr;
    return;
  }
  flops["peak_per_s"] = *peak.flops_per_s;
  const auto& achieved = flops["achieved_per_s"];
  if (!achieved.is_number()) return;
  // MFU: the model's FLOPs per second over the peak; HFU adds the recomputed forward.
  const double a = achieved.get<double>();
  const double ratio = flops.value("hardware_per_step", 0.0) / flops.value("per_step", 1.0);
  flops["mfu"] = a / *peak.flops_per_s;
  flops["hfu"] = a * (ratio > 0 ? ratio : 1.0) / *peak.flops_per_s;
}

}  // namespace gradscope
