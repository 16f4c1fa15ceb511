// The training state: everything a run needs to continue where it stopped (--save-state DIR,
// --resume DIR), and SIGTERM and SIGINT as a request to stop between steps. docs/training-
// state.md says what is saved and what a resumed run's figures mean.
//
// A state is a folder of four files:
//   state.json      the run id, the configuration (the settings that define the run and how
//                   it is measured), the steps done, the learning rate in use, the wall time
//                   so far, the loop's tally (steps, evaluations, times, energy and memory
//                   figures) and the phase timer's peaks;
//   model.pt        the model's parameters and buffers (torch::serialize archive);
//   optimizer.pt    the updater's optimizer state (Updater::save);
//   generators.pt   the default CPU generator's state (dropout), and the CUDA one's on CUDA.
// The data a step reads and its learning rate are functions of the step (Session::step_batches,
// the schedule), so the step number is their whole state.
//
// state.json also names the build that wrote it (gradscope version, git commit, LibTorch
// version): a resume from another build is refused.
//
// A save never leaves a half state: the files are written into a temporary sibling folder,
// flushed to the disk, and the folder is exchanged with the old one in one rename
// (renameat2 RENAME_EXCHANGE), then the old one removed. A kill at any moment leaves either
// the previous state or the new one whole: in DIR, or, where the file system cannot exchange
// two folders, in a sibling .DIR.old-XXXXXX that the lookup below finds.
#pragma once

#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/record.h"
#include "gradscope/train/phase_timer.h"
#include "gradscope/train/record_parts.h"
#include "gradscope/train/session.h"

namespace gradscope {

inline constexpr const char* kTrainStateSchema = "gradscope.state/1";
// The exit code of a `gradscope run` (or sweep) stopped by SIGTERM or SIGINT: EX_TEMPFAIL of
// sysexits.h, "stopped; resume it". The command returns it, and a sweep reads it in a child's.
inline constexpr int kExitStopped = 75;

// What state.json says of the run, read without loading a tensor.
struct TrainStateInfo {
  std::string dir;  // the folder it was read from
  std::string run_id;
  nlohmann::json config;  // config_to_json of the configuration as given
  std::string device;     // the run's --device
  int64_t step = 0;       // steps done, warm-up included
  int64_t total_steps = 0;
  double lr = 0;      // the learning rate the schedule scales (what --lr auto found, if it ran)
  std::string build;  // the build that wrote it (train_state_build()); "" when unnamed
};

// This build, as a state names it: "gradscope VERSION (commit COMMIT), LibTorch VERSION".
std::string train_state_build();

// Where the training loop stands between two steps, beside the tensors.
struct TrainProgress {
  int64_t step = 0;   // steps done, warm-up included
  double wall_s = 0;  // the run's wall seconds so far (every part before a resume included)
  // Seconds since the first timed step began (the timeline's origin); nullopt before it.
  std::optional<double> timed_elapsed_s;
  RunTally tally;  // its sampler marks are not kept: they index samples of this process
  PhaseTimer::Carried timer;
  std::vector<int64_t> resumed_from_steps;
  std::optional<std::vector<LrTrial>> lr_search;
};

// Refuses (a usage error) a --save-state folder that could not take a state: a parent folder
// that does not exist or cannot be written, or a folder that holds something other than a
// training state (a save replaces the whole folder). An empty folder is fine. A folder that
// holds a state is refused unless `resume` names the same folder: a fresh run would overwrite
// it.
void check_state_folder(const std::string& dir, const std::string& resume = "");

// Where rank `rank` of a run of `nproc` ranks keeps its part of the state `dir` names:
// DIR/rank-R with several ranks (each saves its own), DIR itself with one.
std::string rank_state_folder(const std::string& dir, int64_t nproc, int64_t rank);

// Whether the state `dir` holds can resume a run of `nproc` ranks whose id is `run_id`:
// every rank's part (rank_state_folder) a state of this build and of that run, all at one
// step. Returns rank 0's part's information, or nullopt with the reason in *why ("" when
// there is no state at all). Never throws for a damaged state: that is a reason.
std::optional<TrainStateInfo> resumable_state(const std::string& dir, int64_t nproc,
                                              const std::string& run_id, std::string* why);

// The folder that holds the state `dir` names: `dir` itself when it holds state.json, else
// the previous state a save left aside beside it (.DIR.old-XXXXXX, the one of the highest
// step); "" when there is none.
std::string find_train_state(const std::string& dir);

// Removes the state `dir` names with what saves left beside it (.DIR.saving-* and
// .DIR.old-*). Never throws; false when something could not be removed.
bool remove_train_state(const std::string& dir);

// Writes the run's state into `dir` atomically (above). A runtime error naming the folder
// when a step fails; the previous state is then untouched. After a save that succeeded, no
// folder a save moved aside is left.
void save_train_state(const std::string& dir, Session& session, const TrainProgress& progress);

// The state.json of `dir`; a usage error when there is no state or it is not one.
TrainStateInfo read_train_state_info(const std::string& dir);

// Where the loop stood, as the state.json of `dir` says (what load_train_state restores),
// read and checked without a model; a usage error naming the file when it is not a whole
// state.
TrainProgress read_train_progress(const std::string& dir);

// Refuses (a usage error naming each difference) to continue a state with other settings:
// every setting that defines the run or how it is measured must be the state's; and one
// written by another build (naming both).
void check_resumable(const TrainStateInfo& info, const ResolvedRun& run);

// Puts the session's model, optimizer and generators where the state left them, and returns
// where the loop stood. The session must be built from the state's settings
// (check_resumable) and use the state's learning rate (Session::use_learning_rate(info.lr)).
TrainProgress load_train_state(const TrainStateInfo& info, Session& session);

// The model's parameters and buffers as a state holds them, by name (for tests and tools
// that compare the weights of two states).
std::vector<std::pair<std::string, torch::Tensor>> read_state_weights(const std::string& dir);

// A usage error unless `info` was written by this build (train_state_build()).
void check_state_build(const TrainStateInfo& info);

// SIGTERM and SIGINT as a request to stop: while an object of this class lives, either signal
// sets a flag (a lock-free atomic) that the training loop reads between steps. The SIGTERM
// handler stays for the object's life: a scheduler (systemd, Slurm) and a sweep may each send
// one, and a second must not end a run that is saving its state; SIGKILL is the escalation. A
// second SIGINT (Ctrl-C pressed again) acts as if no handler were installed: it ends the
// process at once. Constructing one clears an earlier request and unblocks the two signals in
// this thread (block_stop_signals). Objects nest: one made while another lives changes
// nothing. With kUntilDestroyed the handlers found are put back on destruction; a command
// passes kUntilExit, so that a signal after its outcome is recorded (while it exits) sets the
// flag and changes neither the record nor the exit code.
class StopSignals {
 public:
  enum class Scope { kUntilDestroyed, kUntilExit };
  explicit StopSignals(Scope scope = Scope::kUntilDestroyed);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  bool outermost_ = false;
  Scope scope_;
  struct sigaction term_before_ {
  }, int_before_{};
};

// Blocks SIGTERM and SIGINT in this thread until a StopSignals is made: a command that will
// install the handlers calls it first thing, so that a stop sent while it starts waits for
// them instead of ending the process unrecorded.
void block_stop_signals();

// Whether a stop was requested (by a signal, or request_stop), and by which signal (0: none,
// or by request_stop).
bool stop_requested();
int stop_signal();
// What the handler does, for callers (and tests) that stop a run without a signal.
void request_stop();
void clear_stop_request();

}  // namespace gradscope
