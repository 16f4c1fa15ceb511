// `gradscope verify`: one step of each memory strategy against standard training on the whole
// effective batch; exit 0 iff every check holds.
#include "gradscope/train/verify.h"
#include "gradscope/cli/commands.h"
#include "gradscope/cli/settings_options.h"
#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"

namespace gradscope {
namespace {

struct VerifyOptions {
  SettingOptions settings;
  std::vector<std::string> strategies;
};

// verify's defaults: micro-batches of 2, 4 of them for the accumulating strategies.
RunConfig verify_defaults() {
  RunConfig c;
  c.batch = 2;
  c.accum_steps = 4;
  return c;
}

}  // namespace

void add_verify_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<VerifyOptions>();
  CLI::App* cmd = root.add_subcommand(
      "verify",
      "Prove the memory strategies exact: one step of each strategy from identical weights\n"
      "and data against standard training on the whole effective batch (batch x accum-steps).\n"
      "Checkpointing must give bitwise-equal gradients on the CPU with dropout 0.1 forced on;\n"
      "accumulating strategies must agree within ||a-b||/||b|| <= 1e-5 per gradient tensor\n"
      "with dropout off. The fused optimizer step must leave the parameters of standard\n"
      "training + the unfused optimizer after one step: bitwise for SGD on the CPU, within\n"
      "1e-6 per tensor otherwise. Prints the differences; exit 0 iff every check holds.\n"
      "Example: gradscope verify --model llama --strategy checkpoint");
  o->settings.add_to(cmd, verify_defaults(),
                     {"model", "preset", "batch", "accum-steps", "seq", "seed", "device", "dataset",
                      "tokenizer", "optimizer", "recompute", "checkpoint-every"});
  cmd->add_option("--strategy", o->strategies,
                  "Strategy to check (repeatable; default: every strategy but standard)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->callback([o, &exit_code] {
    RunConfig c = verify_defaults();
    o->settings.apply(c);
    check_config(c);
    const auto checks = verify_strategies(c, o->strategies);
    fmt::print("{:<26} {:<24} {:>11} {:>11} {:>11}  {:<6} {}\n", "strategy", "criterion",
               "loss |d|", "grad max|d|", "grad rel", "result", "worst tensor");
    bool all = true;
    for (const auto& k : checks) {
      fmt::print("{:<26} {:<24} {:>11.3e} {:>11.3e} {:>11.3e}  {:<6} {}\n", k.strategy, k.criterion,
                 k.loss_abs_diff, k.grad_max_abs_diff, k.grad_max_rel_diff,
                 k.passed ? "ok" : "FAIL", k.worst_tensor);
      all = all && k.passed;
    }
    fmt::print("{} of {} checks hold ({} gradient tensors each)\n",
               std::count_if(checks.begin(), checks.end(), [](const auto& k) { return k.passed; }),
               checks.size(), checks.empty() ? 0 : checks.front().tensors);
    exit_code = all ? 0 : 1;
  });
}

}  // namespace gradscope
