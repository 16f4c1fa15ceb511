// Run ids hold across versions: a configuration keeps the id earlier versions gave it, so that
// a resumed sweep skips what they ran and a report pools their runs with new ones.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "gradscope/core/config.h"
#include "gradscope/core/settings.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace {

struct KnownRun {
  const char* what;
  std::vector<std::pair<std::string, std::string>> settings;  // TOML key, value as text
  const char* run_id;
};

// The ids gradscope 0.1.0 (commit 048378a) computed for these configurations, each written as
// a sweep's [fixed] table and listed by `gradscope sweep FILE --dry-run`. Pairs (opt, arch)
// are NAME=VALUE, as the sweep passed them to `gradscope run`.
const std::vector<KnownRun>& known_runs() {
  static const std::vector<KnownRun> runs = {
      {"llama, every default", {{"model", "llama"}}, "dc61552a07d43c5d"},
      {"standard", {{"model", "llama"}, {"strategy", "standard"}}, "dc61552a07d43c5d"},
      {"checkpoint", {{"model", "llama"}, {"strategy", "checkpoint"}}, "84d47e0a65bdd4b6"},
      {"checkpoint, full policy",
       {{"model", "llama"}, {"strategy", "checkpoint"}, {"checkpoint_policy", "full"}},
       "84d47e0a65bdd4b6"},
      {"checkpoint of attention, every second block",
       {{"model", "llama"},
        {"strategy", "checkpoint"},
        {"checkpoint_policy", "attention"},
        {"checkpoint_every", "2"}},
       "f3f64a6b9b9b8383"},
      {"accumulation of 4",
       {{"model", "llama"}, {"strategy", "accumulation"}, {"accum_steps", "4"}},
       "1d4e320eb6218798"},
      {"checkpoint+accumulation of 4",
       {{"model", "llama"}, {"strategy", "checkpoint+accumulation"}, {"accum_steps", "4"}},
       "998b74477097a8bb"},
      {"fused", {{"model", "llama"}, {"strategy", "fused"}}, "12e650da681bcb38"},
      {"sgd with --opt",
       {{"model", "vit"},
        {"optimizer", "sgd"},
        {"lr", "0.05"},
        {"opt", "momentum=0.9"},
        {"opt", "nesterov=true"}},
       "87cb8717fb01e3cb"},
      {"--arch override",
       {{"model", "llama"}, {"arch", "num_hidden_layers=2"}},
       "ba42bdba3a6bd2dd"},
      {"lr auto",
       {{"model", "llama"},
        {"lr", "auto"},
        {"lr_search_trials", "3"},
        {"lr_search_steps", "5"},
        {"lr_search_span", "0.5"}},
       "7c95f8a863209180"},
      {"dropout", {{"model", "modernbert"}, {"dropout", "0.1"}}, "8b8e023bab4fdfaf"},
      {"memory cap", {{"model", "llama"}, {"memory_cap", "64MiB"}}, "382a743ca9864472"},
      {"shape, schedule and dtype",
       {{"model", "llama"},
        {"optimizer", "adamw"},
        {"batch", "4"},
        {"seq", "64"},
        {"steps", "30"},
        {"warmup_steps", "1"},
        {"seed", "3"},
        {"weight_decay", "0.01"},
        {"lr_schedule", "cosine"},
        {"lr_warmup_steps", "5"},
        {"clip_grad_norm", "1"},
        {"eval_every", "10"},
        {"eval_batches", "2"},
        {"dtype", "bf16"}},
       "094db9978c64ffe4"},
      {"toy problem",
       {{"model", "rosenbrock"}, {"optimizer", "cg"}, {"opt", "beta_rule=pr"}},
       "0506e24594ecea8f"},
      {"another tokenizer",
       {{"model", "nanovlm"}, {"preset", "tiny"}, {"tokenizer", "bytes"}},
       "9bf49108338544f2"},
  };
  return runs;
}

// The configuration as `gradscope run` reads it: each value through the settings table.
RunConfig config_of(const std::vector<std::pair<std::string, std::string>>& settings) {
  RunConfig c;
  for (const auto& [key, value] : settings) {
    const Setting* s = find_setting(key);
    if (s == nullptr) {
      ADD_FAILURE() << "no setting " << key;
      continue;
    }
    s->parse(c, value);
  }
  return c;
}

TEST(RunIdStability, ConfigurationsKeepTheIdsOfVersionZeroOne) {
  for (const KnownRun& run : known_runs()) {
    SCOPED_TRACE(run.what);
    const RunConfig c = config_of(run.settings);
    EXPECT_EQ(run_id_for(c), run.run_id);
    EXPECT_EQ(resolve_run(c).run_id, run.run_id);
  }
}

// Without --strategy the settings say how a step is computed: --accum-steps 4 alone is the
// accumulation strategy, the same run as asking for it by name.
TEST(RunIdStability, AccumulationBySettingsIsAccumulationByName) {
  const RunConfig by_settings = config_of({{"model", "llama"}, {"accum_steps", "4"}});
  EXPECT_EQ(by_settings.step_plan().strategy_name(), "accumulation");
  EXPECT_EQ(run_id_for(by_settings), "1d4e320eb6218798");
}

}  // namespace
}  // namespace gradscope
