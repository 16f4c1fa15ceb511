// The training state (train/train_state.h): a run stopped after step k and resumed from its
// state gives the very losses and weights, bit for bit on the CPU, of the same run trained in
// one go, whatever updater computes its steps; a resume with other settings is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/settings.h"
#include "gradscope/train/train_state.h"
#include "gradscope/train/trainer.h"
#include "test_util.h"

namespace gradscope {
namespace {

// The tiny Llama with dropout (so that the generator's state matters) and a cosine schedule
// with warm-up (so that the learning rate depends on the step), an evaluation midway.
RunConfig state_config(const std::string& strategy, const std::string& optimizer = "adam") {
  RunConfig c = testing::tiny_llama_config();
  c.optimizer = optimizer;
  c.lr = optimizer == "cg" ? 0 : 3e-3;
  c.batch = 2;
  c.steps = 5;
  c.warmup_steps = 1;
  c.dropout = 0.1;
  c.lr_schedule = LrSchedule::kCosine;
  c.lr_warmup_steps = 2;
  c.eval_every = 3;
  c.threads = 1;
  c.strategy = parse_strategy(strategy);
  if (strategy.find("accumulation") != std::string::npos) c.accum_steps = 2;
  return c;
}

// Asks the run to stop once `after` steps are done (as SIGTERM would).
class StopAfter : public ProgressSink {
 public:
  explicit StopAfter(int64_t after) : after_(after) {}
  void on_step(int64_t step, int64_t, double, double, double) override {
    if (step == after_) request_stop();
  }

