#include "gradscope/train/memory_labels.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/core/memory_scope.h"
#include "gradscope/measure/memory.h"
#include "gradscope/measure/memory_viz.h"
#include "gradscope/train/estimate.h"

namespace gradscope {
namespace {

// A new file of this process's own beside `path` (PATH.timeline-XXXXXX), for the timeline a
// CPU --memory-snapshot is made from; removed once the pickle is written.
std::string temporary_beside(const std::string& path) {
  std::string name = path + ".timeline-XXXXXX";
  const int fd = mkstemp(name.data());
  if (fd < 0) fail_runtime("cannot make a temporary file beside " + path, std::strerror(errno));
  close(fd);
  return name;
}

}  // namespace

RunMemoryLabels::RunMemoryLabels(Session& session)
    : session_(session), config_(session.config()) {
  install_backward_memory_labels();
  set_memory_phase("before the first step");
  if (session_.device().is_cpu()) CpuMemoryTracker::install().clear_refusal();
  for (const auto& item : session_.model().named_parameters(/*recurse=*/true))
    params_.emplace_back(item.key(), item.value());
  grad_labels_.reserve(params_.size());
  const bool cpu = session_.device().is_cpu();
  CpuMemoryTracker* tracker = cpu ? &CpuMemoryTracker::install() : nullptr;
  for (const auto& [name, p] : params_) {
    grad_labels_.push_back(intern_memory_label({MemoryComponent::kGradients, name, ""}));
    if (tracker) tracker->relabel(p, intern_memory_label({MemoryComponent::kParameters, name, ""}));
  }
  for (const auto& shard : session_.updater()->parameter_shards()) {
    params_.push_back(shard);
    grad_labels_.push_back(intern_memory_label({MemoryComponent::kGradients, shard.first, ""}));
    if (tracker)
      tracker->relabel(shard.second,
                       intern_memory_label({MemoryComponent::kParameters, shard.first, ""}));
  }
  state_label_ = intern_memory_label({MemoryComponent::kOptimizerState, "optimizer state", ""});
  const bool snapshot_here = cpu && !config_.memory_snapshot.empty();
  if (!config_.memory_timeline.empty() || snapshot_here)  // on the CPU (the session checked)
    std::tie(first_step_, last_step_) = memory_window_steps(config_);
}

RunMemoryLabels::~RunMemoryLabels() {
  recorder_.reset();  // a window never closed leaves no file
  if (timeline_is_temporary_ && !timeline_path_.empty())
    std::remove(timeline_path_.c_str());
  set_memory_phase("");
}

std::string rank_output_path(const Session& session, const std::string& path) {
  return session.world() > 1 ? fmt::format("{}.rank{}", path, session.rank()) : path;
}

void RunMemoryLabels::step_begins(int64_t step) {
  step_ = step;
  clear_module_ranges();
  // A refusal the run survived (a state save that failed) is not the oom of a later step.
  if (session_.device().is_cpu()) CpuMemoryTracker::install().clear_refusal();
  if (first_step_ == 0) return;
  if (step == first_step_) {
    open_window(step);
  } else if (step > first_step_ && step <= last_step_ && !recorder_ && !skipped_) {
    // A run resumed inside the window would write a timeline without its first steps, over
    // the one the stopped run wrote of them: it writes none.
    skipped_ = true;
    log_warn("the run resumed at step {}, inside the memory timeline's steps {} to {}: no "
             "timeline is written this time (the stopped run wrote what it recorded)",
             step, first_step_, last_step_);
  }
}

void RunMemoryLabels::outside_steps(const std::string& what) {
  set_memory_phase(what);
  if (recorder_ && recorder_->is_open()) recorder_->phase(step_, what);
}

void RunMemoryLabels::phase_begins(Phase entered, std::optional<Phase> left) {
  if (left == Phase::kBackward) label_gradients();
  if (left == Phase::kOptimizer) label_optimizer_state();
  set_memory_phase(phase_name(entered));
  if (recorder_ && recorder_->is_open()) recorder_->phase(step_, phase_name(entered));
}

void RunMemoryLabels::step_ends(int64_t step) {
  label_gradients();
  label_optimizer_state();
  set_memory_phase("between steps");
  if (recorder_ && recorder_->is_open()) {
    recorder_->phase(step, "between steps");
    if (step == last_step_) close_window();
  }
}

void RunMemoryLabels::finish() {
  if (recorder_ && recorder_->is_open()) close_window();
  if (first_step_ > 0 && !recorder_ && !skipped_ && step_ < first_step_)
    log_warn("the run ended before step {}: no memory timeline was written", first_step_);
}

void RunMemoryLabels::label_gradients() {
  if (!session_.device().is_cpu()) return;
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& g = params_[i].second.grad();
    if (g.defined()) tracker.relabel(g, grad_labels_[i]);
  }
}

