// `gradscope verify`: one step of each memory strategy against standard training on the whole
// effective batch; exit 0 iff every check holds.
#include "gradscope/strategy/verify.h"
#include "gradscope/cli/commands.h"
#include "gradscope/core/error.h"

namespace gradscope {
namespace {

struct VerifyOptions {
  RunConfig config;
  std::vector<std::string> strategies;
};

}  // namespace

void add_verify_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<VerifyOptions>();
  RunConfig& c = o->config;
  c.batch = 2;
  c.accum_steps = 4;
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
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--model", c.model, "Architecture (see `gradscope list`)")->capture_default_str();
  cmd->add_option("--preset", c.preset, "tiny, small or paper")->capture_default_str();
  cmd->add_option("--strategy", o->strategies,
                  "Strategy to check (repeatable; default: every strategy but standard)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--batch", c.batch, "Micro-batch size")->capture_default_str();
  cmd->add_option("--accum-steps", c.accum_steps,
                  "Micro-batches of the accumulating strategies (at least 2)")
      ->capture_default_str();
  cmd->add_option("--seq", c.seq_len, "Sequence length (default: the preset's)");
  cmd->add_option("--seed", c.seed, "Seed of weights and data")->capture_default_str();
  cmd->add_option("--device", c.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dataset", c.dataset, "Data set (default: the model's)");
  cmd->add_option("--tokenizer", c.tokenizer, "Tokenizer (default: the preset's)");
  cmd->callback([o, &exit_code] {
    const RunConfig& c = o->config;
    check_usage(c.batch > 0, fmt::format("--batch {} must be positive", c.batch),
                "pass --batch with a value of at least 1");
    check_usage(c.accum_steps > 0, fmt::format("--accum-steps {} must be positive", c.accum_steps),
                "pass --accum-steps 2 or more");
    check_usage(c.seq_len >= 0, fmt::format("--seq {} must be positive", c.seq_len),
                "leave --seq out for the preset's sequence length");
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
