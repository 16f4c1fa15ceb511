// The optimizer step after backward: a line search (cg) evaluates one function per step.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/settings.h"
#include "gradscope/strategy/rng_state.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/strategy/updater.h"
#include "strategy/tiny_llama.h"

namespace gradscope {
namespace {

using testing::text_batch;
using testing::tiny_llama;

struct SilentObserver : PhaseObserver {
  void enter(Phase) override {}
};

// A standard step's gradients over one fixed batch on a tiny Llama with dropout 0.3, each
// evaluation recorded: its loss and the parameters it was taken at.
struct RecordedLineSearch {
  std::shared_ptr<Model> model = tiny_llama(0.3);
  std::unique_ptr<Strategy> strategy;
  std::unique_ptr<Updater> updater;
  Batch batch = text_batch(4, 16, 31);
  SilentObserver observer;
  std::vector<double> losses;
  std::vector<std::vector<torch::Tensor>> points;

  RecordedLineSearch() {
    RunConfig c;
    find_setting("strategy")->parse(c, "standard");
    strategy = std::make_unique<Strategy>(c.step_plan());
    strategy->attach(*model);
    OptimizerSpec spec;
    spec.name = "cg";
    spec.lr = 1e-2;
    updater = make_updater(c.step_plan(), model->parameters(), spec, UpdaterOptions{});
  }

  StepOutput gradients() {
    std::vector<torch::Tensor> point;
    for (const auto& p : model->parameters()) point.push_back(p.detach().clone());
    points.push_back(point);
    const Batch b = batch;
    const StepOutput out = strategy->compute_gradients(
        *model, [b](int64_t) { return b; }, observer);
    losses.push_back(out.loss_sum.item<double>() / static_cast<double>(out.target_count));
    return out;
  }

  UpdateResult step() {
    return updater->step([this] { return gradients(); }, observer);
  }

  // The loss at `point` with the generators at `rng`, the parameters put back afterwards.
  double loss_at(const std::vector<torch::Tensor>& point, const RngState& rng) {
    std::vector<torch::Tensor> saved;
    torch::NoGradGuard no_grad;
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      saved.push_back(params[i].detach().clone());
      params[i].copy_(point[i]);
    }
    rng.restore();
    const LossOutput out = model->loss(batch);
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);
    return out.loss_sum.item<double>() / static_cast<double>(out.target_count);
  }
};

// Every evaluation of a line search's step is of one function: re-evaluated with the
// generators where the step found them, each trial point gives the very loss the search saw.
// With fresh dropout masks per evaluation, the trial points' losses were of other functions.
TEST(LineSearchUpdater, EveryEvaluationOfAStepSeesTheSameDropoutMasks) {
  torch::manual_seed(99);
  RecordedLineSearch search;
  const RngState start = RngState::capture(torch::kCPU);
  const UpdateResult r = search.step();
  ASSERT_GE(r.evaluations, 2) << "the line search took no trial point";
  ASSERT_EQ(search.losses.size(), static_cast<size_t>(r.evaluations));
  const RngState after = RngState::capture(torch::kCPU);
  // Float32 rounding may differ with the graph off (1e-7); other masks move the loss by more
  // than 1e-4 relative.
  for (size_t e = 0; e < search.losses.size(); ++e)
    EXPECT_NEAR(search.loss_at(search.points[e], start), search.losses[e], 1e-6 * search.losses[e])
        << "evaluation " << e;
  after.restore();
}

// After the step the generators are where one evaluation leaves them, however many trial
// points the search took: the next step draws fresh masks, and the stream is the seed's.
TEST(LineSearchUpdater, LeavesTheGeneratorWhereTheFirstEvaluationDid) {
  torch::manual_seed(98);
  RecordedLineSearch search;
  const RngState start = RngState::capture(torch::kCPU);
  // One evaluation's draws, from the same state: dropout on the same shapes.
  search.gradients();
  const torch::Tensor after_one = RngState::capture(torch::kCPU).cpu;
  for (auto& p : search.model->parameters()) p.mutable_grad() = torch::Tensor();
  start.restore();
  const UpdateResult r = search.step();
  ASSERT_GE(r.evaluations, 2);
  const torch::Tensor after_step = RngState::capture(torch::kCPU).cpu;
  EXPECT_TRUE(torch::equal(after_step, after_one));
  EXPECT_FALSE(torch::equal(after_step, start.cpu));  // the next step draws fresh masks
}

}  // namespace
}  // namespace gradscope
