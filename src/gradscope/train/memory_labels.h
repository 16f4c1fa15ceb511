// What a run tells the memory labels (core/memory_scope.h) and the CPU tracker as it goes: the
// phase it is in, what its tensors are (parameters from the start, gradients once a backward
// ends, optimizer state once an update ends), and, with --memory-timeline or --memory-snapshot
// on the CPU, the window of steps whose every allocation and free is recorded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/core/record.h"
#include "gradscope/measure/memory_window.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/train/session.h"

namespace gradscope {

class RunMemoryLabels {
 public:
  // Labels the parameters; installs backward's labels (measure/memory_window.h).
  explicit RunMemoryLabels(Session& session);
  ~RunMemoryLabels();
  RunMemoryLabels(const RunMemoryLabels&) = delete;
  RunMemoryLabels& operator=(const RunMemoryLabels&) = delete;

  // Step `step` (1-based) begins: its forwards' module ranges start afresh, and the window
  // opens if this is its first step.
  void step_begins(int64_t step);
  // A phase begins; `left` is the phase that ended, if one did.
  void phase_begins(Phase entered, std::optional<Phase> left);
  // The step's phases are over: between steps from here; the window closes (and its files
  // are written) after its last step.
  void step_ends(int64_t step);
  // The run is over: a window still open (the run failed or stopped inside it) is closed and
  // written with what it saw.
  void finish();

  // The window's steps and the allocator's peak over them, once it has closed.
  const std::optional<MemoryWindow>& window() const { return window_; }

 private:
  void label_gradients();
  void label_optimizer_state();
  void open_window(int64_t step);
  void close_window();
  // With several ranks each writes its own files: FILE.rankR.
  std::string rank_path(const std::string& path) const;

  Session& session_;
  const RunConfig& config_;
  int64_t first_step_ = 0, last_step_ = 0;  // the window; 0: none
  int64_t step_ = 0;
  int64_t opened_at_ = 0;  // the step the window opened at (a resumed run: maybe past first_step_)
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<uint32_t> grad_labels_;
  uint32_t state_label_ = 0;
  std::string timeline_path_;  // the columnar file the window writes ("" before it opens)
  bool timeline_is_temporary_ = false;  // written only to make --memory-snapshot's pickle
  std::unique_ptr<MemoryWindowRecorder> recorder_;
  TimelineMeta estimate_;  // only its estimate fields
  std::optional<MemoryWindow> window_;
};

}  // namespace gradscope
