// `gradscope estimate`: peak memory by component and FLOPs per step, predicted without
// training; with --memory-budget, whether the run fits and which strategy and optimizer
// combinations would; with --max-batch, the largest micro-batch that fits.
#include "gradscope/train/estimate.h"
#include "gradscope/cli/commands.h"
#include "gradscope/train/comm_estimate.h"
#include "gradscope/cli/settings_options.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/settings.h"
#include "gradscope/optim/factory.h"

namespace gradscope {
namespace {

struct EstimateOptions {
  SettingOptions settings;
  std::string budget, json;
  std::string link, intra_link, device_flops;
  bool max_batch = false;
  bool no_data = false;
};

std::string mib(int64_t bytes) { return format_bytes(bytes); }

void print_estimate(const RunConfig& c, const MemoryEstimate& e) {
  fmt::print("{} {} | {} | {} | batch {} x {} accumulation steps\n", c.model, c.preset, c.optimizer,
             c.strategy_label(), c.batch, c.accum_steps);
  if (e.sharded)
    fmt::print(
        "per rank of {} (--shard {}): its micro-batch of {}, its share of the state; "
        "{} of {} parameter elements\n",
        e.nproc, e.shard, c.batch, e.shard_elements, e.flat_elements);
  const std::pair<const char*, int64_t> rows[] = {
      {"parameters", e.params_bytes},
      {"  of which frozen", e.frozen_params_bytes},
      {"gradients", e.grads_bytes},
      {"optimizer state", e.optimizer_state_bytes},
      {"activations (saved)", e.activations_bytes},
      {"  of which logits", e.logits_bytes},
      {"batch and tables", e.batch_bytes},
      {"data set", e.data_bytes},
  };
  for (const auto& [name, bytes] : rows) fmt::print("  {:<22} {:>12}\n", name, mib(bytes));
  if (e.sharded)
    fmt::print("  {:<22} {:>12}  (most at once)\n", "collective buffers",
               mib(e.collective_buffers_bytes));
  fmt::print("  peak by phase:         forward {}, backward {}, optimizer {}, eval {}{}\n",
             mib(e.forward_peak_bytes), mib(e.backward_peak_bytes), mib(e.optimizer_peak_bytes),
             mib(e.eval_peak_bytes),
             e.comm_peak_bytes > 0 ? ", communication " + mib(e.comm_peak_bytes) : "");
  fmt::print("  estimated peak         {:>12}  (in {}{})\n", mib(e.peak_bytes), e.peak_phase,
             e.sharded ? ", per rank" : "");
  fmt::print("  FLOPs per step         {:>12}  model (3 x forward), {} with recompute{}\n",
             format_si(e.model_flops_per_step), format_si(e.hardware_flops_per_step),
             e.sharded ? ", per rank" : "");
  for (const auto& note : e.notes) fmt::print("  note: {}\n", note);
}

// The alternatives to the run, at the same effective batch: every optimizer the estimate
// compares (OptimizerEntry::compared_in_estimate) under each strategy, printed as a table and
// returned as JSON.
nlohmann::json compare_alternatives(const RunConfig& c, const MemoryEstimate& e, int64_t data,
                                    int64_t budget) {
  // Accumulation splits the effective batch in k micro-batches (k = --accum-steps, or 4 when
  // that is 1 and divides the batch).
  const int64_t effective = c.effective_batch();
  const int64_t k = c.accum_steps > 1 ? c.accum_steps : (effective % 4 == 0 ? 4 : 2);
  nlohmann::json combos = nlohmann::json::array();
  fmt::print("{:<12} {:<26} {:>8} {:>12}  {}\n", "optimizer", "strategy", "micro", "peak",
             "fits");
  for (const std::string& opt :
       optimizers_where([](const OptimizerEntry& entry) { return entry.compared_in_estimate; })) {
    for (const char* strategy : {"standard", "checkpoint", "accumulation"}) {
      RunConfig alt = c;
      alt.optimizer = opt;
      alt.opt.clear();
      // The shorthand, keeping what a checkpoint recomputes however it was asked for.
      alt.strategy = parse_strategy(strategy);
      if (c.recompute && *c.recompute != Recompute::kNone)
        alt.checkpoint_policy = c.recompute;
      alt.recompute.reset();
      alt.optimizer_step.reset();
      const bool accum = std::string(strategy) == "accumulation";
      if (accum && effective % k != 0) continue;
      alt.accum_steps = accum ? k : 1;
      alt.batch = effective / alt.accum_steps;
      const std::string label =
          accum ? fmt::format("accumulation (k={})", k) : std::string(strategy);
      const MemoryEstimate a = estimate_run(alt, data);
      if (e.sharded && !a.sharded) {
        // The sharded step refuses this optimizer: no figure of one process stands in.
        fmt::print("{:<12} {:<26} {:>8} {:>12}  {}\n", opt, label, alt.batch, "-",
                   "refused with --shard " + e.shard);
        combos.push_back({{"optimizer", opt},
                          {"strategy", strategy},
                          {"batch", alt.batch},
                          {"accum_steps", alt.accum_steps},
                          {"refused", true}});
        continue;
      }
      const bool ok = a.peak_bytes <= budget;
      fmt::print("{:<12} {:<26} {:>8} {:>12}  {}\n", opt, label, alt.batch,
                 format_bytes(a.peak_bytes), ok ? "yes" : "no");
      combos.push_back({{"optimizer", opt},
                        {"strategy", strategy},
                        {"batch", alt.batch},
                        {"accum_steps", alt.accum_steps},
                        {"peak_bytes", a.peak_bytes},
                        {"fits", ok}});
    }
  }
  return combos;
}

// The largest micro-batch within the budget (--max-batch), printed with its peak; 0 when
// none fits.
int64_t print_max_batch(const RunConfig& c, const MemoryEstimate& e, int64_t data,
                        int64_t budget) {
  const int64_t b = max_batch_within(c, data, budget);
  if (b > 0) {
    RunConfig at = c;
    at.batch = b;
    const int64_t peak = estimate_run(at, data).peak_bytes;
    at.batch = b + 1;
    fmt::print("\nlargest micro-batch within {}{}: {} (peak {}; batch {} needs {})\n",
               format_bytes(budget), e.sharded ? " per rank" : "", b, format_bytes(peak),
               b + 1, format_bytes(estimate_run(at, data).peak_bytes));
  } else {
    fmt::print("\nnot even a micro-batch of 1 fits in {}{}\n", format_bytes(budget),
               e.sharded ? " per rank" : "");
  }
  return b;
}

// --link: each shard mode's communication per step, predicted.
nlohmann::json print_comm(const RunConfig& c, const EstimateOptions& o) {
  check_usage(!o.device_flops.empty(), "--link needs --device-flops: the compute it hides behind",
              "add the FLOP/s one device sustains, e.g. --device-flops 400T");
  check_usage(c.nproc >= 2, "--link needs ranks to connect: --nproc (or --nnodes and "
              "--nproc-per-node) of at least 2", "add e.g. --nnodes 2 --nproc-per-node 8");
  const int64_t nnodes = c.nnodes;
  const int64_t per_node = c.nproc / nnodes;
  const Link inter = parse_link("--link", o.link);
  const Link intra = o.intra_link.empty() ? inter : parse_link("--intra-link", o.intra_link);
  const double flops = parse_flops("--device-flops", o.device_flops);
  const CommPrediction p = predict_comm(c, nnodes, per_node, inter, intra, flops);
  fmt::print("\ncommunication per step, predicted: {} node{} x {} rank{}; ", nnodes,
             nnodes > 1 ? "s" : "", per_node, per_node > 1 ? "s" : "");
  if (nnodes > 1) fmt::print("between nodes {}; ", link_text(inter));
  if (per_node > 1 || nnodes == 1) fmt::print("within a node {}; ", link_text(intra));
  fmt::print("compute at {}FLOP/s per device: forward {} s, backward {} s\n", format_si(flops),
             format_si(p.forward_s), format_si(p.backward_s));
  fmt::print("  {:<6} {:>12} {:>11} {:>10} {:>10} {:>10} {:>10} {:>12}\n", "shard",
             "bytes/rank", "collectives", "comm s", "hidden", "exposed s", "step s",
             "comm share");
  for (const CommModePrediction& m : p.modes)
    fmt::print("  {:<6} {:>12} {:>11} {:>10.4g} {:>9.0f}% {:>10.4g} {:>10.4g} {:>11.0f}%\n",
               m.shard, format_bytes(m.bytes_per_step), m.collectives, m.comm_s,
               m.comm_s > 0 ? 100 * m.hidden_s / m.comm_s : 0.0, m.exposed_s, m.step_s,
               m.step_s > 0 ? 100 * m.exposed_s / m.step_s : 0.0);
  fmt::print("  (a prediction: hidden is the share of the link's time that ran while backward "
             "computed; comm share is the step's time spent waiting on it)\n");
  return comm_prediction_to_json(p);
}

}  // namespace

void add_estimate_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<EstimateOptions>();
  CLI::App* cmd = root.add_subcommand(
      "estimate",
      "Predict a run's peak memory (parameters, gradients, optimizer state, activations per\n"
      "strategy) and its FLOPs per step without training: the step's forward and backward are\n"
      "replayed from a model of what each layer allocates and autograd saves. The data set is\n"
      "loaded (not trained on) to count what it holds in memory; --no-data skips it.\n"
      "With --memory-budget: whether it fits, and which strategies and optimizers would.\n"
      "With --max-batch: the largest micro-batch within the budget.\n"
      "With --nproc N --shard MODE: the figures are one rank's (its micro-batch, its share).\n"
      "With --link (and --nnodes, --nproc-per-node, --device-flops): each shard mode's\n"
      "communication per step on that interconnect, and what backward hides of it, predicted.\n"
      "Example: gradscope estimate --model llama --preset small --memory-budget 1GiB --max-batch");
  o->settings.add_to(cmd, RunConfig{},
                     {"model",
                      "preset",
                      "init-from",
                      "lora-targets",
                      "lora-rank",
                      "lora-alpha",
                      "lora-dropout",
                      "optimizer",
                      "strategy",
                      "recompute",
                      "checkpoint-policy",
                      "checkpoint-every",
                      "accum-steps",
                      "optimizer-step",
                      "batch",
                      "nproc",
                      "nnodes",
                      "nproc-per-node",
                      "shard",
                      "grad-reduce",
                      "bucket-size",
                      "seq",
                      "dtype",
                      "device",
                      "weight-decay",
                      "opt",
                      "arch",
                      "dataset",
                      "tokenizer",
                      "projections",
                      "loss",
                      "loss-chunk"});
  cmd->add_option("--memory-budget", o->budget, "Device memory to fit in, e.g. 8GiB or 512MiB");
  cmd->add_flag("--max-batch", o->max_batch, "Find the largest micro-batch within the budget");
  cmd->add_flag("--no-data", o->no_data, "Do not load the data set (its bytes count as 0)");
  cmd->add_option("--json", o->json, "Also write the estimate to this JSON file");
  cmd->add_option("--link", o->link,
                  "The link between nodes (or between the ranks of one node), BANDWIDTH[,LATENCY]: "
                  "25gbit, 100gbit,5us, 50GB/s; predicts each shard mode's communication per step");
  cmd->add_option("--intra-link", o->intra_link,
                  "With --link and several ranks per node: the link between them (default: "
                  "--link's)");
  cmd->add_option("--device-flops", o->device_flops,
                  "With --link: the FLOP/s one device sustains (400T, 2.5e10), for the compute "
                  "time communication can hide behind");
  cmd->callback([o, &exit_code] {
    RunConfig c;
    o->settings.apply(c);
    check_config(c);
    if (!o->json.empty()) {
      check_output_path(o->json);
      check_output_file("--json", o->json, OutputKind::kEstimate);
    }
    const int64_t budget = o->budget.empty() ? 0 : parse_bytes(o->budget);
    check_usage(!o->max_batch || budget > 0, "--max-batch needs --memory-budget",
                "add e.g. --memory-budget 8GiB");
    const int64_t data = o->no_data ? 0 : resident_data_bytes(c);
    const MemoryEstimate e = estimate_run(c, data);
    print_estimate(c, e);
    nlohmann::json out = {{"config", config_to_json(c)}, {"estimate", estimate_to_json(e)}};
    if (budget > 0) {
      const bool fits = e.peak_bytes <= budget;
      fmt::print("\nbudget {}{}: {} ({} {})\n", format_bytes(budget), e.sharded ? " per rank" : "",
                 fits ? "fits" : "does not fit",
                 format_bytes(fits ? budget - e.peak_bytes : e.peak_bytes - budget),
                 fits ? "to spare" : "over");
      out["budget_bytes"] = budget;
      out["fits"] = fits;
      out["combinations"] = compare_alternatives(c, e, data, budget);
      if (o->max_batch) out["max_batch"] = print_max_batch(c, e, data, budget);
    }
    if (!o->link.empty()) out["comm"] = print_comm(c, *o);
    check_usage(o->link.empty() ? o->intra_link.empty() && o->device_flops.empty() : true,
                "--intra-link and --device-flops go with --link", "add --link BANDWIDTH");
    if (!o->json.empty()) write_json_atomically(o->json, out);
    exit_code = 0;
  });
}

}  // namespace gradscope
