// --lr auto: the grid, the trials it records, and the choice among them.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "gradscope/models/registry.h"
#include "gradscope/optim/factory.h"
#include "gradscope/train/lr_search.h"
#include "gradscope/train/session.h"
#include "test_util.h"

namespace gradscope {
namespace {

TEST(LrSearchGrid, IsLogSpacedAroundTheCentre) {
  const auto grid = lr_search_grid(1e-3, 5, 1.0);
  ASSERT_EQ(grid.size(), 5u);
  const double expected[] = {1e-4, std::sqrt(10.0) * 1e-4, 1e-3, std::sqrt(10.0) * 1e-3, 1e-2};
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(grid[i], expected[i], 1e-12 * expected[i]) << i;
  EXPECT_EQ(lr_search_grid(3e-4, 1, 2.0), std::vector<double>{3e-4});
  testing::expect_usage_error([] { lr_search_grid(1e-3, 0, 1.0); });
  testing::expect_usage_error([] { lr_search_grid(1e-3, 3, -1.0); });
}

// SGD on a quadratic whose largest curvature is 10: learning rates above 0.2 blow up, tiny
// ones barely move. Three decades either side of the default (1e-3) span both; the search
// keeps every trial and picks the lowest validation loss, which is neither end.
TEST(LrSearch, KeepsEveryTrialAndPicksTheLowestValidationLoss) {
  RunConfig c;
  c.model = "quadratic";
  c.optimizer = "sgd";
  c.batch = 1;
  c.quiet = true;
  c.lr_auto = true;
  c.lr_search_trials = 5;
  c.lr_search_steps = 30;
  c.lr_search_span = 3.0;
  const auto result = search_learning_rate(c);
  ASSERT_EQ(result.trials.size(), 5u);
  const auto grid = lr_search_grid(default_lr("sgd", "quadratic"), 5, 3.0);
  double best = INFINITY, best_lr = 0;
  for (size_t i = 0; i < 5; ++i) {
    const auto& t = result.trials[i];
    EXPECT_DOUBLE_EQ(t.lr, grid[i]);
    EXPECT_EQ(t.steps, 30);
    if (t.status == "ok" && *t.val_loss < best) {
      best = *t.val_loss;
      best_lr = grid[i];
    }
  }
  EXPECT_EQ(result.best_lr, best_lr);
  EXPECT_GT(result.best_lr, grid.front());
  EXPECT_LT(result.best_lr, grid.back());
}

// The rows of a batch's inputs, as token sequences.
std::set<std::vector<int64_t>> rows(const Batch& b) {
  std::set<std::vector<int64_t>> out;
  const auto ids = b.input_ids.contiguous();
  for (int64_t i = 0; i < ids.size(0); ++i) {
    const int64_t* p = ids[i].data_ptr<int64_t>();
    out.insert(std::vector<int64_t>(p, p + ids.size(1)));
  }
  return out;
}

size_t shared_rows(const std::set<std::vector<int64_t>>& a,
                   const std::set<std::vector<int64_t>>& b) {
  size_t n = 0;
  for (const auto& row : a) n += b.count(row);
  return n;
}

// The search must not choose the rate on the samples the run then reports its validation
// loss on: its trials evaluate on a split of the training side, and do not train on it.
TEST(LrSearch, EvaluatesOnASplitDisjointFromTheReportedValidation) {
  RunConfig c = testing::tiny_llama_config();
  c.lr_auto = true;
  const ResolvedRun resolved = resolve_run(c);
  const auto run = make_data_source(model_registry().get(c.model), resolved.arch, c);
  const auto search = lr_search_data(c);
  const auto reported = rows(run->val_batch(0, run->val_samples()));
  const auto searched = rows(search->val_batch(0, search->val_samples()));
  ASSERT_GT(searched.size(), 5u);
  EXPECT_EQ(shared_rows(searched, reported), 0u)
      << "the search evaluates on the validation windows the run reports";
  // The trials' training windows (one epoch) are neither.
  const auto d = search->describe();
  const auto trained = rows(search->train_batch(0, d["train_windows"].get<int64_t>()));
  EXPECT_EQ(shared_rows(trained, searched), 0u);
  EXPECT_EQ(shared_rows(trained, reported), 0u);
  // The search split is as long as the validation split, just before it; the run's record
  // says so.
  const auto described = run->describe();
  EXPECT_EQ(d["val_tokens"], described["val_tokens"]);
  EXPECT_EQ(described["lr_search_split"]["search_tokens"], described["val_tokens"]);
  EXPECT_EQ(d["train_tokens"].get<int64_t>(),
            described["train_tokens"].get<int64_t>() - described["val_tokens"].get<int64_t>());
}

}  // namespace
}  // namespace gradscope
