// The command line as a user meets it: exit codes, error and hint lines, nothing written on
// bad input. Runs the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <sqlite3.h>

#include <fstream>

#include "gradscope/core/record.h"
#include "gradscope/store/db.h"
#include "test_util.h"

namespace gradscope {
namespace {

using Result = testing::CommandResult;
using testing::slurp;

Result gradscope(const std::string& args, const std::string& env = "") {
  return testing::run_gradscope(args, env);
}

const std::string kFixtureRun = std::string("run --model llama --preset tiny --seq 32 --batch 2 ") +
                                "--steps 2 --warmup-steps 0 --eval-batches 1 --quiet --dataset " +
                                GRADSCOPE_FIXTURES + "/text/sotu-excerpt.txt";

// Bad usage: exit 2, an error line and a hint line, no stack trace, no database written.
void expect_usage_error(const std::string& args, const std::string& needle,
                        const std::string& env = "") {
  testing::TempDir tmp("gradscope-cli-db");
  const std::string db = tmp.file("runs.db");
  const Result r = gradscope(args + " --db " + db, env);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("\nhint: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("Exception raised from"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(db)) << "a database was written for: " << args;
}

TEST(Cli, HelpTeachesEachCommand) {
  for (const std::string sub : {"", "run ", "list ", "tokenize "}) {
    const Result r = gradscope(sub + "--help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub << r.out;
  }
  EXPECT_NE(gradscope("run --help").out.find("--accum-steps"), std::string::npos);
}

TEST(Cli, UnknownNamesListTheValidOnes) {
  expect_usage_error(kFixtureRun + " --model gpt5", "llama");
  expect_usage_error(kFixtureRun + " --preset huge", "tiny, small, paper");
  expect_usage_error(kFixtureRun + " --optimizer adamax", "sgd, adam, adagrad");
  expect_usage_error(kFixtureRun + " --strategy magic", "standard");
  expect_usage_error(kFixtureRun + " --tokenizer morse", "bytes");
  expect_usage_error(kFixtureRun + " --opt wobble=1", "betas");
}

TEST(Cli, NonPositiveNumbersAreRefused) {
  expect_usage_error(kFixtureRun + " --steps 0", "--steps");
  expect_usage_error(kFixtureRun + " --steps -3", "--steps");
  expect_usage_error(kFixtureRun + " --batch 0", "--batch");
  expect_usage_error(kFixtureRun + " --seq 0", "--seq");
  expect_usage_error(kFixtureRun + " --lr 0", "--lr");
  expect_usage_error(kFixtureRun + " --lr -1e-3", "--lr");
  expect_usage_error(kFixtureRun + " --lr fast", "--lr");
  expect_usage_error(kFixtureRun + " --memory-cap 12parsecs", "parsecs");
}

TEST(Cli, ParseErrorsExitTwo) {
  const Result r = gradscope("run --no-such-flag");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(gradscope("").code, 2);
  EXPECT_EQ(gradscope("frobnicate").code, 2);
}

TEST(Cli, MissingDataNamesTheFetchCommand) {
  testing::TempDir empty("gradscope-nodata");
  expect_usage_error("run --model llama --preset tiny --steps 1 --quiet", "fetch-data.sh",
                     "GRADSCOPE_DATA=" + empty.path());
  // The hint names the fetch; the error says what is missing.
  expect_usage_error("run --model llama --preset small --steps 1 --quiet", "gpt2",
                     "GRADSCOPE_DATA=" + empty.path());
}

TEST(Cli, BadImageDataIsRefusedBeforeAnythingIsWritten) {
  namespace fs = std::filesystem;
  testing::TempDir data("gradscope-badidx");
  for (const auto& f : fs::directory_iterator(fs::path(GRADSCOPE_FIXTURES) / "images/idx"))
    fs::copy_file(f.path(), data.fs_path() / f.path().filename());
  // A truncated training image file.
  fs::remove(data.fs_path() / "train-images-idx3-ubyte");
  fs::copy_file(fs::path(GRADSCOPE_FIXTURES) / "images/idx-bad/truncated.idx",
                data.fs_path() / "train-images-idx3-ubyte");
  expect_usage_error("run --model vit --steps 1 --quiet --dataset " + data.path(),
                     "train-images-idx3-ubyte: truncated IDX file");
  // Emoji images of the wrong size (the test fixtures are 4x4, the set's 64x64).
  expect_usage_error("run --model nanovlm --steps 1 --quiet --dataset " +
                         std::string(GRADSCOPE_FIXTURES) + "/images/emoji",
                     "is 4x4 pixels");
  // A corpus shorter than one masked-LM window.
  expect_usage_error("run --model modernbert --steps 1 --quiet --dataset " +
                         std::string(GRADSCOPE_FIXTURES) + "/text/two-lines.txt",
                     "two-lines.txt");
}

TEST(Cli, CorruptTokenizerIsRefused) {
  testing::TempDir data("gradscope-baddata");
  std::filesystem::create_directories(data.path() + "/tokenizers/llama3");
  std::ofstream(data.path() + "/tokenizers/llama3/tokenizer.json")
      << "{\"model\": {\"vocab\": {\"a\"";
  const Result r = gradscope("tokenize --tokenizer llama3", "GRADSCOPE_DATA=" + data.path());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("tokenizer.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hint: "), std::string::npos) << r.err;
}

TEST(Cli, BadDatabasePathsAreRefusedAndLeftAlone) {
  testing::TempDir tmp("gradscope-baddb");
  // A folder that does not exist.
  Result r = gradscope(kFixtureRun + " --db " + tmp.path() + "/missing/runs.db");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("hint: "), std::string::npos) << r.err;
  // A file that is not a gradscope database is refused and left byte-identical.
  const std::string foreign = tmp.file("notes.db");
  std::ofstream(foreign) << "these are my notes, not a database\n";
  const std::string before = slurp(foreign);
  r = gradscope(kFixtureRun + " --db " + foreign);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(slurp(foreign), before);
  // A read-only folder (root ignores permissions, so only check where they apply).
  if (geteuid() != 0) {
    const std::string ro = tmp.path() + "/ro";
    std::filesystem::create_directory(ro);
    std::filesystem::permissions(
        ro, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    r = gradscope(kFixtureRun + " --db " + ro + "/runs.db");
    EXPECT_EQ(r.code, 2) << r.err;
  }
}

TEST(Cli, RunWritesDatabaseJsonAndSummary) {
  testing::TempDir tmp("gradscope-run");
  const std::string args = std::string("run --model llama --preset tiny --seq 32 --batch 2 ") +
                           "--steps 3 --warmup-steps 1 --eval-batches 1 --dataset " +
                           GRADSCOPE_FIXTURES + "/text/sotu-excerpt.txt --db " +
                           tmp.file("runs.db") + " --json " + tmp.file("run.json");
  const Result r = gradscope(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("peak memory"), std::string::npos) << r.out;
  const auto record = nlohmann::json::parse(slurp(tmp.file("run.json")));
  EXPECT_EQ(record["status"], "ok");
  EXPECT_EQ(record["steps"].size(), 4u);
  // The database holds the same run.
  const Result q = gradscope(args + " --quiet");  // a second attempt appends
  EXPECT_EQ(q.code, 0) << q.err;
  EXPECT_TRUE(q.out.empty()) << q.out;
}

// A database that refuses the run (here a unique index of the user's on run_id refuses a
// second attempt of the run): the record file is written first, so the run is not lost, and
// the error says where it is. (A trigger would be refused when the database is opened.)
TEST(Cli, ADatabaseThatRefusesTheRunLeavesTheRecordFile) {
  testing::TempDir tmp("gradscope-db-refuses");
  const std::string db = tmp.file("runs.db");
  const Result first = gradscope(kFixtureRun + " --db " + db);
  ASSERT_EQ(first.code, 0) << first.err;
  sqlite3* handle = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &handle), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(handle, "CREATE UNIQUE INDEX one_attempt ON runs(run_id)", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(handle);
  const Result r = gradscope(kFixtureRun + " --db " + db + " --json " + tmp.file("run.json"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("UNIQUE constraint failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gradscope collect"), std::string::npos) << r.err;
  ASSERT_TRUE(std::filesystem::exists(tmp.file("run.json"))) << r.err;
  const RunRecord record = record_from_json(nlohmann::json::parse(slurp(tmp.file("run.json"))));
  EXPECT_TRUE(record.ok());
  EXPECT_EQ(record.steps.size(), 2u);
  // Without --json, the record is kept beside the database for collect all the same.
  const Result bare = gradscope(kFixtureRun + " --db " + db);
  EXPECT_EQ(bare.code, 1) << bare.err;
  EXPECT_NE(bare.err.find("gradscope collect " + db + ".unsaved --db " + db), std::string::npos)
      << bare.err;
  size_t kept = 0;
  for (const auto& entry : std::filesystem::directory_iterator(db + ".unsaved")) {
    ++kept;
    EXPECT_TRUE(record_from_json(nlohmann::json::parse(slurp(entry.path().string()))).ok());
  }
  EXPECT_EQ(kept, 1u);
}

TEST(Cli, FailedRunExitsOneAndIsRecorded) {
  testing::TempDir tmp("gradscope-oom");
  const Result r = gradscope(kFixtureRun + " --batch 16 --seq 64 --memory-cap 3MiB --db " +
                             tmp.file("runs.db") + " --json " + tmp.file("run.json"));
  EXPECT_EQ(r.code, 1) << r.err;
  const auto record = nlohmann::json::parse(slurp(tmp.file("run.json")));
  EXPECT_EQ(record["status"], "oom");
  EXPECT_TRUE(std::filesystem::exists(tmp.file("runs.db")));
}

TEST(Cli, ListShowsEveryFamilyAndThePaperCount) {
  const Result r = gradscope("list");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* word :
       {"llama", "tiny", "small", "paper", "sgd", "adam", "adagrad", "standard", "sotu",
        "moby-dick", "brown", "bytes", "gpt2", "llama3", "1,235,814,400"})
    EXPECT_NE(r.out.find(word), std::string::npos) << word;
  const Result j = gradscope("list --json");
  ASSERT_EQ(j.code, 0);
  const auto cat = nlohmann::json::parse(j.out);
  EXPECT_EQ(cat["models"]["llama"]["presets"]["paper"]["params"], 1235814400);
}

TEST(Cli, ListShowsToyProblemsAndDefaultLearningRatesPerModel) {
  const Result r = gradscope("list");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* word :
       {"quadratic", "rosenbrock", "100-dimensional", "cg", "galore", "adam8bit", "beta_rule"})
    EXPECT_NE(r.out.find(word), std::string::npos) << word;
  const auto cat = nlohmann::json::parse(gradscope("list --json").out);
  EXPECT_EQ(cat["models"]["rosenbrock"]["presets"]["small"]["params"], 100);
  EXPECT_FALSE(cat["models"]["rosenbrock"]["presets"].contains("paper"));
  EXPECT_TRUE(cat["optimizers"]["sgd"]["default_lr_by_model"]["llama"].is_number());
}

// The documented example: CG on Rosenbrock writes the per-step loss and the final point.
TEST(Cli, ToyRunRecordsFinalParams) {
  testing::TempDir tmp("gradscope-cli-toy");
  const Result r = gradscope("run --model rosenbrock --optimizer cg --steps 60 --quiet --db " +
                             tmp.file("r.db") + " --json " + tmp.file("out.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto record = nlohmann::json::parse(slurp(tmp.file("out.json")));
  ASSERT_EQ(record["final_params"].size(), 2u);
  EXPECT_NEAR(record["final_params"][0].get<double>(), 1.0, 1e-6);
  EXPECT_NEAR(record["final_params"][1].get<double>(), 1.0, 1e-6);
  EXPECT_EQ(record["steps"].size(), 62u);  // 2 warm-up steps and 60 timed ones
}

TEST(Cli, LrAutoRecordsEveryTrial) {
  testing::TempDir tmp("gradscope-cli-lr");
  const Result r = gradscope(
      "run --model quadratic --optimizer adam --steps 20 --lr auto --lr-search-trials 3 "
      "--lr-search-steps 10 --db " +
      tmp.file("r.db") + " --json " + tmp.file("out.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("lr search 3/3"), std::string::npos) << r.err;
  const auto record = nlohmann::json::parse(slurp(tmp.file("out.json")));
  ASSERT_EQ(record["lr_search"].size(), 3u);
  bool chosen_is_a_trial = false;
  for (const auto& t : record["lr_search"]) {
    EXPECT_EQ(t["steps"], 10);
    chosen_is_a_trial = chosen_is_a_trial || t["lr"] == record["config"]["lr"];
  }
  EXPECT_TRUE(chosen_is_a_trial) << record["config"]["lr"];
  EXPECT_TRUE(record["config"]["lr_auto"].get<bool>());
}

// A fixed rate chosen elsewhere says how in its record; saying so leaves the run's id as it
// is, and --lr auto, which records its own search, refuses it.
TEST(Cli, LrChosenByIsRecordedAndLeavesTheRunIdAlone) {
  testing::TempDir tmp("gradscope-cli-lr-chosen");
  const std::string run = "run --model quadratic --optimizer adam --steps 5 --lr 0.01 --quiet";
  Result r = gradscope(run + " --no-db --json " + tmp.file("plain.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = gradscope(run + " --no-db --json " + tmp.file("said.json") +
                " --lr-chosen-by 'lowest validation loss of 5 rates x 400 steps at seed 100'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto plain = nlohmann::json::parse(slurp(tmp.file("plain.json")));
  const auto said = nlohmann::json::parse(slurp(tmp.file("said.json")));
  EXPECT_EQ(said["config"]["lr_chosen_by"],
            "lowest validation loss of 5 rates x 400 steps at seed 100");
  EXPECT_EQ(plain["config"]["lr_chosen_by"], "");
  EXPECT_EQ(said["run_id"], plain["run_id"]);
  expect_usage_error("run --model quadratic --lr auto --lr-chosen-by 'a grid'", "--lr-chosen-by");
  expect_usage_error("run --model quadratic --lr 0.01 --lr-chosen-by \"$(printf 'a\\tb')\"",
                     "--lr-chosen-by");
  expect_usage_error("run --model quadratic --lr 0.01 --lr-chosen-by " + std::string(201, 'x'),
                     "at most 200 characters");
}

TEST(Cli, BadOptimizerAndArchitectureSettingsExitTwo) {
  expect_usage_error("run --model rosenbrock --optimizer cg --opt beta_rule=pr", "'pr'");
  expect_usage_error("run --model rosenbrock --optimizer galore --opt rank=0", "rank=0");
  expect_usage_error("run --model rosenbrock --optimizer adam8bit --opt block_size=0",
                     "block_size=0");
  expect_usage_error("run --model quadratic --arch dim=0", "dim=0");
  expect_usage_error("run --model quadratic --arch size=3", "'size'");
  expect_usage_error("run --model quadratic --lr-search-trials 3", "--lr auto");
  expect_usage_error("run --model quadratic --lr auto --lr-search-trials 0", "trials 0");
  // The search's trials refuse bad settings before anything is written.
  expect_usage_error("run --model quadratic --lr auto --batch 0", "--batch 0");
}

TEST(Cli, TokenizePrintsIdsPerLine) {
  const Result r = gradscope(std::string("tokenize --tokenizer bytes ") + GRADSCOPE_FIXTURES +
                             "/text/two-lines.txt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "72 105\n\n195 169\n");
}

TEST(Cli, TokenizeKnownIds) {
  if (!testing::have_data("tokenizers/llama3/tokenizer.json") ||
      !testing::have_data("tokenizers/gpt2/encoder.json"))
    GTEST_SKIP() << "run scripts/fetch-data.sh tokenizers";
  testing::TempDir tmp("gradscope-tok");
  std::ofstream(tmp.file("in.txt")) << "Hello\n world\nHello world\n";
  Result r = gradscope("tokenize --tokenizer llama3 " + tmp.file("in.txt"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "9906\n1917\n9906 1917\n");
  r = gradscope("tokenize --tokenizer gpt2 " + tmp.file("in.txt"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, 6), "15496\n");
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

TEST(Cli, VerifyExitsZeroWhenEveryCheckHolds) {
  const std::string fixture =
      std::string(" --seq 32 --dataset ") + GRADSCOPE_FIXTURES + "/text/sotu-excerpt.txt";
  const Result ok = gradscope("verify --model llama" + fixture);
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  // The command turns on the lossy --saved-input bf16 check, one per dtype, with its bound.
  EXPECT_NE(ok.out.find("fp32: 24 of 24 checks hold"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("bf16: 24 of 24 checks hold"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("checkpoint, saved input bf16                     fp32  relative <= 0.02 "),
            std::string::npos)
      << ok.out;
  const Result bad = gradscope("verify --model llama --strategy teleport" + fixture);
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("checkpoint+accumulation"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

// --memory-cap as the constrained device: the largest micro-batch `estimate --max-batch`
// finds for a budget trains under a cap of that budget, and the next one up runs out of memory.
TEST(CliMicroscope, MaxBatchFitsUnderTheCapAndTheNextDoesNot) {
  testing::TempDir tmp("gradscope-maxbatch");
  const std::string budget = "4MiB";
  const Result e = testing::run_gradscope("estimate --model vit --preset tiny --memory-budget " +
                                          budget + " --max-batch --json " + tmp.file("e.json"));
  ASSERT_EQ(e.code, 0) << e.err;
  const auto est = nlohmann::json::parse(slurp(tmp.file("e.json")));
  const int64_t b = est["max_batch"].get<int64_t>();
  ASSERT_GT(b, 1);
  EXPECT_NE(e.out.find("largest micro-batch"), std::string::npos) << e.out;
  auto run = [&](int64_t batch, const std::string& name) {
    const Result r = testing::run_gradscope(
        fmt::format("run --model vit --preset tiny --batch {} --steps 2 --warmup-steps 1 "
                    "--eval-batches 1 --quiet --no-db --memory-cap {} --json {}",
                    batch, budget, tmp.file(name)));
    return std::make_pair(r.code, nlohmann::json::parse(slurp(tmp.file(name))));
  };
  const auto [fit_code, fit] = run(b, "fit.json");
  EXPECT_EQ(fit_code, 0);
  EXPECT_EQ(fit["status"], "ok");
  const auto [over_code, over] = run(b + 1, "over.json");
  EXPECT_EQ(over_code, 1);
  EXPECT_EQ(over["status"], "oom");
  EXPECT_TRUE(over["failure"]["phase"].is_string());
}

// A cap above the peak changes nothing: the same losses as without one.
TEST(CliMicroscope, CapAboveThePeakLeavesTheRunUnchanged) {
  testing::TempDir tmp("gradscope-cap");
  const std::string base = kFixtureRun + " --no-db --sample-period 0.01 --json ";
  ASSERT_EQ(gradscope(base + tmp.file("free.json")).code, 0);
  ASSERT_EQ(gradscope(base + tmp.file("capped.json") + " --memory-cap 64MiB").code, 0);
  const auto free = nlohmann::json::parse(slurp(tmp.file("free.json")));
  const auto capped = nlohmann::json::parse(slurp(tmp.file("capped.json")));
  ASSERT_EQ(free["steps"].size(), capped["steps"].size());
  for (size_t i = 0; i < free["steps"].size(); ++i)
    EXPECT_EQ(free["steps"][i]["loss"], capped["steps"][i]["loss"]) << i;
  EXPECT_EQ(free["memory"]["peak_bytes"], capped["memory"]["peak_bytes"]);
  // The sampler's series, energy labelled by its source, and no zeros for the absent GPU.
  EXPECT_GE(free["timeline"].size(), 1u);
  for (const auto& s : free["timeline"]) {
    EXPECT_TRUE(s["gpu_util_pct"].is_null());
    EXPECT_TRUE(s["power_w"].is_null() || free["energy"]["source"] == "rapl");
  }
  EXPECT_TRUE(free["energy"]["joules"].is_number());
  EXPECT_TRUE(free["energy"]["source"] == "estimate" || free["energy"]["source"] == "rapl");
  EXPECT_TRUE(free["estimate"]["peak_bytes"].is_number());
  EXPECT_TRUE(free["memory"]["breakdown"]["other"].is_number());
  EXPECT_FALSE(free["memory"]["timeline"].empty());
}

TEST(CliMicroscope, InstrumentationCanBeTurnedOff) {
  testing::TempDir tmp("gradscope-quiet-instruments");
  ASSERT_EQ(gradscope(kFixtureRun + " --no-db --sample-period 0 --no-phase-timing --json " +
                      tmp.file("r.json"))
                .code,
            0);
  const auto r = nlohmann::json::parse(slurp(tmp.file("r.json")));
  EXPECT_TRUE(r["sampler"].is_null());
  EXPECT_TRUE(r["time"]["forward_s"].is_null());
  EXPECT_TRUE(r["memory"]["phase_peak_bytes"].is_null());
  EXPECT_TRUE(r["memory"]["activations_peak_bytes"].is_null());
  EXPECT_TRUE(r["memory"]["timeline"].empty());
  EXPECT_GT(r["memory"]["peak_bytes"].get<int64_t>(), 0);  // the allocator's peak still holds
  EXPECT_TRUE(r["time"]["total_s"].is_number());
  EXPECT_EQ(r["energy"]["source"], "estimate");
}

}  // namespace
}  // namespace gradscope