 private:
  int64_t after_;
};

struct Trained {
  RunRecord record;
  std::vector<std::pair<std::string, torch::Tensor>> weights;
};

Trained train(const RunConfig& c, ProgressSink* progress = nullptr) {
  clear_stop_request();
  Trainer trainer(c);
  Trained t;
  t.record = trainer.run(progress);
  clear_stop_request();
  for (const auto& item : trainer.model().named_parameters(true))
    t.weights.emplace_back(item.key(), item.value().detach().clone());
  return t;
}

void expect_same_training(const Trained& resumed, const Trained& whole) {
  ASSERT_EQ(resumed.record.steps.size(), whole.record.steps.size());
  for (size_t i = 0; i < whole.record.steps.size(); ++i) {
    const StepEntry &a = resumed.record.steps[i], &b = whole.record.steps[i];
    EXPECT_EQ(a.step, b.step);
    ASSERT_TRUE(a.loss && b.loss);
    EXPECT_EQ(*a.loss, *b.loss) << "step " << b.step;  // bit for bit
    EXPECT_EQ(a.lr, b.lr) << "step " << b.step;
    EXPECT_EQ(a.grad_norm.has_value(), b.grad_norm.has_value());
    if (a.grad_norm && b.grad_norm) EXPECT_EQ(*a.grad_norm, *b.grad_norm) << "step " << b.step;
    EXPECT_EQ(a.evaluations, b.evaluations);
  }
  ASSERT_EQ(resumed.record.evals.size(), whole.record.evals.size());
  for (size_t i = 0; i < whole.record.evals.size(); ++i) {
    EXPECT_EQ(resumed.record.evals[i].step, whole.record.evals[i].step);
    EXPECT_EQ(resumed.record.evals[i].val_loss, whole.record.evals[i].val_loss);
  }
  ASSERT_EQ(resumed.weights.size(), whole.weights.size());
  for (size_t i = 0; i < whole.weights.size(); ++i)
    EXPECT_TRUE(torch::equal(resumed.weights[i].second, whole.weights[i].second))
        << whole.weights[i].first;
}

// Stopped after step k (its state saved), then resumed by a new trainer: as if never stopped.
void expect_bitwise_resume(const RunConfig& c, int64_t k) {
  const Trained whole = train(c);
  ASSERT_TRUE(whole.record.ok()) << whole.record.failure->message;

  testing::TempDir dir("gradscope-state");
  const std::string state = dir.file("state");
  RunConfig first = c;
  first.save_state = state;
  StopAfter stop(k);
  const Trained part = train(first, &stop);
  ASSERT_EQ(part.record.status, RunStatus::kInterrupted);
  ASSERT_TRUE(part.record.failure && part.record.failure->step);
  EXPECT_EQ(*part.record.failure->step, k);
  EXPECT_EQ(part.record.steps.size(), static_cast<size_t>(k));
  EXPECT_EQ(read_train_state_info(state).step, k);

  RunConfig second = c;
  second.resume = state;
  second.save_state = state;
  const Trained resumed = train(second);
  ASSERT_TRUE(resumed.record.ok()) << resumed.record.failure->message;
  EXPECT_EQ(resumed.record.resumed_from_steps, std::vector<int64_t>{k});
  expect_same_training(resumed, whole);
  // The measurements of the first part are kept: every step has its time.
  ASSERT_TRUE(resumed.record.time && resumed.record.time->timed_steps);
  EXPECT_EQ(*resumed.record.time->timed_steps, c.steps);
  EXPECT_EQ(record_from_json(record_to_json(resumed.record)).resumed_from_steps,
            std::vector<int64_t>{k});
}

TEST(TrainState, StandardResumesBitwise) { expect_bitwise_resume(state_config("standard"), 3); }

TEST(TrainState, CheckpointResumesBitwise) { expect_bitwise_resume(state_config("checkpoint"), 2); }

TEST(TrainState, AccumulationResumesBitwise) {
  expect_bitwise_resume(state_config("accumulation"), 4);
}

TEST(TrainState, FusedResumesBitwise) { expect_bitwise_resume(state_config("fused"), 3); }

TEST(TrainState, AccumulationFusedResumesBitwise) {
  expect_bitwise_resume(state_config("accumulation+fused"), 3);
}

// A line search: its direction and step size (CG's state) and the generator, which every
// trial point restarts from, carry over.
TEST(TrainState, ConjugateGradientResumesBitwise) {
  expect_bitwise_resume(state_config("standard", "cg"), 3);
}

// Saved every two steps, resumed twice: the record lists both resumes, and a state at the
// last step resumes into the final evaluation alone.
TEST(TrainState, PeriodicStatesResumeAgainAndAgain) {
  RunConfig c = state_config("standard");
  c.warmup_steps = 0;
  c.steps = 4;
  const Trained whole = train(c);
  testing::TempDir dir("gradscope-state-every");
  const std::string state = dir.file("s");
  RunConfig first = c;
  first.save_state = state;
  first.state_every = 2;
  StopAfter stop(3);  // saved at 2, stopped (and saved) at 3
  ASSERT_EQ(train(first, &stop).record.status, RunStatus::kInterrupted);
  RunConfig second = first;
  second.resume = state;
  StopAfter again(4);  // the last step: the run ends before it could stop
  const Trained resumed = train(second, &again);
  ASSERT_TRUE(resumed.record.ok());
  EXPECT_EQ(read_train_state_info(state).step, 4);  // saved at the last step too
  const Trained end = train(second);
  ASSERT_TRUE(end.record.ok());
  EXPECT_EQ(end.record.resumed_from_steps, (std::vector<int64_t>{3, 4}));
  expect_same_training(end, whole);
  // What a tool reads of the state: the final weights.
  const auto weights = read_state_weights(state);
  ASSERT_EQ(weights.size(), whole.weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(weights[i].first, whole.weights[i].first);
    EXPECT_TRUE(torch::equal(weights[i].second, whole.weights[i].second)) << weights[i].first;
  }
}

TEST(TrainState, StopWithoutSaveStateRecordsInterruptedAndSavesNothing) {
  RunConfig c = state_config("standard");
  StopAfter stop(2);
  const Trained part = train(c, &stop);
  EXPECT_EQ(part.record.status, RunStatus::kInterrupted);
  EXPECT_EQ(std::string(status_name(part.record.status)), "interrupted");
  EXPECT_FALSE(is_final_status(part.record.status));
  ASSERT_TRUE(part.record.failure);
  EXPECT_TRUE(testing::contains(part.record.failure->message, "nothing was saved"))
      << part.record.failure->message;
  EXPECT_EQ(part.record.steps.size(), 2u);
  EXPECT_EQ(record_from_json(record_to_json(part.record)).status, RunStatus::kInterrupted);
}

TEST(TrainState, AResumeWithOtherSettingsNamesTheDifference) {
  RunConfig c = state_config("standard");
  c.steps = 2;
  testing::TempDir dir("gradscope-state-other");
  const std::string state = dir.file("s");
  RunConfig first = c;
  first.save_state = state;
  StopAfter stop(1);
  ASSERT_EQ(train(first, &stop).record.status, RunStatus::kInterrupted);

  RunConfig other = c;
  other.resume = state;
  other.lr = 1e-3;
  other.batch = 3;
  const Error e = testing::expect_usage_error([&] { Trainer t(other); });
  EXPECT_TRUE(testing::contains(e.what(), "--lr")) << e.what();
  EXPECT_TRUE(testing::contains(e.what(), "--batch")) << e.what();
  EXPECT_FALSE(testing::contains(e.what(), "--seed")) << e.what();
  // Output settings are not the run's: another --json or database is fine.
  RunConfig same = c;
  same.resume = state;
  same.json_path = dir.file("r.json");
  same.db_path = dir.file("other.db");
  Trainer fine(same);
  EXPECT_EQ(fine.resumed_state()->step, 1);
}

TEST(TrainState, RefusesFoldersThatAreNotStates) {
  testing::TempDir dir("gradscope-state-folders");
  RunConfig c = state_config("standard");
  c.resume = dir.file("none");
  const Error missing = testing::expect_usage_error([&] { Trainer t(c); });
  EXPECT_TRUE(testing::contains(missing.what(), "no training state")) << missing.what();

  // A save replaces its whole folder: one that holds other files is refused.
  std::filesystem::create_directories(dir.file("busy"));
  std::ofstream(dir.file("busy/notes.txt")) << "mine\n";
  RunConfig busy = state_config("standard");
  busy.save_state = dir.file("busy");
  testing::expect_usage_error([&] { Trainer t(busy); });
  EXPECT_EQ(testing::slurp(dir.file("busy/notes.txt")), "mine\n");

  RunConfig every = state_config("standard");
  every.state_every = 2;
  testing::expect_usage_error([&] { Trainer t(every); });

  // A state.json of something else.
  std::filesystem::create_directories(dir.file("fake"));
  std::ofstream(dir.file("fake/state.json")) << "{\"schema\": \"other\"}\n";
  testing::expect_usage_error([&] { read_train_state_info(dir.file("fake")); });
}

// A save killed part-way leaves its temporary folder beside the state: the state is whole, and
// the next save clears the leftover.
TEST(TrainState, ALeftoverOfAKilledSaveIsCleared) {
  testing::TempDir dir("gradscope-state-leftover");
  RunConfig c = state_config("standard");
  c.steps = 2;
  c.warmup_steps = 0;
  c.save_state = dir.file("s");
  c.state_every = 1;
  std::filesystem::create_directories(dir.file(".s.saving-abc123"));
  std::ofstream(dir.file(".s.saving-abc123/model.pt")) << "half";
  std::filesystem::create_directories(dir.file(".s.old-def456"));  // moved aside, half removed
  ASSERT_TRUE(train(c).record.ok());
  EXPECT_FALSE(std::filesystem::exists(dir.file(".s.saving-abc123")));
  EXPECT_FALSE(std::filesystem::exists(dir.file(".s.old-def456")));
  EXPECT_EQ(read_train_state_info(dir.file("s")).step, 2);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);  // the state alone: no temporary or old folder left
}

// A state.json as a save writes it, for tests of the lookup (no tensor is read).
void write_state_json(const std::string& folder, int64_t step) {
  std::filesystem::create_directories(folder);
  const nlohmann::json j = {{"schema", kTrainStateSchema},
                            {"run_id", "r"},
                            {"config", nlohmann::json::object()},
                            {"device", "cpu"},
                            {"step", step},
                            {"total_steps", 9},
                            {"lr", 0.001},
                            {"build", train_state_build()}};
  std::ofstream(folder + "/state.json") << j.dump() << "\n";
}

// States a save moved aside: the lookup takes the one of the highest step, a fresh run may not
// overwrite it, and removing the state removes every leftover beside it.
TEST(TrainState, TheLookupTakesTheNewestStateLeftAsideAndRemovalTakesAll) {
  testing::TempDir dir("gradscope-state-aside");
  write_state_json(dir.file(".s.old-aaaaaa"), 3);
  write_state_json(dir.file(".s.old-bbbbbb"), 5);
  write_state_json(dir.file(".s.old-cccccc"), 4);
  std::filesystem::create_directories(dir.file(".s.saving-dddddd"));
  std::filesystem::create_directories(dir.file("other"));
  EXPECT_EQ(find_train_state(dir.file("s")), dir.file(".s.old-bbbbbb"));
  EXPECT_EQ(read_train_state_info(dir.file("s")).step, 5);
  const Error e = testing::expect_usage_error([&] { check_state_folder(dir.file("s")); });
  EXPECT_TRUE(testing::contains(e.what(), "holds a training state")) << e.what();
  check_state_folder(dir.file("s"), dir.file("s/"));  // resumed in place: fine
  EXPECT_TRUE(remove_train_state(dir.file("s")));
  EXPECT_EQ(find_train_state(dir.file("s")), "");
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"other"});
}

