// The sweep files gradscope ships (configs/sweeps/): each loads and every run resolves as
// `gradscope run` parses it; every configuration has the seeds a verdict needs; and every run
// of one model is evaluated on the same validation samples, so that a comparison of
// validation losses across strategies compares models, not sample sets.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "gradscope/cli/commands.h"
#include "gradscope/core/config.h"
#include "gradscope/report/claims.h"
#include "gradscope/sweep/grid.h"

namespace gradscope {
namespace {

std::vector<std::string> shipped_sweep_files() {
  std::vector<std::string> files;
  const std::filesystem::path dir = std::filesystem::path(GRADSCOPE_SOURCE_DIR) / "configs/sweeps";
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".toml") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// The validation samples an evaluation reads: eval_batches effective batches, taken from the
// start of the split in micro-batches (Trainer::evaluate).
int64_t evaluated_samples(const RunConfig& c) { return c.eval_batches * c.effective_batch(); }

TEST(ShippedGrids, EveryRunResolvesWithSeedsEnoughAndOneValidationSetPerModel) {
  const std::vector<std::string> files = shipped_sweep_files();
  ASSERT_GE(files.size(), 4u);
  for (const std::string& file : files) {
    SCOPED_TRACE(file);
    const Sweep sweep = load_sweep(file);
    std::map<std::tuple<std::string, std::string, int64_t>, std::set<int64_t>> samples;
    std::map<std::string, std::set<uint64_t>> seeds;  // configuration (args less seed) -> seeds
    for (const RunSpec& run : sweep.runs) {
      const RunConfig c = parse_run_arguments(run.args());
      samples[{c.model, c.preset, c.seq_len}].insert(evaluated_samples(c));
      RunSpec without_seed = run;
      without_seed.values.erase("seed");
      std::string key;
      for (const std::string& a : without_seed.args()) key += a + '\x1f';
      seeds[key].insert(c.seed);
    }
    for (const auto& [model, counts] : samples)
      EXPECT_EQ(counts.size(), 1u)
          << std::get<0>(model) << " " << std::get<1>(model) << ": evaluations of " << counts.size()
          << " different sizes (samples " << *counts.begin() << ", " << *counts.rbegin() << ")";
    // The study's rate grid decides no verdict: it runs one seed the study never compares,
    // to choose the rates the study's runs use (configs/sweeps/study-rates.toml).
    if (std::filesystem::path(file).filename() == "study-rates.toml") continue;
    for (const auto& [config, s] : seeds)
      EXPECT_GE(static_cast<int>(s.size()), kMinSeeds) << config;
  }
}

// What docs/study.md and results/cpu-tiny/ say of the study grid: no learning rate of its own
// (scripts/study.sh appends the picked ones), seeds 0-2 everywhere and 3-7 where a verdict
// turns on them.
TEST(ShippedGrids, TheStudyGridIsTheOneItsDocsDescribe) {
  const Sweep sweep =
      load_sweep(std::string(GRADSCOPE_SOURCE_DIR) + "/configs/sweeps/study-cpu.toml");
  // 4 models x 5 optimizers x 4 step settings x 3 seeds, and 5 more seeds for 10 of them.
  ASSERT_EQ(sweep.runs.size(), 290u);
  std::set<std::string> models, optimizers;
  std::map<std::string, std::set<uint64_t>> seeds;  // "model optimizer strategy batch"
  int same_micro = 0, same_effective = 0;
  for (const RunSpec& run : sweep.runs) {
    const RunConfig c = parse_run_arguments(run.args());
    models.insert(c.model);
    optimizers.insert(c.optimizer);
    EXPECT_EQ(c.preset, "tiny");
    EXPECT_FALSE(c.lr_auto);
    EXPECT_EQ(c.lr, 0);  // the rates come from the rates grid, appended by scripts/study.sh
    EXPECT_EQ(c.threads, 1);  // one thread: the same arithmetic on every rerun
    EXPECT_EQ(c.steps, 400);
    if (c.accum_steps > 1) (c.batch == 8 ? same_micro : same_effective) += 1;
    seeds[c.model + " " + c.optimizer + " " + run.values.at("strategy") + " " +
          std::to_string(c.batch)]
        .insert(c.seed);
  }
  EXPECT_EQ(models, (std::set<std::string>{"vit", "modernbert", "llama", "nanovlm"}));
  EXPECT_EQ(optimizers, (std::set<std::string>{"sgd", "adam", "adagrad", "adadelta", "cg"}));
  const std::set<std::string> eight = {
      "modernbert adam standard 8", "modernbert adadelta standard 8", "modernbert sgd standard 8",
      "llama adam standard 8",      "llama adadelta standard 8",      "llama sgd standard 8",
      "nanovlm adam standard 8",    "nanovlm adam accumulation 8",    "nanovlm cg standard 8",
      "nanovlm cg accumulation 8"};
  EXPECT_EQ(seeds.size(), 80u);
  for (const auto& [config, s] : seeds)
    EXPECT_EQ(s, eight.count(config) ? (std::set<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7})
                                     : (std::set<uint64_t>{0, 1, 2}))
        << config;
  EXPECT_EQ(same_micro, 60 + 10);
  EXPECT_EQ(same_effective, 60);
}

// The dropout grid: the three models without dropout of their own, at 0.1, standard and
// checkpointed, with Adam, as the main grid runs them otherwise.
TEST(ShippedGrids, TheDropoutGridRunsWhatItsCommentSays) {
  const Sweep sweep =
      load_sweep(std::string(GRADSCOPE_SOURCE_DIR) + "/configs/sweeps/study-dropout.toml");
  ASSERT_EQ(sweep.runs.size(), 18u);  // 3 models x 2 steps x 3 seeds
  for (const RunSpec& run : sweep.runs) {
    const RunConfig c = parse_run_arguments(run.args());
    EXPECT_NE(c.model, "vit");
    EXPECT_EQ(c.optimizer, "adam");
    ASSERT_TRUE(c.dropout.has_value());
    EXPECT_EQ(*c.dropout, 0.1);
    EXPECT_EQ(c.accum_steps, 1);
    EXPECT_EQ(c.steps, 400);
    EXPECT_EQ(c.threads, 1);
    EXPECT_EQ(c.lr, 0);
  }
}

}  // namespace
}  // namespace gradscope
