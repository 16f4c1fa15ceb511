// Sweep files: expansion order, fixed values, overrides, excludes, settings, run configuration
// files, and a usage error with file and line for every kind of bad input.
#include "gradscope/sweep/grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "test_util.h"

namespace gradscope {
namespace {

using testing::contains;
using testing::expect_usage_error;
using testing::fixture;
using Args = std::vector<std::string>;

std::string sweep_fixture(const std::string& name) { return fixture("sweeps/" + name); }

// Writes `text` to `name` in `dir` and returns its path.
std::string write_file(const testing::TempDir& dir, const std::string& name,
                       const std::string& text) {
  const std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

// The axis values of every run, as labels, for order checks.
std::vector<std::string> labels(const Sweep& sweep) {
  std::vector<std::string> out;
  for (const auto& run : sweep.runs) out.push_back(run.label(sweep.axes));
  return out;
}

TEST(SweepGrid, ExpandsInPriorityOrderWithTheLastAxisFastest) {
  const Sweep s = load_sweep(sweep_fixture("order.toml"));
  EXPECT_EQ(s.name, "order");  // no `name`: the file's stem
  EXPECT_EQ(s.axes, (std::vector<std::string>{"model", "strategy", "seed"}));
  ASSERT_EQ(s.runs.size(), 12u);
  EXPECT_EQ(s.excluded, 0);
  const std::vector<std::string> expected = {
      "vit standard seed=0",     "vit standard seed=1",       "vit checkpoint seed=0",
      "vit checkpoint seed=1",   "vit accumulation seed=0",   "vit accumulation seed=1",
      "llama standard seed=0",   "llama standard seed=1",     "llama checkpoint seed=0",
      "llama checkpoint seed=1", "llama accumulation seed=0", "llama accumulation seed=1"};
  EXPECT_EQ(labels(s), expected);
  EXPECT_EQ(s.runs.front().args(),
            (Args{"--model", "vit", "--strategy", "standard", "--seed", "0"}));
  EXPECT_EQ(s.runs.back().args(),
            (Args{"--model", "llama", "--strategy", "accumulation", "--seed", "1"}));
}

TEST(SweepGrid, DocumentedExampleExpands) {
  const Sweep s = load_sweep(sweep_fixture("smoke.toml"));
  EXPECT_EQ(s.name, "smoke");
  EXPECT_EQ(s.path, sweep_fixture("smoke.toml"));
  EXPECT_EQ(s.axes, (std::vector<std::string>{"model", "optimizer", "strategy"}));
  // 4 x 2 x 3 = 24, less llama with sgd under each of the 3 strategies.
  EXPECT_EQ(s.excluded, 3);
  ASSERT_EQ(s.runs.size(), 21u);
  EXPECT_EQ(s.runs.front().args(),
            (Args{"--model", "vit", "--preset", "tiny", "--optimizer", "sgd", "--strategy",
                  "standard", "--lr", "0.05", "--steps", "20", "--opt", "momentum=0.9", "--opt",
                  "nesterov=true", "--arch", "num_hidden_layers=2"}));
  EXPECT_EQ(s.runs.front().label(s.axes), "vit sgd standard");
  EXPECT_EQ(s.runs.back().args(), (Args{"--model", "nanovlm", "--preset", "tiny", "--optimizer",
                                        "adam", "--strategy", "accumulation", "--accum-steps", "4",
                                        "--steps", "20", "--arch", "num_hidden_layers=2"}));
  for (const auto& run : s.runs) {
    EXPECT_EQ(run.values.at("preset"), "tiny");
    EXPECT_EQ(run.values.at("steps"), "20");
    EXPECT_FALSE(run.values.at("model") == "llama" && run.values.at("optimizer") == "sgd");
    EXPECT_EQ(run.values.count("lr"), run.values.at("optimizer") == "sgd" ? 1u : 0u);
  }
}

TEST(SweepGrid, OverridesMergeAndExcludesSeeTheirValues) {
  const Sweep s = load_sweep(sweep_fixture("grid.toml"));
  EXPECT_EQ(s.name, "grid-test");
  EXPECT_EQ(s.excluded, 2);
  const std::vector<std::string> expected = {
      "vit standard seed=0",      "vit standard seed=1",     "vit checkpoint seed=0",
      "vit accumulation seed=0",  "vit accumulation seed=1", "llama standard seed=0",
      "llama standard seed=1",    "llama checkpoint seed=0", "llama checkpoint seed=1",
      "llama accumulation seed=1"};
  ASSERT_EQ(labels(s), expected);

  // Fixed values only.
  const RunSpec& plain = s.runs[0];
  EXPECT_EQ(plain.values, (std::map<std::string, std::string>{{"model", "vit"},
                                                              {"strategy", "standard"},
                                                              {"seed", "0"},
                                                              {"preset", "tiny"},
                                                              {"steps", "20"},
                                                              {"lr_schedule", "cosine"}}));
  EXPECT_EQ(plain.opt, (std::map<std::string, std::string>{{"eps", "1e-10"}}));
  EXPECT_EQ(plain.arch, (std::map<std::string, std::string>{{"num_hidden_layers", "2"}}));

  // The first override only.
  const RunSpec& vit_accum = s.runs[3];
  EXPECT_EQ(vit_accum.values.at("accum_steps"), "4");
  EXPECT_EQ(vit_accum.values.at("batch"), "2");
  EXPECT_EQ(vit_accum.values.count("lr"), 0u);

  // The second override through its "any of" array: opt merged, arch replaced by name.
  const RunSpec& llama_ckpt = s.runs[7];
  EXPECT_EQ(llama_ckpt.values.at("lr"), "0.0003");
  EXPECT_EQ(llama_ckpt.values.count("batch"), 0u);
  EXPECT_EQ(llama_ckpt.opt,
            (std::map<std::string, std::string>{{"amsgrad", "true"}, {"eps", "1e-10"}}));
  EXPECT_EQ(llama_ckpt.arch, (std::map<std::string, std::string>{{"num_hidden_layers", "4"}}));

  // All three overrides; the third's batch wins over the first's.
  const RunSpec& last = s.runs.back();
  EXPECT_EQ(last.args(), (Args{"--model",       "llama",
                               "--preset",      "tiny",
                               "--strategy",    "accumulation",
                               "--accum-steps", "4",
                               "--batch",       "1",
                               "--lr",          "0.0003",
                               "--lr-schedule", "cosine",
                               "--steps",       "20",
                               "--seed",        "1",
                               "--opt",         "amsgrad=true",
                               "--opt",         "eps=1e-10",
                               "--arch",        "num_hidden_layers=4"}));
  EXPECT_EQ(last.label(s.axes), "llama accumulation seed=1");
}

TEST(SweepGrid, WhenSeesGridValuesNotEarlierOverrides) {
  testing::TempDir dir;
  const Sweep s = load_sweep(write_file(dir, "chain.toml", R"(
[axes]
optimizer = ["sgd", "adam"]
[[override]]
when = { optimizer = "sgd" }
set = { optimizer = "adam", lr = 0.1 }
[[override]]
when = { optimizer = "adam" }
set = { weight_decay = 0.01 }
)"));
  ASSERT_EQ(s.runs.size(), 2u);
  // The sgd run became adam, but the second override matched on the grid's sgd: not applied.
  EXPECT_EQ(s.runs[0].values.at("optimizer"), "adam");
  EXPECT_EQ(s.runs[0].values.at("lr"), "0.1");
  EXPECT_EQ(s.runs[0].values.count("weight_decay"), 0u);
  EXPECT_EQ(s.runs[1].values.at("weight_decay"), "0.01");
}

TEST(SweepGrid, ValueTextRoundTripsAndReadsNaturally) {
  testing::TempDir dir;
  const Sweep s = load_sweep(write_file(dir, "values.toml", R"(
[fixed]
weight_decay = 1.0
clip_grad_norm = 1e16
memory_cap = 1000000
[fixed.opt]
nesterov = true
rank = 128
[axes]
lr = [0.05, 3e-4, 1e-10, 2, "auto"]
)"));
  std::vector<std::string> lrs;
  for (const auto& run : s.runs) lrs.push_back(run.values.at("lr"));
  // "lr" is no named axis, so it sorts alphabetically, and its values keep file order.
  EXPECT_EQ(lrs, (std::vector<std::string>{"0.05", "0.0003", "1e-10", "2", "auto"}));
  EXPECT_EQ(s.runs[0].values.at("weight_decay"), "1");
  EXPECT_EQ(std::stod(s.runs[0].values.at("clip_grad_norm")), 1e16);
  EXPECT_EQ(s.runs[0].values.at("memory_cap"), "1000000");
  EXPECT_EQ(s.runs[0].opt.at("nesterov"), "true");
  EXPECT_EQ(s.runs[0].opt.at("rank"), "128");
  EXPECT_EQ(s.runs[0].label(s.axes), "lr=0.05");
}

TEST(SweepGrid, WithoutAxesTheGridIsOneRun) {
  testing::TempDir dir;
  const Sweep s = load_sweep(write_file(dir, "one.toml", "[fixed]\nmodel = \"toy\"\n"));
  ASSERT_EQ(s.runs.size(), 1u);
  EXPECT_TRUE(s.axes.empty());
  EXPECT_EQ(s.runs[0].args(), (Args{"--model", "toy"}));
  EXPECT_EQ(s.runs[0].label(s.axes), "toy");  // no axes: the named keys that are set
}

TEST(SweepSettings, ParsesEveryKeyAndByteSizes) {
  const Sweep smoke = load_sweep(sweep_fixture("smoke.toml"));
  EXPECT_EQ(smoke.settings.jobs, 2);
  EXPECT_EQ(smoke.settings.run_timeout_s, 600.0);
  EXPECT_EQ(smoke.settings.memory_limit_bytes, 4LL * 1024 * 1024 * 1024);
  EXPECT_EQ(smoke.settings.db, "results/paper.db");

  const Sweep grid = load_sweep(sweep_fixture("grid.toml"));
  EXPECT_EQ(grid.settings.jobs, 3);
  EXPECT_EQ(grid.settings.run_timeout_s, 90.5);
  EXPECT_EQ(grid.settings.memory_limit_bytes, 1000000);
  EXPECT_EQ(grid.settings.db, "results/grid.db");

  testing::TempDir dir;
  auto limit = [&](const std::string& text) {
    return load_sweep(write_file(dir, "m.toml", "[sweep]\nmemory_limit = " + text + "\n"))
        .settings.memory_limit_bytes;
  };
  EXPECT_EQ(limit("\"512MiB\""), 512LL * 1024 * 1024);
  EXPECT_EQ(limit("\"1.5GB\""), 1500000000LL);
  EXPECT_EQ(limit("\"2KiB\""), 2048);
  EXPECT_EQ(limit("\"3TiB\""), 3LL << 40);
  EXPECT_EQ(limit("\"7KB\""), 7000);

  // Defaults: nothing set.
  const Sweep order = load_sweep(sweep_fixture("order.toml"));
  EXPECT_EQ(order.settings.jobs, 1);
  EXPECT_EQ(order.settings.run_timeout_s, 0.0);
  EXPECT_EQ(order.settings.memory_limit_bytes, 0);
  EXPECT_EQ(order.settings.db, "");
}

TEST(RunConfig, ReadsRunKeysAndOptAndArchTables) {
  const RunSpec spec = load_run_config(sweep_fixture("run.toml"));
  EXPECT_EQ(spec.args(),
            (Args{"--model", "llama", "--preset", "tiny", "--lr", "auto", "--memory-cap", "2GiB",
                  "--steps", "50", "--weight-decay", "0.01", "--opt", "amsgrad=true", "--opt",
                  "betas=0.9,0.95", "--arch", "num_hidden_layers=2"}));
  EXPECT_EQ(spec.label({}), "llama tiny");
}

TEST(RunConfig, RefusesArraysAndSweepTables) {
  const std::string path = sweep_fixture("bad-run-config-array.toml");
  const Error e = expect_usage_error([&] { load_run_config(path); });
  EXPECT_TRUE(contains(e.what(), path + ":2: 'optimizer'")) << e.what();
  EXPECT_TRUE(contains(e.hint(), "one configuration per file; use gradscope sweep for a grid"))
      << e.hint();

  const std::string sweep = sweep_fixture("smoke.toml");
  const Error e2 = expect_usage_error([&] { load_run_config(sweep); });
  EXPECT_TRUE(contains(e2.what(), "belongs in a sweep file")) << e2.what();
  EXPECT_TRUE(contains(e2.hint(), "gradscope sweep")) << e2.hint();

  testing::TempDir dir;
  const std::string typo = write_file(dir, "typo.toml", "model = \"llama\"\n\nsteps = \"lots\"\n");
  const Error e3 = expect_usage_error([&] { load_run_config(typo); });
  EXPECT_TRUE(contains(e3.what(), typo + ":3: 'steps'")) << e3.what();
  EXPECT_TRUE(contains(e3.what(), "integer")) << e3.what();

  const Error e4 = expect_usage_error([&] { load_run_config(dir.file("missing.toml")); });
  EXPECT_TRUE(contains(e4.what(), dir.file("missing.toml"))) << e4.what();
}

TEST(SweepErrors, SyntaxErrorHasFileLineAndColumn) {
  const std::string path = sweep_fixture("bad-syntax.toml");
  const Error e = expect_usage_error([&] { load_sweep(path); });
  // toml++ stops at the missing comma on line 3; its description follows the position.
  EXPECT_TRUE(contains(e.what(), path + ":3:")) << e.what();
  EXPECT_GT(std::string(e.what()).size(), (path + ":3:1: ").size()) << e.what();
}

TEST(SweepErrors, UnknownKeyNamesFileLineAndValidKeys) {
  const std::string path = sweep_fixture("bad-unknown-key.toml");
  const Error e = expect_usage_error([&] { load_sweep(path); });
  EXPECT_TRUE(contains(e.what(), path + ":3: unknown key 'stepz' in [fixed]")) << e.what();
  EXPECT_TRUE(contains(e.hint(), "steps")) << e.hint();
  EXPECT_TRUE(contains(e.hint(), "warmup_steps")) << e.hint();
}

TEST(SweepErrors, SameKeyInFixedAndAxes) {
  const std::string path = sweep_fixture("bad-fixed-and-axis.toml");
  const Error e = expect_usage_error([&] { load_sweep(path); });
  EXPECT_TRUE(contains(e.what(), path + ":6: 'optimizer' is both in [fixed] (" + path + ":2)"))
      << e.what();
}

TEST(SweepErrors, EmptyGridSaysHowManyWereExcluded) {
  const std::string path = sweep_fixture("bad-all-excluded.toml");
  const Error e = expect_usage_error([&] { load_sweep(path); });
  EXPECT_TRUE(contains(e.what(), path)) << e.what();
  EXPECT_TRUE(contains(e.what(), "empty")) << e.what();
  EXPECT_TRUE(contains(e.what(), "all 4")) << e.what();
}

TEST(SweepErrors, MissingFileIsNamed) {
  const std::string path = sweep_fixture("no-such-sweep.toml");
  const Error e = expect_usage_error([&] { load_sweep(path); });
  EXPECT_TRUE(contains(e.what(), path)) << e.what();
  EXPECT_TRUE(contains(e.what(), "does not exist")) << e.what();
}

// One bad sweep file per case: its text, the line the message must name, and what else the
// message and the hint must say.
struct BadSweep {
  const char* name;
  const char* text;
  int line;
  const char* message;
  const char* hint;
};

TEST(SweepErrors, EveryBadInputNamesFileAndLine) {
  const std::vector<BadSweep> cases = {
      {"top-level unknown", "name = \"x\"\n[fixd]\nsteps = 2\n", 2, "unknown top-level key 'fixd'",
       "[fixed]"},
      {"run key at top level", "\nmodel = \"vit\"\n", 2, "unknown top-level key 'model'",
       "run keys go under [fixed]"},
      {"sweep unknown", "[sweep]\njobs = 2\nthreads = 4\n", 3, "unknown key 'threads' in [sweep]",
       "jobs, run_timeout, memory_limit, db"},
      {"axes unknown", "[axes]\nmodel = [\"vit\"]\noptimiser = [\"sgd\"]\n", 3,
       "unknown key 'optimiser' in [axes]", "optimizer"},
      {"opt as axis", "[axes]\n\nopt = [1]\n", 3, "unknown key 'opt' in [axes]",
       "opt and arch cannot be axes"},
      {"when unknown",
       "[axes]\nmodel = [\"vit\"]\n[[override]]\nwhen = { modle = \"vit\" }\nset = { steps = 2 "
       "}\n",
       4, "unknown key 'modle' in override 1's when", "model"},
      {"set unknown",
       "[axes]\nmodel = [\"vit\"]\n[[override]]\nwhen = { model = \"vit\" }\nset = { stepz = 2 "
       "}\n",
       5, "unknown key 'stepz' in override 1's set", "steps"},
      {"override unknown",
       "[axes]\nmodel = [\"vit\"]\n[[override]]\nwhen = { model = \"vit\" }\nthen = { steps = 2 "
       "}\n",
       5, "unknown key 'then' in override 1", "when"},
      {"exclude unknown", "[axes]\nmodel = [\"vit\", \"llama\"]\n[[exclude]]\nmodels = \"vit\"\n",
       4, "unknown key 'models' in exclude 1", "model"},
      {"axis not an array", "[axes]\nmodel = \"vit\"\n", 2,
       "axis 'model' must be a non-empty array", "[fixed]"},
      {"axis empty", "[axes]\nmodel = [\"vit\"]\noptimizer = []\n", 3,
       "axis 'optimizer' must be a non-empty array, not an empty array", "optimizer = [A, B]"},
      {"array in an axis", "[axes]\nmodel = [\"vit\", [\"llama\"]]\n", 2,
       "each value of axis 'model' must be a single value, not an array", "do not nest"},
      {"axis repeats a value", "[axes]\nseed = [0,\n  1,\n  0]\n", 4, "axis 'seed' lists '0' twice",
       "once"},
      {"array in fixed", "[fixed]\nsteps = 2\noptimizer = [\"sgd\", \"adam\"]\n", 3,
       "'optimizer' in [fixed] must be a single value, not an array", "[axes]"},
      {"table in fixed", "[fixed]\nmodel = { name = \"vit\" }\n", 2,
       "'model' in [fixed] must be a single value, not a table", ""},
      {"array in opt", "[fixed.opt]\nbetas = [0.9, 0.999]\n", 2,
       "'betas' in 'opt' in [fixed] must be a single value, not an array", "\"0.9,0.999\""},
      {"opt not a table", "[fixed]\nopt = \"momentum=0.9\"\n", 2,
       "'opt' in [fixed] must be a table", "--opt"},
      {"array in set",
       "[axes]\nmodel = [\"vit\"]\n[[override]]\nwhen = { model = \"vit\" }\nset = { seed = [1, 2] "
       "}\n",
       5, "'seed' in override 1's set must be a single value, not an array", "one override"},
      {"text where an integer belongs", "[fixed]\n\nsteps = \"lots\"\n", 3,
       "'steps' in [fixed] must be an integer, not text \"lots\"", "steps = 4"},
      {"float where an integer belongs", "[axes]\nbatch = [8, 16.5]\n", 2,
       "each value of axis 'batch' must be an integer, not the number 16.5", ""},
      {"number where text belongs", "[fixed]\nmodel = 3\n", 2,
       "'model' in [fixed] must be text, not the integer 3", ""},
      {"bad lr text", "[fixed]\nlr = \"fast\"\n", 2, "must be a number or \"auto\"", ""},
      {"date", "[fixed]\nmodel = \"vit\"\ndataset = 1979-05-27\n", 3,
       "'dataset' in [fixed] must be text, not a date or time", ""},
      {"date in opt", "[fixed.opt]\nwhen = 1979-05-27\n", 2,
       "must be text, a number or a boolean, not a date or time", ""},
      {"bad memory_cap", "[fixed]\nmemory_cap = \"lots\"\n", 2, "'memory_cap' in [fixed]", ""},
      {"jobs zero", "[sweep]\njobs = 0\n", 2, "'jobs' in [sweep] must be an integer >= 1",
       "jobs = 2"},
      {"jobs text", "[sweep]\n\njobs = \"2\"\n", 3, "'jobs' in [sweep] must be an integer >= 1",
       ""},
      {"run_timeout negative", "[sweep]\nrun_timeout = -5\n", 2,
       "'run_timeout' in [sweep] must be a number of seconds > 0", ""},
      {"memory_limit unit", "[sweep]\nmemory_limit = \"4 parsecs\"\n", 2,
       "'memory_limit' in [sweep]: unknown byte unit", "GiB"},
      {"memory_limit zero", "[sweep]\nmemory_limit = 0\n", 2,
       "'memory_limit' in [sweep] must be a positive byte count", ""},
      {"memory_limit table", "[sweep]\nmemory_limit = { gib = 4 }\n", 2,
       "'memory_limit' in [sweep] must be a byte size, not a table", ""},
      {"name not text", "name = 3\n", 1, "'name' must be non-empty text", ""},
      {"override not an array of tables", "[override]\nwhen = { model = \"vit\" }\n", 1,
       "'override' must be written as [[override]] entries", "[[override]]"},
      {"override without when", "[axes]\nmodel = [\"vit\"]\n[[override]]\nset = { steps = 2 }\n", 3,
       "override 1 has no 'when'", "[fixed]"},
      {"when on a key no run has",
       "[axes]\nmodel = [\"vit\"]\n[[override]]\nwhen = { optimizer = \"sgd\" }\nset = { lr = 0.1 "
       "}\n",
       4, "'optimizer' in override 1's when never matches", ""},
      {"exclude on a key no run has",
       "[axes]\nmodel = [\"vit\", \"llama\"]\n[[exclude]]\nseed = 1\n", 4,
       "'seed' in exclude 1 never matches", ""},
      {"empty exclude", "[axes]\nmodel = [\"vit\", \"llama\"]\n[[exclude]]\n", 3,
       "exclude 1 is empty", ""},
  };
  testing::TempDir dir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = write_file(dir, "bad.toml", c.text);
    const Error e = expect_usage_error([&] { load_sweep(path); });
    const std::string prefix = path + ":" + std::to_string(c.line) + ": ";
    EXPECT_TRUE(contains(e.what(), prefix)) << "want " << prefix << " in: " << e.what();
    EXPECT_TRUE(contains(e.what(), c.message)) << e.what();
    EXPECT_TRUE(contains(e.hint(), c.hint)) << e.hint();
  }
}

TEST(SweepErrors, HugeGridIsRefused) {
  testing::TempDir dir;
  std::string seeds;
  for (int i = 0; i < 1000; ++i) seeds += (i ? ", " : "") + std::to_string(i);
  const std::string path =
      write_file(dir, "huge.toml", "[axes]\nseed = [" + seeds + "]\nbatch = [" + seeds + "]\n");
  const Error e = expect_usage_error([&] { load_sweep(path); });
  EXPECT_TRUE(contains(e.what(), "the grid has 1000000 runs, more than the cap of 100000"))
      << e.what();
}

TEST(SweepRunKeys, MatchTheRunCommandsOptions) {
  const auto& keys = run_keys();
  // Every run setting but the outputs (db, json, quiet, memory_snapshot, sweep) and the
  // tables opt and arch.
  EXPECT_EQ(keys.size(), 57u);
  EXPECT_EQ(keys.front(), "model");
  for (const char* key : {"accum_steps",
                          "checkpoint_policy",
                          "lr_search_span",
                          "memory_cap",
                          "eval_batches",
                          "timeout",
                          "diverge_above",
                          "lr_chosen_by",
                          "seq",
                          "recompute",
                          "optimizer_step",
                          "no_phase_timing",
                          "no_grad_norm",
                          "loss",
                          "loss_chunk",
                          "projections",
                          "attention",
                          "saved_input",
                          "init_from",
                          "lora_targets",
                          "lora_rank",
                          "lora_alpha",
                          "lora_dropout",
                          "nproc",
                          "shard",
                          "grad_reduce",
                          "bucket_size",
                          "dist_timeout"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), key), keys.end()) << key;
  for (const char* key : {"db", "json", "quiet", "opt", "arch", "config", "save_weights",
                          "save_state", "resume", "save_adapters"})
    EXPECT_EQ(std::find(keys.begin(), keys.end(), key), keys.end()) << key;
}

TEST(SweepRunKeys, FlagsTakeABooleanAndAreGivenWhenTrue) {
  testing::TempDir dir;
  const Sweep s = load_sweep(write_file(dir, "flags.toml", R"(
[fixed]
model = "toy"
no_grad_norm = true
[axes]
optimizer = ["sgd", "adam"]
[[override]]
when = { optimizer = "sgd" }
set = { no_phase_timing = true }
[[override]]
when = { optimizer = "adam" }
set = { no_phase_timing = false }
)"));
  ASSERT_EQ(s.runs.size(), 2u);
  const auto has = [](const Args& args, const std::string& flag) {
    return std::find(args.begin(), args.end(), flag) != args.end();
  };
  EXPECT_TRUE(has(s.runs[0].args(), "--no-grad-norm"));
  EXPECT_TRUE(has(s.runs[0].args(), "--no-phase-timing"));
  EXPECT_TRUE(has(s.runs[1].args(), "--no-grad-norm"));
  EXPECT_FALSE(has(s.runs[1].args(), "--no-phase-timing"));
  for (const Args& args : {s.runs[0].args(), s.runs[1].args()})
    for (const std::string& a : args) EXPECT_NE(a, "true") << "a flag takes no value";

  const std::string path = write_file(dir, "bad-flag.toml", "[fixed]\nno_grad_norm = 1\n");
  const Error e = expect_usage_error([&] { load_sweep(path); });
  EXPECT_TRUE(contains(e.what(), path + ":2: 'no_grad_norm' in [fixed] must be true or false"))
      << e.what();
}

}  // namespace
}  // namespace gradscope