// A run with --save-state over a saved state and no --resume of it would overwrite it.
TEST(TrainState, AFreshRunMayNotOverwriteASavedState) {
  testing::TempDir dir("gradscope-state-overwrite");
  RunConfig c = state_config("standard");
  c.steps = 2;
  c.save_state = dir.file("s");
  StopAfter stop(1);
  ASSERT_EQ(train(c, &stop).record.status, RunStatus::kInterrupted);
  const Error e = testing::expect_usage_error([&] { Trainer t(c); });
  EXPECT_TRUE(testing::contains(e.what(), "holds a training state")) << e.what();
  EXPECT_TRUE(testing::contains(e.hint(), "--resume " + dir.file("s"))) << e.hint();
  RunConfig elsewhere = c;
  elsewhere.resume = dir.file("s");
  elsewhere.save_state = dir.file("t");
  write_state_json(dir.file("t"), 1);
  testing::expect_usage_error([&] { Trainer t(elsewhere); });
  c.resume = dir.file("s");
  Trainer fine(c);
  EXPECT_EQ(fine.resumed_state()->step, 1);
}

// A state names the build that wrote it; another build's is refused, naming both.
TEST(TrainState, AStateOfAnotherBuildIsRefused) {
  testing::TempDir dir("gradscope-state-build");
  RunConfig c = state_config("standard");
  c.steps = 2;
  c.save_state = dir.file("s");
  StopAfter stop(1);
  ASSERT_EQ(train(c, &stop).record.status, RunStatus::kInterrupted);
  const std::string path = dir.file("s/state.json");
  nlohmann::json j = parse_json_input(testing::slurp(path), path);
  EXPECT_EQ(j.value("build", ""), train_state_build());
  EXPECT_TRUE(testing::contains(train_state_build(), "LibTorch")) << train_state_build();
  j["build"] = "gradscope 0.0.1 (commit 0000000), LibTorch 0.1";
  std::ofstream(path) << j.dump() << "\n";
  c.resume = c.save_state;
  const Error e = testing::expect_usage_error([&] { Trainer t(c); });
  EXPECT_TRUE(testing::contains(e.what(), "gradscope 0.0.1 (commit 0000000)")) << e.what();
  EXPECT_TRUE(testing::contains(e.what(), train_state_build())) << e.what();
}

