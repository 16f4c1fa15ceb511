// The study's grid (4 models x 5 optimizers x 3 memory strategies) runs at the tiny presets.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "gradscope/train/trainer.h"
#include "test_util.h"

namespace gradscope {
namespace {

TEST(StudyGrid, EveryModelOptimizerAndStrategyRunsAtTiny) {
  const auto start = std::chrono::steady_clock::now();
  int runs = 0;
  for (const std::string model : {"vit", "modernbert", "llama", "nanovlm"}) {
    for (const std::string optimizer : {"sgd", "adam", "adagrad", "adadelta", "cg"}) {
      for (const std::string strategy : {"standard", "checkpoint", "accumulation"}) {
        RunConfig c;
        c.model = model;
        c.optimizer = optimizer;
        c.strategy = parse_strategy(strategy);
        c.batch = 2;
        c.accum_steps = strategy == "accumulation" ? 2 : 1;
        c.steps = 2;
        c.warmup_steps = 0;
        c.eval_batches = 1;
        c.quiet = true;
        if (model == "llama" || model == "modernbert")
          c.dataset = testing::fixture("text/sotu-excerpt.txt");
        const auto r = record_to_json(Trainer(c).run());
        const std::string label = model + " / " + optimizer + " / " + strategy;
        EXPECT_EQ(r["status"], "ok") << label << ": " << r["failure"].dump();
        ASSERT_EQ(r["steps"].size(), 2u) << label;
        for (const auto& s : r["steps"])
          EXPECT_TRUE(std::isfinite(s["loss"].get<double>())) << label;
        ++runs;
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("study grid: %d runs in %.1f s\n", runs, seconds);
  EXPECT_EQ(runs, 60);
}

}  // namespace
}  // namespace gradscope
