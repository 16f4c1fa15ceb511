#include "gradscope/train/trainer.h"

#include <cmath>
#include <csignal>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/core/tensors.h"
#include "gradscope/data/tokenizer.h"
#include "gradscope/measure/clock.h"
#include "gradscope/measure/contention.h"
#include "gradscope/measure/cpu.h"
#include "gradscope/measure/memory.h"
#include "gradscope/measure/peak.h"
#include "gradscope/models/toy.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/train/autocast.h"
#include "gradscope/train/distributed_part.h"
#include "gradscope/train/estimate.h"
#include "gradscope/train/fit_hint.h"
#include "gradscope/train/memory_labels.h"
#include "gradscope/train/phase_timer.h"
#include "gradscope/train/record_parts.h"
#include "gradscope/train/weights_io.h"

namespace gradscope {
namespace {

// Out of memory: LibTorch's allocators say so; a host container's allocation that the system
// refused throws std::bad_alloc.
bool is_oom(const std::string& message) {
  return message.find("out of memory") != std::string::npos || message == "std::bad_alloc" ||
         message.find("DefaultCPUAllocator: can't allocate") != std::string::npos;
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Why a step's loss ends the run as diverged, or "" when it does not: a NaN or infinite loss,
// or (with --diverge-above F > 0) a loss above F times the run's first, a blow-up without a
// NaN. The first is the tally's first step, which a resumed run has back from its state.
std::string divergence(const RunConfig& c, const std::vector<StepEntry>& steps, double loss,
                       int64_t step) {
  if (!std::isfinite(loss)) return fmt::format("loss is {} at step {}", loss, step);
  if (c.diverge_above <= 0 || steps.empty() || !steps.front().loss) return "";
  const double first = *steps.front().loss;
  if (!(first > 0) || loss <= c.diverge_above * first) return "";
  return fmt::format("loss {:.6g} at step {} is above {:g} times the first step's {:.6g} "
                     "(--diverge-above)",
                     loss, step, c.diverge_above, first);
}

RunFailure failure_at(int64_t step, Phase phase, const std::string& message) {
  return RunFailure{step, std::string(phase_name(phase)), message};
}

// Toy problems: where the optimizer ended beside the known minimum.
std::optional<ToyResult> toy_result(Model& model) {
  auto* toy = dynamic_cast<ToyModel*>(&model);
  if (toy == nullptr) return std::nullopt;
  const auto x = toy->point().detach().cpu().contiguous();
  const auto best = toy->minimizer().cpu().contiguous();
  ToyResult r;
  r.final_params.assign(x.data_ptr<double>(), x.data_ptr<double>() + x.numel());
  r.min_loss = toy->min_loss();
  r.min_params.assign(best.data_ptr<double>(), best.data_ptr<double>() + best.numel());
  r.distance = (x - best).norm().item<double>();
  return r;
}

// A sample at a timed step's start or end; nullopt without a sampler, or when a sensor threw
// (the run goes on, and that step is left out of the sampler's energy and utilization).
std::optional<size_t> sampler_mark(Sampler* sampler) {
  if (sampler == nullptr) return std::nullopt;
  try {
    return sampler->mark();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

Trainer::Trainer(const RunConfig& config)
    : session_(std::make_unique<Session>(config)), meter_(make_memory_meter(session_->device())) {
  check_state_settings();
}

void Trainer::check_state_settings() {
  session_->use_rank_state_folders();
  const RunConfig& c = config();
  check_usage(c.state_every == 0 || !c.save_state.empty(),
              fmt::format("--state-every {} needs --save-state", c.state_every),
              "add --save-state DIR, the folder the state is kept in");
  if (!c.save_state.empty()) check_state_folder(c.save_state, c.resume);
  if (c.resume.empty()) return;
  resume_ = read_train_state_info(c.resume);
  check_resumable(*resume_, session_->resolved());
  // The rate the state trained with (what --lr auto found, when it ran): the record's too.
  session_->use_learning_rate(resume_->lr);
}

Trainer::~Trainer() = default;

double Trainer::lr_at(int64_t step) const {
  const RunConfig& c = config();
  const double lr = session_->lr();
  if (c.lr_schedule == LrSchedule::kConstant) return lr;
  const int64_t total = c.warmup_steps + c.steps;
  const int64_t warm = c.lr_warmup_steps;
  if (step < warm) return lr * static_cast<double>(step + 1) / static_cast<double>(warm);
  const double progress =
      static_cast<double>(step - warm) / static_cast<double>(std::max<int64_t>(1, total - warm));
  return lr * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

Evaluation Trainer::evaluate() {
  const RunConfig& c = config();
  // --eval-batches counts effective batches, evaluated in micro-batches: every strategy of a
  // comparison sees the same validation samples, whatever its split of the batch.
  EvalPass pass;
  pass.batch = c.batch;
  // With several ranks a micro-batch is the global one, each rank evaluating its share.
  pass.micro_batches = eval_micro_batches(
      c.eval_batches, c.accum_steps, c.batch * session_->world(), session_->data().val_samples());
  pass.comm = session_->world() > 1 ? session_->communicator().get() : nullptr;
  pass.bf16 = c.dtype == Dtype::kBf16;
  return evaluate_model(session_->model(), session_->data(), session_->device(), pass);
}

namespace {

// Hands a language model's loss head a probe for the life of a run, and takes it back after
// (it refers to the run's locals).
class HeadProbe {
 public:
  HeadProbe(Model& model, std::function<void(bool starts)> probe) : model_(model) {
    if (!model_.has_lm_head()) return;
    LossOptions options = model_.loss_options();
    options.head_probe = std::move(probe);
    model_.set_loss_options(std::move(options));
  }
  ~HeadProbe() {
    LossOptions options = model_.loss_options();
    options.head_probe = nullptr;
    model_.set_loss_options(std::move(options));
  }
  HeadProbe(const HeadProbe&) = delete;
  HeadProbe& operator=(const HeadProbe&) = delete;

 private:
  Model& model_;
};

}  // namespace

// What one run's loop carries from step to step, and from its parts to the record.
struct Trainer::Loop {
  Loop(Trainer& trainer, ProgressSink* sink)
      : progress(sink),
        config(trainer.config()),
        device(trainer.session_->device()),
        threads(at::get_num_threads()),
        total_steps(config.warmup_steps + config.steps),
        timer(clock, *trainer.meter_, device, config.phase_timing),
        sensors(config, device, *trainer.meter_, threads, clock),
        memory(*trainer.session_) {
    timer.set_listener([this](Phase entered, std::optional<Phase> left) {
      memory.phase_begins(entered, left);
    });
  }

  ProgressSink* const progress;
  const RunConfig& config;
  const torch::Device& device;
  // Threads that compute: LibTorch's intra-op pool, which MKL's threads come from.
  const int threads;
  const int64_t total_steps;
  SteadyClock clock;
  double run_started = clock.now_s();  // earlier by the wall time before a resume
  PhaseTimer timer;
  RunSensors sensors;
  RunMemoryLabels memory;  // what the tracker's bytes are, and the memory timeline's window
  RunRecord record;
  RunTally tally;
  int64_t first_step = 0;  // the step a resumed run goes on from
  int64_t saved_step = -1;  // the step of the last training state saved (-1: none)
  bool timed = false;       // the step running is a timed one
  bool agreed_stop = false;  // with several ranks: every rank stops after this step
  CommStats timed_comm;    // what this process's timed steps' collectives did
  int64_t timed_run = 0;  // of those steps
};

RunRecord Trainer::run(ProgressSink* progress) {
  Loop loop(*this, progress);
  const RunConfig& c = loop.config;
  RunRecord& record = loop.record;
  record.run_id = session_->resolved().run_id;
  record.config = c;
  record.update_rule = session_->updater()->update_rule();
  record.arch = session_->arch();
  record.params = session_->params();
  record.trainable_params = session_->trainable_params();
  record.data = session_->data().describe();
  record.lr_search = lr_search_;
  if (progress) progress->on_start(record, loop.total_steps);

  seed_dropout(c, session_->rank());
  if (!c.memory_snapshot.empty() && !loop.device.is_cpu()) start_memory_history();
  meter_->reset_peak();
  // The refusal an oom reads is this run's, not an earlier one's in this process (a trial of
  // --lr auto, a test's run).
  if (CpuMemoryTracker::installed()) CpuMemoryTracker::install().clear_refusal();
  // With --resume: the weights, optimizer state and generators as the state left them (after
  // seed_dropout, whose stream they continue), and the loop's tally and wall time so far.
  if (resume_) restore_state(loop);
  // When the state resumed from is the one in --save-state, it need not be saved again.
  if (resume_ && !c.save_state.empty() && find_train_state(c.save_state) == resume_->dir)
    loop.saved_step = loop.first_step;
  // What the loss head keeps for backward: the allocator's bytes once its loss exists, less
  // those as it started, in the timed steps' training forwards (evaluation runs no probe).
  int64_t head_start_bytes = 0;
  const HeadProbe head_probe(session_->model(), [&](bool starts) {
    if (!loop.timed) return;
    const int64_t now = meter_->current_bytes();
    if (starts)
      head_start_bytes = now;
    else
      loop.tally.logits_bytes =
          std::max(loop.tally.logits_bytes.value_or(0), now - head_start_bytes);
  });

  int64_t step = loop.first_step;
  bool agreed = false;  // the ranks agreed on the step they go on from
  try {
    // The ranks' first collective: a peer lost here ends the run as crashed, as in a step.
    if (session_->world() > 1) check_ranks_resume_together(loop.first_step);
    agreed = true;
    bool stopped = false;
    for (; step < loop.total_steps; ++step) {
      // SIGTERM or SIGINT (train_state.h): stop between steps (with several ranks, at the step
      // they agreed on).
      if (session_->world() > 1 ? loop.agreed_stop : stop_requested()) {
        stopped = true;
        break;
      }
      const double loss = train_step(loop, step);
      const std::string diverged = divergence(c, loop.tally.steps, loss, step + 1);
      if (!diverged.empty()) {
        record.status = RunStatus::kDiverged;
        record.failure = failure_at(step + 1, Phase::kForward, diverged);
        ++step;
        break;
      }
      if (c.eval_every > 0 && (step + 1) % c.eval_every == 0 && step + 1 < loop.total_steps)
        evaluate_at(loop, step + 1);
      if (out_of_time(loop)) {
        record.status = RunStatus::kTimeout;
        record.failure = failure_at(step + 1, Phase::kOptimizer,
                                    fmt::format("time limit of {} s reached", c.timeout_s));
        ++step;
        break;
      }
      if (!c.save_state.empty() && c.state_every > 0 && (step + 1) % c.state_every == 0)
        save_state_or_warn(loop, step + 1);
    }
    if (stopped) record_stop(loop, step);
    if (record.ok()) evaluate_at(loop, loop.total_steps);
  } catch (const Error& e) {
    // States saved at different steps: refused, as bad input (nothing was trained).
    if (!agreed && e.kind() == ErrorKind::kUsage) throw;
    record_failure(loop, e, step);
  } catch (const std::exception& e) {
    record_failure(loop, e, step);
  }

  if (loop.sensors.sampler()) loop.sensors.sampler()->stop();
  if (!c.memory_snapshot.empty() && !loop.device.is_cpu())
    write_memory_snapshot(rank_output_path(*session_, c.memory_snapshot));
  loop.memory.finish();  // a window the run ended in keeps what it saw
  finish_record(record, loop.tally, loop.timer, loop.sensors,
                loop.clock.now_s() - loop.run_started, loop.threads, loop.timed_comm,
                loop.timed_run);
  if (record.memory) record.memory->window = loop.memory.window();
  save_trained_weights(record);
  if (progress) progress->on_finish(record);
  return std::move(record);
}

void Trainer::restore_state(Loop& loop) {
  TrainProgress saved = load_train_state(*resume_, *session_);
  RunRecord& record = loop.record;
  loop.first_step = saved.step;
  loop.tally = std::move(saved.tally);
  loop.timer.restore(saved.timer);
  loop.run_started -= saved.wall_s;
  record.resumed_from_steps = std::move(saved.resumed_from_steps);
  record.resumed_from_steps.push_back(loop.first_step);
  if (saved.lr_search) record.lr_search = saved.lr_search;
  if (!loop.tally.steps.empty()) record.final_loss = loop.tally.steps.back().loss;
  if (loop.first_step > loop.config.warmup_steps) {
    // The timed steps began before the resume: their clock goes on from where it was (the
    // clock of this process may start anywhere, below zero too, after a reboot).
    loop.tally.timed_wall_start = loop.clock.now_s() - saved.timed_elapsed_s.value_or(0.0);
    if (loop.sensors.sampler()) loop.sensors.sampler()->start();
  }
  meter_->reset_peak();  // reading the state is not training
}

void Trainer::check_ranks_resume_together(int64_t first_step) {
  // Every rank must go on from the same step: states saved at different steps (a kill
  // between two ranks' saves) cannot be resumed together.
  Communicator& comm = *session_->communicator();
  // The steps' sum and sum of squares are N s and N s^2 only when every rank is at s.
  torch::Tensor steps = torch::tensor(
      {static_cast<double>(first_step), static_cast<double>(first_step * first_step)},
      torch::kFloat64);
  comm.allreduce(steps);
  const double n = comm.world(), s = static_cast<double>(first_step);
  if (steps[0].item<double>() != n * s || steps[1].item<double>() != n * s * s)
    fail_usage(fmt::format("--resume: rank {}'s state is at step {}, but the ranks' states are "
                           "not all at one step",
                           comm.rank(), first_step),
               "start the run afresh without --resume (the ranks' states were saved at "
               "different steps)");
}

double Trainer::train_step(Loop& loop, int64_t step) {
  const RunConfig& c = loop.config;
  RunTally& tally = loop.tally;
  Updater& updater = *session_->updater();
  Communicator* const comm = session_->communicator().get();
  const auto comm_stats = [comm] { return comm ? comm->stats() : CommStats{}; };
  loop.timed = step >= c.warmup_steps;
  if (step == c.warmup_steps) {
    tally.timed_wall_start = loop.clock.now_s();
    if (loop.sensors.sampler()) loop.sensors.sampler()->start();
  }
  const double lr = lr_at(step);
  updater.set_learning_rate(lr);
  // The sampler reads its sensors at each timed step's start and end (outside the step's
  // time), so that energy and utilization can be taken over the timed steps alone.
  Sampler* const marks = loop.timed ? loop.sensors.sampler() : nullptr;
  const std::optional<size_t> start_mark = sampler_mark(marks);
  // What competes for the cores, read outside the step's time as the marks are.
  const ContentionReading contention0 = loop.timed ? read_contention() : ContentionReading{};
  const double step_cpu0 = process_cpu_seconds();
  sync(loop.device);
  const double step_t0 = loop.clock.now_s();
  loop.memory.step_begins(step + 1);
  loop.timer.begin_step();
  const MicroBatchSource next = session_->step_batches(step);
  const CommStats comm_before = comm_stats();
  const bool bf16 = c.dtype == Dtype::kBf16;  // autocast around forward and backward
  const UpdateResult r = updater.step(
      [&] {
        AutocastScope autocast(loop.device, bf16);
        return session_->strategy().compute_gradients(session_->model(), next, loop.timer);
      },
      loop.timer);
  // What the step's collectives sent (evaluation's and the loop's own left out).
  if (loop.timed) {
    loop.timed_comm += comm_stats() - comm_before;
    ++loop.timed_run;
  }
  if (tally.tokens_per_step == 0) tally.tokens_per_step = r.out.tokens;
  const double loss = r.out.loss_sum.item<double>() /
                      static_cast<double>(std::max<int64_t>(r.out.target_count, 1));
  loop.timer.close();
  const double step_s = loop.clock.now_s() - step_t0;
  loop.memory.step_ends(step + 1);
  const double step_cpu = process_cpu_seconds() - step_cpu0;
  const StepContention contention =
      loop.timed ? step_contention(contention0, read_contention(), loop.threads)
                 : StepContention{};
  const std::optional<size_t> end_mark = sampler_mark(marks);
  if (start_mark && end_mark)
    tally.step_marks.push_back({tally.step_times.size(), *start_mark, *end_mark});
  if (step == 0) tally.state_bytes = updater.state_bytes();

  tally.steps.push_back({step + 1, finite_or_null(loss), lr, finite_or_null(r.grad_norm), step_s,
                         r.out.samples, r.out.tokens, r.out.target_count, r.evaluations,
                         !loop.timed, std::nullopt,  // energy_j: RunSensors::fill
                         contention});
  loop.record.final_loss = finite_or_null(loss);
  if (loop.timed) tally_timed_step(loop, step, step_s, step_cpu, r);
  if (loop.progress)
    loop.progress->on_step(step + 1, loop.total_steps, loss,
                           tally.timed_s > 0 ? tally.timed_tokens / tally.timed_s : 0,
                           loop.clock.now_s() - loop.run_started);
  return loss;
}

void Trainer::tally_timed_step(Loop& loop, int64_t step, double step_s, double step_cpu,
                               const UpdateResult& r) {
  RunTally& tally = loop.tally;
  tally.step_times.push_back(step_s);
  const double util = step_s > 0 ? 100.0 * step_cpu / (step_s * loop.threads) : 0;
  tally.step_utils.push_back(util);
  tally.step_cpus.push_back(step_cpu);
  tally.timed_s += step_s;
  tally.timed_samples += static_cast<double>(r.out.samples);
  tally.timed_tokens += static_cast<double>(r.out.tokens);
  tally.timed_evaluations += r.evaluations;
  for (int p = 0; p < PhaseTimer::kPhases; ++p) tally.phase_totals[p] += loop.timer.seconds(p);
  if (loop.timer.enabled()) tally.memory_timeline.push_back({step + 1, loop.timer.boundaries()});
  if (!loop.sensors.sampler()) {  // without the sampler, one timeline entry per timed step
    TimelineSample s;
    s.t_s = loop.clock.now_s() - tally.timed_wall_start.value_or(loop.clock.now_s());
    s.allocated_bytes = meter_->current_bytes();
    s.util_pct = util;
    tally.timeline.push_back(s);
  }
}

void Trainer::evaluate_at(Loop& loop, int64_t done) {
  // peak_bytes is training's: the peak so far is kept, and evaluation's own is left out.
  loop.tally.training_peak_bytes = std::max(loop.tally.training_peak_bytes, meter_->peak_bytes());
  loop.memory.outside_steps("evaluation");
  const Evaluation e = evaluate();
  loop.memory.outside_steps("between steps");
  meter_->reset_peak();
  loop.tally.evals.push_back({done, finite_or_null(e.val_loss), e.accuracy});
  if (loop.progress) loop.progress->on_eval(done, e.val_loss);
}

bool Trainer::out_of_time(Loop& loop) {
  // Ranks stop together: a stop request or a time limit that one rank sees ends the step
  // loop of all, at the same step, or the others would wait in a collective for it.
  const RunConfig& c = loop.config;
  bool out_of_time = c.timeout_s > 0 && loop.clock.now_s() - loop.run_started > c.timeout_s;
  if (session_->world() > 1) {
    torch::Tensor flags =
        torch::tensor({stop_requested() ? 1.0 : 0.0, out_of_time ? 1.0 : 0.0}, torch::kFloat64);
    session_->communicator()->allreduce(flags);
    loop.agreed_stop = flags[0].item<double>() > 0;
    out_of_time = flags[1].item<double>() > 0;
  }
  return out_of_time;
}

void Trainer::save_state(Loop& loop, int64_t done) {
  RunTally& tally = loop.tally;
  // The peak so far is kept, and what the save allocates is left out (as for evaluation).
  tally.training_peak_bytes = std::max(tally.training_peak_bytes, meter_->peak_bytes());
  TrainProgress p;
  p.step = done;
  p.wall_s = loop.clock.now_s() - loop.run_started;
  if (tally.timed_wall_start) p.timed_elapsed_s = loop.clock.now_s() - *tally.timed_wall_start;
  p.tally = tally;
  // The sampler's marks index samples of this process: each marked step's energy is taken
  // now and kept as its energy_j, so that a resumed run's energy covers every timed step.
  if (Sampler* sampler = loop.sensors.sampler()) {
    std::vector<StepEntry*> timed_steps;
    for (StepEntry& s : p.tally.steps)
      if (!s.warmup) timed_steps.push_back(&s);
    for (const RunTally::StepMarks& m : p.tally.step_marks)
      if (m.step < timed_steps.size())
        timed_steps[m.step]->energy_j = sampler->energy_between(m.from, m.to);
  }
  p.tally.step_marks.clear();
  p.timer = loop.timer.carried();
  p.resumed_from_steps = loop.record.resumed_from_steps;
  // Nothing ran since the resume: this is the state resumed from, as it was.
  if (resume_ && done == loop.first_step && !p.resumed_from_steps.empty())
    p.resumed_from_steps.pop_back();
  p.lr_search = loop.record.lr_search;
  save_train_state(loop.config.save_state, *session_, p);
  meter_->reset_peak();
  loop.saved_step = done;
}

void Trainer::save_state_or_warn(Loop& loop, int64_t done) {
  // A save that fails (a full disk) leaves the previous state whole: the run goes on.
  try {
    save_state(loop, done);
  } catch (const std::exception& e) {
    meter_->reset_peak();
    log_warn("the training state after step {} could not be saved (the previous one is kept): {}",
             done, first_line(e.what()));
  }
}

void Trainer::record_stop(Loop& loop, int64_t step) {
  const RunConfig& c = loop.config;
  std::string save_failed;
  if (!c.save_state.empty() && loop.saved_step != step) {
    try {
      save_state(loop, step);
    } catch (const std::exception& e) {
      meter_->reset_peak();
      save_failed = first_line(e.what());
      log_warn("stopped after step {}, but its training state could not be saved: {}", step,
               save_failed);
    }
  }
  std::string kept;
  // With several ranks each keeps DIR/rank-R; --resume takes DIR.
  const std::string given_state = session_->world() > 1
                                      ? std::filesystem::path(c.save_state).parent_path().string()
                                      : c.save_state;
  if (c.save_state.empty())
    kept = "nothing was saved (no --save-state)";
  else if (save_failed.empty())
    kept = "the training state is in " + given_state + ": --resume " + given_state +
           " continues the run";
  else if (loop.saved_step >= 0)
    kept = fmt::format(
        "the training state could not be saved ({}); the one of step {} is in "
        "{}: --resume {} continues from there",
        save_failed, loop.saved_step, given_state, given_state);
  else
    kept = fmt::format("the training state could not be saved ({})", save_failed);
  const int sig = stop_signal();
  loop.record.status = RunStatus::kInterrupted;
  loop.record.failure = RunFailure{step, std::nullopt,
                                   fmt::format("stopped by {} after step {} of {}; {}",
                                               sig == SIGTERM  ? "SIGTERM"
                                               : sig == SIGINT ? "SIGINT"
                                                               : "a stop request",
                                               step, loop.total_steps, kept)};
}

void Trainer::record_failure(Loop& loop, const std::exception& e, int64_t step) {
  const Phase failed_in = loop.timer.current();
  loop.timer.close();
  const std::string message = e.what();
  RunRecord& record = loop.record;
  record.status = is_oom(message) ? RunStatus::kOom : RunStatus::kError;
  // Another rank died or stopped answering: the run crashed, whatever this rank did. A rank
  // that failed on its own says so at the meeting point, for the others' roll call.
  if (dynamic_cast<const PeerLost*>(&e))
    record.status = RunStatus::kCrashed;
  else if (const auto& comm = session_->communicator())
    comm->failed_here();
  record.failure = failure_at(step + 1, failed_in, message.substr(0, message.find('\n')));
  for (const auto& p : session_->parameters()) {
    torch::Tensor t = p;
    t.mutable_grad() = torch::Tensor();
  }
  // After the gradients are gone: the estimate's checks may allocate a little.
  if (record.status == RunStatus::kOom) record.failure->memory = oom_memory(*session_, *meter_);
}

void Trainer::save_trained_weights(const RunRecord& record) {
  // --save-weights: weights that finished training (or ran out of time), never those of a
  // step that failed half-way or diverged; after the record's time and memory are taken, so
  // the save counts in neither. A save that fails leaves the measurement as it is and says
  // so in save_error() (`gradscope run` exits 1 once the record is stored).
  const RunConfig& c = config();
  save_error_.clear();
  if (c.save_weights.empty() || !(record.ok() || record.status == RunStatus::kTimeout))
    return;
  // With several ranks every one holds the trained weights after a step (fsdp's are gathered
  // first, by all): rank 0 saves them.
  session_->updater()->gather_parameters();
  if (session_->rank() != 0) return;
  try {
    if (c.save_adapters)
      save_adapters(c.model, session_->model(), session_->lora_options(), c.save_weights,
                    c.init_from);
    else
      save_weights(c.model, session_->model(), arch(), c.save_weights,
                   tokenizer_json_of(arch().value("tokenizer", ""), data_dir()));
  } catch (const std::exception& e) {
    save_error_ = e.what();
  }
}

void Trainer::finish_record(RunRecord& record, RunTally& tally, const PhaseTimer& timer,
                            const RunSensors& sensors, double wall_s, int threads,
                            const CommStats& timed_comm, int64_t timed_run) {
  const RunConfig& c = config();
  const torch::Device& device = session_->device();
  record.steps = tally.steps;
  record.evals = tally.evals;
  if (!record.evals.empty()) {
    record.final_val_loss = record.evals.back().val_loss;
    record.final_accuracy = record.evals.back().accuracy;
  }
  record.toy = toy_result(session_->model());
  // The prediction of `gradscope estimate` for this configuration, beside the measurement.
  try {
    record.estimate =
        estimate_to_json(estimate_run(session_->resolved().given, session_->data_bytes()));
  } catch (const std::exception&) {
    record.estimate = nullptr;  // a toy problem, or an optimizer it has no model of
  }
  const ShardFigures* shard = shard_figures(*session_->updater());
  record.time = time_part(tally, wall_s, c.phase_timing, shard != nullptr);
  record.throughput = throughput_part(tally);
  record.memory = memory_part(
      tally, timer, *meter_,
      session_->updater()->resident_params_bytes().value_or(tensors_bytes(session_->parameters())),
      session_->frozen_params_bytes(), session_->updater()->grads_bytes(), c.phase_timing,
      shard ? std::optional<int64_t>(shard->buffer_peak_bytes) : std::nullopt);
  sensors.fill(record, tally, c, device.is_cpu(), threads);
  record.memory->figures = memory_figures(record);
  // Over every timed step, those before a resume included (their readings are in the steps).
  std::vector<StepContention> contention;
  std::vector<double> contention_s;
  for (const StepEntry& s : tally.steps)
    if (!s.warmup) {
      contention.push_back(s.contention);
      contention_s.push_back(s.time_s);
    }
  if (!contention.empty()) {
    DisturbanceThresholds thresholds;
    // The sampler takes a core from the run only when the run's threads fill the CPUs.
    if (c.sample_period_s > 0 && threads >= machine_cpus())
      thresholds.own_wakeups_per_s = 1.0 / c.sample_period_s;
    record.contention =
        summarize_contention(contention, contention_s, threads, machine_cpus(), thresholds);
  }
  // Tokens as they went through the model (effective batch x sequence length for a language
  // model, evaluations of the function for a toy problem).
  if (tally.tokens_per_step == 0) tally.tokens_per_step = c.global_batch() * c.seq_len;
  record.flops = flops_part(tally, session_->family().forward_flops_per_token(arch(), c.seq_len),
                            recompute_flops(c, arch(), c.seq_len).per_step);
  record.env = env_part(c.device, device);
  apply_device_peak(record);
  if (shard) record_distributed_part(record, *session_, *shard, timed_comm, timed_run);
}

void apply_device_peak(RunRecord& record, const nlohmann::json& probe) {
  if (!record.flops || !record.env) return;
  RunFlops& flops = *record.flops;
  const DevicePeak peak =
      device_peak(record.env->device_name, dtype_name(record.config.dtype), probe);
  flops.peak_source = peak.source;
  if (!peak.flops_per_s || *peak.flops_per_s <= 0) {
    flops.peak_per_s.reset();
    flops.mfu.reset();
    flops.hfu.reset();
    return;
  }
  flops.peak_per_s = *peak.flops_per_s;
  if (!flops.achieved_per_s) return;
  // MFU: the model's FLOPs per second over the peak; HFU adds the recomputed forward.
  const double a = *flops.achieved_per_s;
  const double ratio = flops.per_step > 0 ? flops.hardware_per_step / flops.per_step : 1.0;
  // The ranks' FLOPs together, over as many devices' peaks.
  const double devices = static_cast<double>(std::max<int64_t>(1, record.config.nproc));
  flops.mfu = a / (*peak.flops_per_s * devices);
  flops.hfu = a * (ratio > 0 ? ratio : 1.0) / (*peak.flops_per_s * devices);
}

}  // namespace gradscope