// Calls `action` after step `after` (a ProgressSink).
class AtStep : public ProgressSink {
 public:
  AtStep(int64_t after, std::function<void()> action) : after_(after), action_(std::move(action)) {}
  void on_step(int64_t step, int64_t, double, double, double) override {
    if (step == after_) action_();
  }

 private:
  int64_t after_;
  std::function<void()> action_;
};

// A save that fails (its folder gone, as a full disk would fail it) leaves the run going;
// one at a stop still records the run interrupted, and says the state was not saved.
TEST(TrainState, AFailedSaveNeitherEndsTheRunNorHidesTheStop) {
  testing::TempDir dir("gradscope-state-failed-save");
  RunConfig c = state_config("standard");
  c.warmup_steps = 0;
  c.steps = 3;
  c.eval_every = 0;
  c.save_state = dir.file("gone/s");
  c.state_every = 1;
  std::filesystem::create_directories(dir.file("gone"));
  const auto remove_folder = [&] { std::filesystem::remove_all(dir.file("gone")); };
  AtStep midway(2, remove_folder);
  const Trained whole = train(c, &midway);
  EXPECT_TRUE(whole.record.ok()) << whole.record.failure->message;
  EXPECT_EQ(whole.record.steps.size(), 3u);

  std::filesystem::create_directories(dir.file("gone"));
  AtStep stop(2, [&] {
    remove_folder();
    request_stop();
  });
  const Trained part = train(c, &stop);
  ASSERT_EQ(part.record.status, RunStatus::kInterrupted);
  ASSERT_TRUE(part.record.failure);
  EXPECT_TRUE(testing::contains(part.record.failure->message, "could not be saved"))
      << part.record.failure->message;
}

// Stopped before a step ran after a resume: the state resumed from stays as it was, and the
// record lists that resume once.
TEST(TrainState, AStopRightAfterAResumeKeepsTheStateAsItWas) {
  testing::TempDir dir("gradscope-state-stop-at-once");
  RunConfig c = state_config("standard");
  c.steps = 3;
  c.save_state = dir.file("s");
  StopAfter stop(2);
  ASSERT_EQ(train(c, &stop).record.status, RunStatus::kInterrupted);
  const std::string path = dir.file("s/state.json");
  const std::string before = testing::slurp(path);
  c.resume = c.save_state;
  {
    clear_stop_request();
    Trainer again(c);
    request_stop();
    const RunRecord r = again.run();
    clear_stop_request();
    EXPECT_EQ(r.status, RunStatus::kInterrupted);
    EXPECT_EQ(r.resumed_from_steps, std::vector<int64_t>{2});
  }
  EXPECT_EQ(testing::slurp(path), before);
  const Trained end = train(c);
  ASSERT_TRUE(end.record.ok());
  EXPECT_EQ(end.record.resumed_from_steps, std::vector<int64_t>{2});
}

}  // namespace
}  // namespace gradscope
