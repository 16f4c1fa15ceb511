// `gradscope run`: one training run, written to the database and optionally a JSON record.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "gradscope/cli/commands.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/optim/factory.h"
#include "gradscope/report/console.h"
#include "gradscope/store/db.h"
#include "gradscope/sweep/grid.h"
#include "gradscope/train/lr_search.h"
#include "gradscope/train/trainer.h"

namespace gradscope {
namespace {

struct RunOptions {
  RunConfig config;
  std::string lr = "";
  std::vector<std::string> opt;
  std::vector<std::string> arch;
  double dropout = 0;
  std::string memory_cap;
  std::string config_file;  // expanded into flags by main() before parsing
  bool no_db = false;
  bool no_phase_timing = false;
};

// Turns the parsed options into the run configuration, with the checks CLI11 cannot make.
void finish_config(RunOptions& o, const CLI::App& cmd) {
  RunConfig& c = o.config;
  if (o.lr == "auto") {
    c.lr_auto = true;
  } else if (!o.lr.empty()) {
    size_t pos = 0;
    double lr = 0;
    try {
      lr = std::stod(o.lr, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    check_usage(pos == o.lr.size() && pos > 0, "cannot read --lr '" + o.lr + "' as a number",
                "write e.g. --lr 3e-4");
    check_usage(lr > 0, fmt::format("--lr {} must be > 0", o.lr), "write e.g. --lr 3e-4");
    c.lr = lr;
  }
  if (cmd.count("--seq"))
    check_usage(c.seq_len > 0, fmt::format("--seq {} must be positive", c.seq_len),
                "leave --seq out for the preset's sequence length");
  for (const auto& s : o.opt) parse_opt_setting(s, c.opt);
  for (const auto& s : o.arch) parse_arch_setting(s, c.arch_overrides);
  if (!c.lr_auto)
    check_usage(!cmd.count("--lr-search-trials") && !cmd.count("--lr-search-steps") &&
                    !cmd.count("--lr-search-span"),
                "the --lr-search-* options only apply with --lr auto",
                "add --lr auto, or leave them out");
  if (cmd.count("--dropout")) c.dropout = o.dropout;
  if (!o.memory_cap.empty()) c.memory_cap_bytes = parse_bytes(o.memory_cap);
  c.phase_timing = !o.no_phase_timing;
}

int execute(RunOptions& o, CLI::App& cmd) {
  finish_config(o, cmd);
  RunConfig& c = o.config;
  if (!c.json_path.empty()) check_output_path(c.json_path);
  check_usage(!o.no_db || !c.json_path.empty(), "--no-db needs --json: the run would be lost",
              "add --json FILE (a result file that `gradscope collect` can merge later)");
  if (c.quiet) set_log_level(LogLevel::kLogLevelQuiet);  // warnings and errors still print

  // --lr auto trains its trials first, each a Trainer of its own (whose construction refuses
  // bad settings before anything is written); the run's Trainer is built after them, so that
  // no trial shares the process's memory (or a --memory-cap) with the run's model.
  LrSearchResult search;
  if (c.lr_auto) {
    check_lr_search(c);
    check_output_path(c.db_path);
    search = search_learning_rate(c, [&](const nlohmann::json& t, int64_t i, int64_t n) {
      if (c.quiet) return;
      const auto& v = t["val_loss"];
      fmt::print(stderr, "lr search {}/{}: lr {:.3g} -> {} after {} steps ({})\n", i, n,
                 t["lr"].get<double>(),
                 v.is_number() ? fmt::format("val loss {:.4f}", v.get<double>()) : "no val loss",
                 t["steps"].get<int64_t>(), t["status"].get<std::string>());
    });
    if (!c.quiet) fmt::print(stderr, "lr search: training with lr {:.3g}\n", search.best_lr);
  }
  Trainer trainer(c);
  if (c.lr_auto) trainer.use_learning_rate(search.best_lr);
  // Opened before training so that a bad database path fails now, not after the run.
  std::unique_ptr<Database> db;
  if (!o.no_db) db = std::make_unique<Database>(c.db_path);
  const std::string started_at = utc_now_iso8601();
  std::unique_ptr<ProgressSink> progress;
  if (!c.quiet) progress = make_console_progress(stderr, isatty(fileno(stderr)) != 0);
  nlohmann::json record = trainer.run(progress.get());
  if (c.lr_auto) record["lr_search"] = search.trials;
  const std::string finished_at = utc_now_iso8601();
  // What a result file needs to be merged later, once (gradscope collect).
  record["attempt_uid"] = new_attempt_uid();
  record["sweep"] = c.sweep.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.sweep);
  if (db) apply_device_peak(record, db.get());  // a probe stored in the database counts too
  record["started_at"] = started_at;
  record["finished_at"] = finished_at;
  const int64_t attempt = db ? db->write_run(record, c.sweep, started_at, finished_at) : 0;
  if (!c.json_path.empty()) write_json_atomically(c.json_path, record);
  if (!c.quiet) {
    std::vector<std::pair<std::string, std::string>> where;
    if (db) where.push_back({"database", fmt::format("{} (attempt {})", c.db_path, attempt)});
    if (!c.json_path.empty()) where.push_back({"record", c.json_path});
    fmt::print("\n{}", summary_table(record, where));
  }
  return record.value("status", "error") == "ok" ? 0 : 1;
}

void define_run_options(CLI::App* cmd, RunOptions& options) {
  RunOptions* o = &options;
  RunConfig& c = o->config;
  // A repeated option takes its last value, so a script can append overrides.
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--model", c.model, "Architecture (see `gradscope list`)")->capture_default_str();
  cmd->add_option("--preset", c.preset, "tiny (tests), small (CPU) or paper (published size)")
      ->capture_default_str();
  cmd->add_option("--optimizer", c.optimizer, "Optimizer (see `gradscope list`)")
      ->capture_default_str();
  cmd->add_option("--strategy", c.strategy, "Memory strategy (see `gradscope list`)")
      ->capture_default_str();
  cmd->add_option("--checkpoint-every", c.checkpoint_every,
                  "With checkpointing: recompute every K-th block (1 = every block)")
      ->capture_default_str();
  cmd->add_option("--batch", c.batch, "Micro-batch size (samples)")->capture_default_str();
  cmd->add_option("--accum-steps", c.accum_steps,
                  "Micro-batches per optimizer step (effective batch = batch x accum-steps)")
      ->capture_default_str();
  cmd->add_option("--checkpoint-policy", c.checkpoint_policy,
                  "With checkpointing, what a wrapped block recomputes in backward: full, "
                  "attention or mlp")
      ->check(CLI::IsMember({"full", "attention", "mlp"}))
      ->capture_default_str();
  cmd->add_option("--seq", c.seq_len, "Sequence length (default: the preset's)");
  cmd->add_option("--steps", c.steps, "Timed optimizer steps")->capture_default_str();
  cmd->add_option("--warmup-steps", c.warmup_steps,
                  "Untimed optimizer steps before the timed ones (they train too)")
      ->capture_default_str();
  cmd->add_option("--lr", o->lr,
                  "Learning rate, or auto: a short search first (default: the optimizer's for "
                  "the model, see `gradscope list`)");
  cmd->add_option("--lr-search-trials", c.lr_search_trials,
                  "With --lr auto: learning rates tried, log-spaced around the default")
      ->capture_default_str();
  cmd->add_option("--lr-search-steps", c.lr_search_steps,
                  "With --lr auto: steps of each trial (0 = a tenth of --steps, at least 10)")
      ->capture_default_str();
  cmd->add_option("--lr-search-span", c.lr_search_span,
                  "With --lr auto: decades searched either side of the default")
      ->capture_default_str();
  cmd->add_option("--lr-schedule", c.lr_schedule,
                  "constant, or cosine (linear warm-up over --lr-warmup-steps, then cosine to 0)")
      ->capture_default_str();
  cmd->add_option("--lr-warmup-steps", c.lr_warmup_steps, "Warm-up length of the cosine schedule")
      ->capture_default_str();
  cmd->add_option("--weight-decay", c.weight_decay, "Weight decay")->capture_default_str();
  cmd->add_option("--clip-grad-norm", c.clip_grad_norm,
                  "Clip the global gradient norm to this value (0 = off; the norm is recorded "
                  "either way)")
      ->capture_default_str();
  cmd->add_option("--opt", o->opt,
                  "Optimizer setting NAME=VALUE under PyTorch's name (repeatable), e.g. "
                  "--opt momentum=0.9 --opt nesterov=true, --opt betas=0.9,0.95")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--arch", o->arch,
                  "Override an architecture key NAME=VALUE (repeatable; Hugging Face names, "
                  "e.g. --arch num_hidden_layers=4; toy problems: dim, condition)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--seed", c.seed, "Seed of weights, data order and dropout")
      ->capture_default_str();
  cmd->add_option("--device", c.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", c.dtype,
                  "fp32, or bf16: bfloat16 autocast (matrix products in bfloat16; parameters, "
                  "gradients and optimizer state stay float32)")
      ->capture_default_str();
  cmd->add_option("--threads", c.threads, "Intra-op and BLAS threads (0 = LibTorch's default)")
      ->capture_default_str();
  cmd->add_option("--dataset", c.dataset,
                  "Data set: sotu, moby-dick, brown, or a .txt file or folder (default: the "
                  "model's)");
  cmd->add_option("--tokenizer", c.tokenizer, "bytes, gpt2 or llama3 (default: the preset's)");
  cmd->add_option("--dropout", o->dropout, "Dropout probability (default: the published one)");
  cmd->add_option("--memory-cap", o->memory_cap,
                  "Refuse CPU allocations beyond this many bytes (e.g. 512MiB, 8GiB): the run "
                  "behaves as on a smaller device and ends with status oom");
  cmd->add_option("--memory-snapshot", c.memory_snapshot,
                  "CUDA with LibTorch >= 2.1: write the caching allocator's history to this file "
                  "(the pickle that pytorch.org/memory_viz reads)");
  cmd->add_option("--sample-period", c.sample_period_s,
                  "Seconds between samples of utilization, memory, power and energy (0 = no "
                  "sampler)")
      ->capture_default_str();
  cmd->add_flag("--no-phase-timing", o->no_phase_timing,
                "Do not synchronize and read the clock at each phase (phase times are then null)");
  cmd->add_option("--watts-per-core", c.watts_per_core,
                  "CPU energy estimate when nothing measures energy: CPU seconds x this")
      ->capture_default_str();
  cmd->add_option("--grid-intensity", c.grid_g_per_kwh,
                  "Carbon intensity of the electricity in g CO2/kWh (0 = no carbon figure)")
      ->capture_default_str();
  cmd->add_option("--eval-every", c.eval_every,
                  "Evaluate on the validation split every N steps (0 = only at the end)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", c.eval_batches,
                  "Validation batches per evaluation, of the effective batch size (batch x "
                  "accum-steps), so that every strategy is evaluated on the same samples")
      ->capture_default_str();
  cmd->add_option("--timeout", c.timeout_s, "Stop with status timeout after this many seconds")
      ->capture_default_str();
  cmd->add_option("--db", c.db_path, "SQLite results database")->capture_default_str();
  cmd->add_option("--json", c.json_path, "Also write the run record to this JSON file");
  cmd->add_flag("--quiet", c.quiet, "No progress and no summary");
  cmd->add_option("--sweep", c.sweep, "Name of the sweep this run belongs to (set by sweeps)");
  cmd->add_flag("--no-db", o->no_db,
                "Write no database, only the --json result file (for cluster tasks; merge the "
                "files with `gradscope collect`)");
  cmd->add_option("--config", o->config_file,
                  "Read settings from a TOML file (the keys of a sweep's [fixed] table: model = "
                  "\"vit\", batch = 8, [opt], [arch]); flags after it override the file");
}

}  // namespace

void check_output_path(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  check_usage(fs::is_directory(dir),
              "cannot write '" + path + "': folder '" + dir.string() + "' does not exist",
              "create the folder or choose another path");
  check_usage(access(dir.c_str(), W_OK) == 0,
              "cannot write '" + path + "': folder '" + dir.string() + "' is not writable",
              "choose a path in a writable folder");
}

// Writes to a temporary file and renames it, so a reader never sees half a record.
void write_json_atomically(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) fail_runtime("cannot write '" + tmp + "'", "check free disk space");
  }
  std::filesystem::rename(tmp, path);
}

