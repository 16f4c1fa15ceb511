// Sweep files: a grid of `gradscope run` configurations written as TOML, expanded here into
// one RunSpec per run (its settings as command-line text), so that `gradscope sweep` can run
// each as a `gradscope run` child process and `--dry-run` / `--emit slurm` can print them.
//
//   name = "smoke"            # optional; default: the file's stem
//   [sweep]                   # how to run the grid: jobs, run_timeout, memory_limit, db
//   jobs = 2                  # integer >= 1
//   run_timeout = 600         # seconds per run (number > 0)
//   memory_limit = "4GiB"     # integer bytes, or text with B/KiB/MiB/GiB/TiB/KB/MB/GB
//   db = "results/paper.db"
//   [fixed]                   # run keys every run gets, plus the tables opt and arch
//   preset = "tiny"
//   [fixed.arch]              # --arch NAME=VALUE (and [fixed.opt]: --opt NAME=VALUE)
//   num_hidden_layers = 2
//   [axes]                    # each a non-empty array; the grid is their cartesian product
//   model = ["vit", "llama"]
//   optimizer = ["sgd", "adam"]
//   [[override]]              # in file order, to every run that matches `when`
//   when = { optimizer = "sgd" }        # every key must match; an array means "any of"
//   set = { lr = 0.05, opt = { momentum = 0.9 } }
//   [[exclude]]               # drops a run that matches every key of one entry
//   model = "llama"
//   optimizer = ["cg", "adadelta"]
//
// Order. Axes expand in priority order (model, preset, optimizer, strategy, then the others
// alphabetically, seed last) with the last axis varying fastest, as nested loops would; the
// file's order of [axes] keys does not matter (TOML tables are unordered, toml++ sorts them).
// Resuming a sweep and comparing two dry runs rely on this order being stable.
//
// Matching. Each override's `when` looks at a run's values from [fixed] and [axes] only, not
// at what earlier overrides set: overrides do not chain, so their order only decides which of
// two overrides setting the same key wins (the later). `set` replaces run keys and merges
// opt/arch entries. [[exclude]] looks at the run's final values, after every override, so it
// drops runs by what they would actually run (e.g. an override that sets strategy for some
// models is seen by an exclude on strategy). Values compare as their command-line text, so
// 20 and 20.0 are equal. A `when` or exclude key that no run can have (in neither [fixed],
// [axes] nor, for exclude, any override's `set`) is an error: it could never match.
//
// Values are checked per key (text, integer, number, lr = number or "auto", memory_cap = byte
// size) so that a typo fails at load time with file and line, not in run 37 of 80; ranges and
// names (is "adma" an optimizer?) are left to `gradscope run`, which knows them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gradscope {

// One run of a sweep: its settings as `gradscope run` command-line text.
struct RunSpec {
  std::map<std::string, std::string> values;  // run key -> value text ("0.05", "true", "vit")
  std::map<std::string, std::string> opt;     // --opt NAME=VALUE
  std::map<std::string, std::string> arch;    // --arch NAME=VALUE

  // The `gradscope run` arguments: the values in axis priority order (model, preset,
  // optimizer, strategy, the others alphabetically, seed last), then --opt and --arch pairs
  // by name, e.g. {"--model", "vit", "--accum-steps", "4", "--opt", "momentum=0.9"}.
  std::vector<std::string> args() const;
  // Short human label of the axis values in priority order, e.g. "vit tiny adam checkpoint":
  // the values of model, preset, optimizer and strategy bare, any other axis as key=value
  // ("lr=0.05"). Without axes (a single run), the label of model, preset, optimizer and
  // strategy where set, so a progress line still says what runs.
  std::string label(const std::vector<std::string>& axes) const;
};

// How a sweep is run, from its [sweep] table. Zero means "not set": the caller's default.
struct SweepSettings {
  int64_t jobs = 1;                // runs at a time
  double run_timeout_s = 0;        // wall-clock limit of one run; 0 = none
  int64_t memory_limit_bytes = 0;  // memory limit of one run; 0 = none
  std::string db;                  // results database; empty = the caller's default
};

// The [slurm] table (or `sweep --emit slurm`'s flags): what a cluster asks of a job. Empty
// text and 0 leave the choice to the cluster (cpus_per_task: the emitter's fit). Each value
// is written into an #SBATCH line, so each must pass check_slurm_setting.
struct SlurmSettings {
  std::string partition;      // --partition: names separated by commas
  std::string account;        // --account
  std::string time;           // --time: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
  std::string mem;            // --mem: a count with an optional K, M, G or T
  std::string gpus_per_task;  // --gpus-per-task: a count, or TYPE:COUNT
  int64_t cpus_per_task = 0;  // --cpus-per-task
};

// A usage error naming `key` ("partition", "time", ...) unless `value` is of the form Slurm
// takes for it, made of characters that mean nothing to sbatch's option parser or the shell.
void check_slurm_setting(const std::string& key, const std::string& value);

struct Sweep {
  std::string name;  // `name`, else the file's stem
  std::string path;  // as given to load_sweep
  SweepSettings settings;
  SlurmSettings slurm;
  std::vector<std::string> axes;  // axis keys in expansion (priority) order
  std::vector<RunSpec> runs;      // the expanded grid, exclusions removed, in expansion order
  int64_t excluded = 0;           // runs dropped by [[exclude]]
};

// Parses and expands a sweep file. Every problem is a usage error (gradscope::Error) whose
// message starts with "FILE:LINE:" where a line is known: TOML syntax (with toml++'s
// description and the column), an unknown key (the hint lists the valid ones), a value of the
// wrong type, the same key in [fixed] and [axes], a `when`/exclude key no run has, an empty
// grid (every run excluded; says how many), a grid of more than 100000 runs, a missing file.
Sweep load_sweep(const std::string& path);

// A single run configuration for `gradscope run --config FILE.toml`: run keys at the top
// level and optional [opt] and [arch] tables (what a sweep's [fixed] holds). An array is an
// error: one configuration per file, a grid is a sweep.
RunSpec load_run_config(const std::string& path);

// The valid scalar run keys, in documentation order: `gradscope run`'s long option names with
// '-' -> '_'. The tables opt and arch (in [fixed], `set` and run configs) come on top.
const std::vector<std::string>& run_keys();

}  // namespace gradscope