void RunMemoryLabels::label_optimizer_state() {
  if (!session_.device().is_cpu()) return;
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  for (const torch::Tensor& t : session_.updater()->state_tensors()) tracker.relabel(t, state_label_);
}

void RunMemoryLabels::open_window(int64_t step) {
  // The tensors the timeline names from the start, as the tracker now labels them.
  std::vector<std::pair<std::string, torch::Tensor>> named = params_;
  for (const auto& [name, p] : params_)
    if (p.grad().defined()) named.emplace_back(name + " (gradient)", p.grad());
  label_gradients();
  label_optimizer_state();
  for (const torch::Tensor& t : session_.updater()->state_tensors())
    named.emplace_back("optimizer state", t);
  // The estimate beside the timeline, made before the window opens so that what it
  // allocates is not in it.
  try {
    const MemoryEstimate e = estimate_run(session_.resolved().given, session_.data_bytes());
    estimate_.estimate = estimate_breakdown_at_peak(e);
    estimate_.estimate_peak_phase = e.peak_phase;
    estimate_.estimate_peak_bytes = e.peak_bytes;
  } catch (const std::exception&) {
    // A toy problem, or an optimizer the estimate has no model of: the timeline stands alone.
  }
  // The files are outputs beside the run's measurements: failing to write them (a full
  // disk) is said, and the run and its record go on.
  try {
    timeline_is_temporary_ = config_.memory_timeline.empty();
    timeline_path_ = timeline_is_temporary_
                         ? temporary_beside(rank_output_path(session_, config_.memory_snapshot))
                         : rank_output_path(session_, config_.memory_timeline);
    recorder_ = std::make_unique<MemoryWindowRecorder>(timeline_path_,
                                                        config_.memory_timeline_cap_bytes);
    recorder_->open(named);
    opened_at_ = step;
    recorder_->phase(step, current_memory_phase());
  } catch (const std::exception& e) {
    recorder_.reset();
    skipped_ = true;
    log_warn("the memory timeline cannot be written: {}", e.what());
  }
}

void RunMemoryLabels::close_window() {
  TimelineMeta meta;
  meta.run_id = session_.resolved().run_id;
  meta.device = session_.device().str();
  meta.first_step = opened_at_;
  meta.last_step = std::min(step_, last_step_);
  meta.estimate = estimate_.estimate;
  meta.estimate_peak_phase = estimate_.estimate_peak_phase;
  meta.estimate_peak_bytes = estimate_.estimate_peak_bytes;
  // The files are outputs beside the run's measurements: failing to write them (a full
  // disk) is said, and the run and its record go on.
  try {
    recorder_->close(meta);
    window_ = MemoryWindow{opened_at_, meta.last_step,
                           CpuMemoryTracker::install().window_peak_bytes()};
    if (!config_.memory_snapshot.empty())
      write_memory_viz_snapshot(read_memory_timeline(timeline_path_),
                                rank_output_path(session_, config_.memory_snapshot));
  } catch (const std::exception& e) {
    log_warn("the memory timeline of steps {} to {} could not be written: {}", opened_at_,
             meta.last_step, e.what());
  }
  if (timeline_is_temporary_) std::remove(timeline_path_.c_str());
  timeline_path_.clear();
}

}  // namespace gradscope