void parse_arch_setting(const std::string& s, std::map<std::string, std::string>& overrides) {
  auto eq = s.find('=');
  check_usage(eq != std::string::npos && eq > 0 && eq + 1 < s.size(),
              "cannot read architecture setting '" + s + "'",
              "write --arch NAME=VALUE, e.g. --arch num_hidden_layers=4 or --arch dim=10");
  overrides[s.substr(0, eq)] = s.substr(eq + 1);
}

RunConfig parse_run_arguments(const std::vector<std::string>& args) {
  CLI::App app("run");
  RunOptions o;
  define_run_options(&app, o);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    fail_usage(std::string("cannot read run settings: ") + e.what(),
               "the keys are `gradscope run`'s options (see gradscope run --help)");
  }
  finish_config(o, app);
  return o.config;
}

std::vector<std::string> expand_run_config_files(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "run") return args;
  std::vector<std::string> from_files;
  for (size_t i = 1; i < args.size(); ++i) {
    std::string path;
    if (args[i] == "--config" && i + 1 < args.size()) {
      path = args[i + 1];
    } else if (args[i].rfind("--config=", 0) == 0) {
      path = args[i].substr(9);
    } else {
      continue;
    }
    const std::vector<std::string> file_args = load_run_config(path).args();
    from_files.insert(from_files.end(), file_args.begin(), file_args.end());
  }
  std::vector<std::string> out = {args[0]};
  out.insert(out.end(), from_files.begin(), from_files.end());
  out.insert(out.end(), args.begin() + 1, args.end());
  return out;
}

void add_run_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = root.add_subcommand(
      "run",
      "Train one configuration and measure it.\n"
      "Every optimizer step is timed by phase (data, forward, backward, optimizer) after\n"
      "untimed warm-up steps; memory is tracked per phase. The run is written to the\n"
      "database (--db) and, with --json, to a run record file. Exit 0 when the run's\n"
      "status is ok, 1 when it failed (oom, diverged, timeout, error), 2 for bad input.\n"
      "Example: gradscope run --model llama --preset tiny --optimizer adam --steps 300");
  define_run_options(cmd, *o);
  cmd->callback([o, cmd, &exit_code] { exit_code = execute(*o, *cmd); });
}

}  // namespace gradscope
