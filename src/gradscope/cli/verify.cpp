// `gradscope verify`: one step of each memory strategy against standard training on the whole
// effective batch; exit 0 iff every check holds.
#include "gradscope/train/verify.h"

#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "gradscope/cli/commands.h"
#include "gradscope/cli/settings_options.h"
#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"
#include "gradscope/comm/comm.h"
#include "gradscope/measure/peak.h"
#include "gradscope/train/rank_meeting.h"

namespace gradscope {
namespace {

struct VerifyCliOptions {
  SettingOptions settings;
  std::vector<std::string> strategies;
  std::vector<std::string> dtypes;
};

// verify's defaults: micro-batches of 2, 4 of them for the accumulating strategies.
RunConfig verify_defaults() {
  RunConfig c;
  c.batch = 2;
  c.accum_steps = 4;
  return c;
}

// The run settings verify takes, from the settings table: those that define a run's model,
// optimizer, step, shape and device, but for those each check sets itself, and how the ranks
// meet (--dist-timeout, and across hosts --nproc-per-node, --node-rank, --master-addr,
// --master-port, --ifname).
std::vector<std::string> verify_setting_names() {
  // Set by verify: --strategy and --dtype (its own options) say which strategies and dtypes
  // are checked, and the step's parts with them; dropout is forced on or off per check; a
  // check is one step at the optimizer's own rate, so the run's length, schedule and rate
  // search do not apply; with --nproc every --shard mode is checked; memory limits are a
  // run's.
  static const std::set<std::string> set_by_verify = {
      "strategy",        "optimizer-step",  "dtype",          "dropout",
      "lora-dropout",    "steps",           "warmup-steps",   "lr-schedule",
      "lr-warmup-steps", "lr-search-trials", "lr-search-steps", "lr-search-span",
      "shard",           "grad-reduce",     "memory-cap"};
  static const std::set<SettingSection> sections = {
      SettingSection::kModel, SettingSection::kOptimizer,
      SettingSection::kStep, SettingSection::kShape,
      SettingSection::kDevice};
  std::vector<std::string> names;
  for (const Setting& s : run_settings()) {
    const bool defines = s.role == SettingRole::kDefines && sections.count(s.section) > 0;
    static const std::set<std::string> meeting = {"dist-timeout", "nproc-per-node", "node-rank",
                                                  "master-addr",  "master-port",    "ifname"};
    if ((defines && set_by_verify.count(s.name) == 0) || meeting.count(s.name) > 0)
      names.push_back(s.name);
  }
  return names;
}

// Several ranks: each runs every --shard mode's checks; a check that failed on any rank fails
// on all (each rank compares its own copy). Returns false on a rank other than 0, which prints
// nothing; `exit_code` is then set.
bool verify_ranks(const RunConfig& c, const RankEnv& env, const VerifyOptions& options,
                  std::vector<VerifyCheck>& checks, int& exit_code) {
  check_usage(env.world == c.nproc,
              fmt::format("--nproc {} but {} started {} ranks", c.nproc, env.launcher, env.world),
              "pass --nproc equal to the launcher's number of ranks");
  torch::Device device = parse_device(c.device);
  if (device.is_cuda() && !device.has_index())  // a GPU per rank, as a run's session does
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  RankEnv meeting = env;
  if (!c.ifname.empty()) meeting.ifname = c.ifname;
  const auto comm = connect_ranks(meeting, device, c.dist_timeout_s);
  check_same_run(*comm, c);
  checks = verify_sharding(c, comm, options);
  torch::Tensor failed = torch::zeros({static_cast<int64_t>(checks.size())}, torch::kFloat64);
  for (size_t i = 0; i < checks.size(); ++i)
    failed[static_cast<int64_t>(i)] = checks[i].passed ? 0 : 1;
  comm->allreduce(failed);
  bool all = true;
  for (size_t i = 0; i < checks.size(); ++i) {
    checks[i].passed = failed[static_cast<int64_t>(i)].item<double>() == 0;
    all = all && checks[i].passed;
  }
  if (comm->rank() == 0) return true;
  exit_code = all ? 0 : 1;
  return false;
}

// The checks' table, then one summary line per dtype, in the order checked. Whether all hold.
bool print_checks(const std::vector<VerifyCheck>& checks) {
  fmt::print("{:<48} {:<5} {:<24} {:>11} {:>11} {:>11}  {:<6} {}\n", "strategy", "dtype",
             "criterion", "loss |d|", "grad max|d|", "grad rel", "result", "worst tensor");
  bool all = true;
  for (const auto& k : checks) {
    fmt::print("{:<48} {:<5} {:<24} {:>11.3e} {:>11.3e} {:>11.3e}  {:<6} {}\n", k.strategy,
               dtype_name(k.dtype), k.criterion, k.loss_abs_diff, k.grad_max_abs_diff,
               k.grad_max_rel_diff, k.passed ? "ok" : "FAIL", k.worst_tensor);
    all = all && k.passed;
  }
  std::vector<Dtype> order;
  for (const auto& k : checks)
    if (std::find(order.begin(), order.end(), k.dtype) == order.end()) order.push_back(k.dtype);
  for (const Dtype dtype : order) {
    int64_t held = 0, of = 0, tensors = 0;
    for (const auto& k : checks) {
      if (k.dtype != dtype) continue;
      ++of;
      held += k.passed ? 1 : 0;
      tensors = k.tensors;
    }
    fmt::print("{}: {} of {} checks hold ({} gradient tensors each)\n", dtype_name(dtype), held,
               of, tensors);
  }
  return all;
}

constexpr const char* kVerifyHelp =
    "Prove the memory strategies exact: one step of each strategy from identical weights\n"
    "and data against standard training on the whole effective batch (batch x accum-steps),\n"
    "in fp32 and under bf16 autocast, each against standard training in the same dtype.\n"
    "Checkpointing must give bitwise-equal gradients on the CPU with dropout 0.1 forced on,\n"
    "in bf16 too (the recompute runs the forward's kernels on its inputs; on CUDA within\n"
    "1e-6, bf16 1e-2); accumulating strategies must agree within ||a-b||/||b|| <= 1e-5 per\n"
    "gradient tensor with dropout off (2e-2 in bf16: each micro-batch's products round to\n"
    "bfloat16's 2^-8 apart). The fused optimizer step must leave the parameters of standard\n"
    "training + the unfused optimizer after one step: bitwise for SGD on the CPU, within\n"
    "1e-6 per tensor otherwise. A parameter left without a gradient fails its check.\n"
    "On models with a language-model head, standard and each strategy are checked again\n"
    "with the loss taken over chunks of positions (--loss chunked; chunks of --loss-chunk\n"
    "positions, else 37), against the same full-loss reference: relative <= 1e-5 (2e-2 in\n"
    "bf16: each chunk's weight-gradient product rounds to bfloat16 apart) on top of the\n"
    "strategy's own tolerance.\n"
    "Checkpointing with its kept input rounded to bfloat16 (--saved-input bf16), a lossy\n"
    "method, must stay within relative 2e-2 of standard training (the recompute runs from an\n"
    "input within 2^-9 of the forward's; on top of the recompute's own tolerance).\n"
    "With --nproc N: instead, every --shard mode the optimizer allows (ddp, zero1, zero2,\n"
    "fsdp, and fsdp with --grad-reduce reduce-scatter) over 2 steps of N ranks with\n"
    "micro-batch --batch against one process with N x --batch, dropout off: the losses and\n"
    "what the steps moved each parameter by, relative <= 1e-5 (2e-2 in bf16; the ranks\n"
    "reorder the batch's sums).\n"
    "Prints the differences; exit 0 iff every check holds.\n"
    "Example: gradscope verify --model llama --strategy checkpoint\n"
    "         gradscope verify --model llama --nproc 2";

}  // namespace

void add_verify_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<VerifyCliOptions>();
  CLI::App* cmd = root.add_subcommand("verify", kVerifyHelp);
  o->settings.add_to(cmd, verify_defaults(), verify_setting_names());
  cmd->add_option("--strategy", o->strategies,
                  "Strategy to check (repeatable; default: every strategy but standard)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--dtype", o->dtypes,
                  "Dtype to check in: fp32 or bf16 (repeatable; default: both)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->callback([o, &exit_code] {
    RunConfig c = verify_defaults();
    o->settings.apply(c);
    // Every mode is checked in turn; the settings' check wants one named.
    if (c.nproc > 1) c.shard = Shard::kDdp;
    check_config(c);
    VerifyOptions options;
    options.strategies = o->strategies;
    options.chunked_loss = true;
    options.attention = true;
    options.saved_input = true;
    for (const auto& name : o->dtypes) {
      const auto dtype = parse_dtype(name);
      check_usage(dtype.has_value(), "--dtype '" + name + "' is not a dtype",
                  "pass --dtype fp32 or --dtype bf16, or leave it out to check both");
      options.dtypes.push_back(*dtype);
    }
    std::vector<VerifyCheck> checks;
    if (c.nproc > 1) {
      // Several ranks: this process starts them (and returns rank 0's exit code), or is one.
      const std::optional<RankEnv> env = rank_env_from_environment();
      if (!env) {
        exit_code = launch_local_ranks(c, [](const RunRecord&) {});
        return;
      }
      if (!verify_ranks(c, *env, options, checks, exit_code)) return;
    } else {
      checks = verify_strategies(c, options);
    }
    exit_code = print_checks(checks) ? 0 : 1;
  });
}

}  // namespace gradscope
