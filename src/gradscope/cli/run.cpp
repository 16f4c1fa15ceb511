// `gradscope run`: one training run, written to the database and optionally a JSON record.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "gradscope/cli/commands.h"
#include "gradscope/cli/progress.h"
#include "gradscope/cli/settings_options.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/log.h"
#include "gradscope/core/settings.h"
#include "gradscope/comm/comm.h"
#include "gradscope/report/summary.h"
#include "gradscope/store/db.h"
#include "gradscope/store/schema_guard.h"
#include "gradscope/sweep/grid.h"
#include "gradscope/train/lr_search.h"
#include "gradscope/train/train_state.h"
#include "gradscope/train/trainer.h"

namespace gradscope {
namespace {

struct RunOptions {
  SettingOptions settings;
  std::string config_file;  // expanded into flags by main() before parsing
  bool no_db = false;
};

// The run's configuration from the options given, with every setting's check.
RunConfig config_of(const RunOptions& o) {
  RunConfig c;
  o.settings.apply(c);
  check_config(c);
  return c;
}

// Refuses, before anything is trained or written, an output path that would lose something:
// a file that is not an earlier output of its kind, or one path given for two outputs.
void check_run_outputs(const RunConfig& c, bool db) {
  if (!c.json_path.empty()) {
    check_output_path(c.json_path);
    check_output_file("--json", c.json_path, OutputKind::kRunRecord);
  }
  if (db) {
    check_output_path(c.db_path);
    check_database_output("--db", c.db_path);
  }
  if (!c.memory_snapshot.empty()) {
    check_output_path(c.memory_snapshot);
    check_output_file("--memory-snapshot", c.memory_snapshot, OutputKind::kMemorySnapshot);
  }
  if (!c.memory_timeline.empty()) {
    check_output_path(c.memory_timeline);
    check_output_file("--memory-timeline", c.memory_timeline, OutputKind::kMemoryTimeline);
  }
  check_distinct_outputs({{"--json", c.json_path},
                          {"--db", db ? c.db_path : ""},
                          {"--memory-snapshot", c.memory_snapshot},
                          {"--memory-timeline", c.memory_timeline},
                          {"--save-weights", c.save_weights, /*folder=*/true},
                          {"--save-state", c.save_state, /*folder=*/true}});
}

// A record the database refused, with no --json to hold it: written to DB.unsaved/ beside
// the database, or, where that cannot be written (a full disk), to a folder of its own that
// mkdtemp makes in $TMPDIR (or /tmp), readable by this user alone. The file's path, or
// nullopt when neither could be written.
std::optional<std::string> keep_unstored_record(const std::string& db_path,
                                                const RunRecord& record) {
  const std::string name = record.attempt_uid + ".json";  // hex: a plain file name
  try {
    std::error_code ec;
    std::filesystem::create_directories(db_path + ".unsaved", ec);
    const std::string file = (std::filesystem::path(db_path + ".unsaved") / name).string();
    write_json_atomically(file, record_to_json(record));
    return file;
  } catch (const Error&) {
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string folder =
      (std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / "gradscope-unsaved-XXXXXX").string();
  if (mkdtemp(folder.data()) == nullptr) return std::nullopt;
  try {
    const std::string file = (std::filesystem::path(folder) / name).string();
    write_json_atomically(file, record_to_json(record));
    return file;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// Ranks a launcher started, each told it is the run's only process: each would train the
// whole run and store it, the result doubled.
void check_not_a_lone_rank(const RunConfig& c) {
  if (c.nproc != 1) return;
  if (const std::optional<RankEnv> env = rank_env_from_environment(); env && env->world > 1)
    fail_usage(fmt::format("{} started this process as rank {} of {}, but --nproc is 1: every "
                           "rank would train the whole run and store it",
                           env->launcher, env->rank, env->world),
               fmt::format("pass --nproc {} (and --shard) to train one run over the ranks, or "
                           "start a single process",
                           env->world));
}

// --lr auto's trials, each a Trainer of its own, printed as they end. Nullopt when a stop
// signal ended the search (then no run is recorded).
std::optional<LrSearchResult> search_lr_first(const RunConfig& c) {
  check_lr_search(c);
  const auto stopped_in_search = [] {
    fmt::print(stderr, "stopped during the learning-rate search: no run was recorded\n");
    return std::nullopt;
  };
  LrSearchResult search;
  try {
    search = search_learning_rate(c, [&](const LrTrial& t, int64_t i, int64_t n) {
      if (c.quiet) return;
      fmt::print(stderr, "lr search {}/{}: lr {:.3g} -> {} after {} steps ({})\n", i, n, t.lr,
                 t.val_loss ? fmt::format("search-split loss {:.4f}", *t.val_loss)
                            : "no search-split loss",
                 t.steps, t.status);
    });
  } catch (const Error&) {
    if (stop_requested()) return stopped_in_search();
    throw;
  }
  if (stop_requested()) return stopped_in_search();
  if (!c.quiet) fmt::print(stderr, "lr search: training with lr {:.3g}\n", search.best_lr);
  return search;
}

// A rank other than 0 trains its part and writes nothing: the other ranks' figures are in
// rank 0's record; save errors are this rank's own.
int run_silent_rank(Trainer& trainer) {
  const RunRecord record = trainer.run(nullptr);
  if (record.status == RunStatus::kInterrupted) return kExitStopped;
  // What every rank agreed on (ok, diverged, a timeout) is rank 0's to report; this rank
  // fails only for what happened to it.
  const bool own_failure = record.status == RunStatus::kError ||
                           record.status == RunStatus::kOom ||
                           record.status == RunStatus::kCrashed;
  // Rank 0's record may not hold it (rank 0 may be the one lost): this rank's output does.
  if (own_failure && record.failure)
    log_warn("{} at step {}: {}", status_name(record.status),
             record.failure->step.value_or(0), record.failure->message);
  return own_failure ? 1 : 0;
}

// The launcher of the ranks learns that the record exists (it writes a crashed one else).
void mark_recorded() {
  const char* marker = std::getenv(kRecordMarkerVariable);
  if (marker && *marker) std::ofstream(marker).put('\n');
}

// Writes the record: the record file first, so that when the database cannot take the run,
// the file still holds it for `gradscope collect`; when the file cannot be written, the
// database is still tried. Returns the attempt the database stored (0: a collect had stored
// it already, or no database); an error says where the record is, if anywhere.
int64_t write_record(const RunConfig& c, Database* db, const RunRecord& record) {
  std::optional<Error> json_failed;
  if (!c.json_path.empty()) {
    try {
      write_json_atomically(c.json_path, record_to_json(record));
      mark_recorded();
    } catch (const Error& e) {
      json_failed = e;
    }
  }
  int64_t attempt = 0;
  if (db) {
    try {
      // Unless a collect of the record file stored this attempt a moment ago.
      attempt = db->write_run_if_new(record).value_or(0);
      mark_recorded();
    } catch (const Error& e) {
      if (json_failed)
        fail_runtime(fmt::format("the run was lost: {}; and {}", e.what(), json_failed->what()),
                     json_failed->hint());
      if (c.json_path.empty()) {
        // No record file was asked for: one is written where it can be, for collect.
        const std::optional<std::string> kept = keep_unstored_record(c.db_path, record);
        if (!kept) throw;
        mark_recorded();
        fail_runtime(e.what(),
                     fmt::format("the run's record is in {}: `gradscope collect {} --db {}` "
                                 "merges it once the database can be written",
                                 terminal_text(*kept),
                                 terminal_text(std::filesystem::path(*kept).parent_path().string()),
                                 terminal_text(c.db_path)));
      }
      fail_runtime(e.what(), fmt::format("the run's record is in {}: `gradscope collect` merges "
                                         "it into the database once the database can be written",
                                         c.json_path));
    }
  }
  if (json_failed) {
    if (!db) throw *json_failed;
    fail_runtime(
        json_failed->what(),
        fmt::format("the run is stored in the database {} (attempt {})", c.db_path, attempt));
  }
  return attempt;
}

// "activations (block 1 attention, forward) 1.50 MiB"; "unnamed" where nothing named the
// module.
std::string label_text(const MemoryLabelBytes& l) {
  std::string where = l.module.empty() ? "unnamed" : l.module;
  if (!l.phase.empty()) where += ", " + l.phase;
  return fmt::format("{} ({}) {}", l.component, where,
                     format_bytes(static_cast<double>(l.bytes)));
}

// After the summary of a run that ran out of memory: the request that failed, the largest
// live labels, and what the estimate says would have fitted.
std::string oom_hint(const FailureMemory& m) {
  std::string text;
  if (m.request && m.live_bytes && m.cap_bytes)
    text += fmt::format("out of memory: a request of {} with {} of the {} cap live\n",
                        label_text(*m.request),
                        format_bytes(static_cast<double>(*m.live_bytes)),
                        format_bytes(static_cast<double>(*m.cap_bytes)));
  else if (m.reserved_peak_bytes)
    text += fmt::format("out of memory: the caching allocator held up to {} in that phase\n",
                        format_bytes(static_cast<double>(*m.reserved_peak_bytes)));
  else
    text += "out of memory\n";
  if (!m.live.empty()) {
    std::string largest;
    for (size_t i = 0; i < m.live.size() && i < 3; ++i)
      largest += (i ? "; " : "") + label_text(m.live[i]);
    text += "  largest live: " + largest + "\n";
  }
  if (!m.fit) return text;
  const MemoryFit& fit = *m.fit;
  if (fit.estimated_peak_bytes <= fit.cap_bytes)
    return text + fmt::format("  the estimate put this run at {}, within the {} cap: it cannot "
                              "say what would have fitted\n",
                              format_bytes(static_cast<double>(fit.estimated_peak_bytes)),
                              format_bytes(static_cast<double>(fit.cap_bytes)));
  text += fmt::format("  by the estimate, within the {} cap: ",
                      format_bytes(static_cast<double>(fit.cap_bytes)));
  text += fit.max_batch > 0 ? fmt::format("--batch {} would have fitted\n", fit.max_batch)
                            : std::string("not even --batch 1 fits\n");
  if (fit.cheapest) {
    std::string flags;
    for (const std::string& f : fit.cheapest->flags) flags += (flags.empty() ? "" : " ") + f;
    text += fmt::format("  cheapest method that fits: {}: {} (estimated peak {}; {} tried)\n",
                        fit.cheapest->method, flags,
                        format_bytes(static_cast<double>(fit.cheapest->estimated_peak_bytes)),
                        fit.tried.size());
  } else {
    text += fmt::format("  none of the {} methods tried fits (the record lists them)\n",
                        fit.tried.size());
  }
  return text;
}

// Trains the run as rank 0 or the only process, then writes and summarises its record.
int train_and_record(const RunConfig& c, const RunOptions& o, Trainer& trainer) {
  if (!c.quiet && trainer.resumed_state())
    fmt::print(stderr, "resuming from step {} of {} ({})\n", trainer.resumed_state()->step,
               trainer.resumed_state()->total_steps, trainer.resumed_state()->dir);
  // Opened before training so that a bad database path fails now, not after the run.
  std::unique_ptr<Database> db;
  if (!o.no_db) db = std::make_unique<Database>(c.db_path);
  const std::string started_at = utc_now_iso8601();
  std::unique_ptr<ProgressSink> progress;
  if (!c.quiet) progress = make_console_progress(stderr, isatty(fileno(stderr)) != 0);
  RunRecord record = trainer.run(progress.get());
  // What a result file needs to be merged later, once (gradscope collect).
  record.attempt_uid = new_attempt_uid();
  if (!c.sweep.empty()) record.sweep = c.sweep;
  // A probe stored in the database counts too.
  if (db && record.env)
    apply_device_peak(
        record, db->latest_probe(record.env->host, record.env->device_name, record.env->threads));
  record.started_at = started_at;
  record.finished_at = utc_now_iso8601();
  const int64_t attempt = write_record(c, db.get(), record);
  if (!c.quiet) {
    std::vector<std::pair<std::string, std::string>> where;
    if (db)
      where.push_back(
          {"database", attempt > 0 ? fmt::format("{} (attempt {})", c.db_path, attempt)
                                   : c.db_path + " (stored from the record file by a collect)"});
    if (!c.json_path.empty()) where.push_back({"record", c.json_path});
    fmt::print("\n{}", terminal_text(summary_table(record, where)));  // paths as given
    if (record.failure && record.failure->memory)
      fmt::print("\n{}", terminal_text(oom_hint(*record.failure->memory)));
  }
  if (!trainer.save_error().empty())
    fail_runtime("the run is recorded, but its weights could not be saved to '" + c.save_weights +
                     "': " + trainer.save_error(),
                 "free space or fix the folder's permissions, then train again (with "
                 "--save-state, a stopped run can be resumed instead)");
  if (record.status == RunStatus::kInterrupted) return kExitStopped;
  return record.ok() ? 0 : 1;
}

int execute(const RunOptions& o) {
  RunConfig c = config_of(o);
  check_usage(!o.no_db || !c.json_path.empty(), "--no-db needs --json: the run would be lost",
              "add --json FILE (a result file that `gradscope collect` can merge later)");
  check_run_outputs(c, !o.no_db);
  if (c.quiet) set_log_level(LogLevel::kQuiet);  // warnings and errors still print
  // SIGTERM and SIGINT stop the run between steps (saving its state with --save-state), and
  // the record is still written: exit 75. main() blocked them until now; the handlers stay
  // until the process ends, so that a signal while it exits changes nothing.
  const StopSignals stop_signals(StopSignals::Scope::kUntilExit);

  check_not_a_lone_rank(c);
  // Several ranks and no launcher around this process: it becomes the launcher.
  if (c.nproc > 1 && !rank_env_from_environment()) {
    return launch_local_ranks(c, [&](const RunRecord& crashed) {
      if (!c.json_path.empty()) write_json_atomically(c.json_path, record_to_json(crashed));
      if (!o.no_db) Database(c.db_path).write_run_if_new(crashed);
    });
  }
  // With several ranks, rank 0 alone writes; the others say only what goes wrong.
  const std::optional<RankEnv> rank_env = c.nproc > 1 ? rank_env_from_environment() : std::nullopt;
  const bool writes = !rank_env || rank_env->rank == 0;
  if (!writes) set_log_level(LogLevel::kQuiet);

  // --lr auto trains its trials first, each a Trainer of its own (whose construction refuses
  // bad settings before anything is written); the run's Trainer is built after them, so that
  // no trial shares the process's memory (or a --memory-cap) with the run's model.
  // A resumed run trains with the rate its state holds: no search.
  std::optional<LrSearchResult> search;
  if (c.lr_auto && c.resume.empty()) {
    search = search_lr_first(c);
    if (!search) return kExitStopped;
  }
  Trainer trainer(c);
  if (search) {
    trainer.use_learning_rate(search->best_lr);
    trainer.set_lr_search(search->trials);
  }
  if (!writes) return run_silent_rank(trainer);
  return train_and_record(c, o, trainer);
}

void define_run_options(CLI::App* cmd, RunOptions& o) {
  o.settings.add_to(cmd, RunConfig{});
  cmd->add_flag("--no-db", o.no_db,
                "Write no database, only the --json result file (for cluster tasks; merge the "
                "files with `gradscope collect`)")
      ->group(section_title(SettingSection::kOutput));
  cmd->add_option("--config", o.config_file,
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

void write_json_atomically(const std::string& path, const nlohmann::json& j) {
  write_file_atomically(path, j.dump(2) + "\n");
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
  return config_of(o);
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
      "database (--db) and, with --json, to a run record file (docs/record.md). Exit 0 when\n"
      "the run's status is ok, 1 when it failed (oom, diverged, timeout, error), 2 for bad\n"
      "input, 75 when SIGTERM or SIGINT stopped it between steps (status interrupted; with\n"
      "--save-state DIR its training state is saved, and --resume DIR continues it:\n"
      "docs/training-state.md).\n"
      "Example: gradscope run --model llama --preset tiny --optimizer adam --steps 300");
  define_run_options(cmd, *o);
  cmd->callback([o, &exit_code] { exit_code = execute(*o); });
}

}  // namespace gradscope
