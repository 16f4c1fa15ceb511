// --lr auto: the grid, the trials it records, and the choice among them.
#include <gtest/gtest.h>

#include <cmath>

#include "gradscope/optim/factory.h"
#include "gradscope/train/lr_search.h"
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

}  // namespace
}  // namespace gradscope
