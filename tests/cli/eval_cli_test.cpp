// `gradscope eval` as a user runs it: the loss of weights written by `gradscope run
// --save-weights`, read back in a new process, equals the validation loss the run reported.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace gradscope {
namespace {

using testing::contains;
using testing::run_gradscope;
using testing::slurp;
using testing::TempDir;

const std::string kText = std::string(GRADSCOPE_FIXTURES) + "/text/sotu-excerpt.txt";
const std::string kTiny = "--model llama --preset tiny --seq 32 --batch 4 --dataset " + kText;

TEST(EvalCli, WeightsReadBackInANewProcessGiveTheRunsValidationLoss) {
  TempDir tmp;
  const auto run = run_gradscope("run " + kTiny +
                                 " --steps 3 --warmup-steps 0 --eval-batches 2 --quiet --no-db"
                                 " --sample-period 0 --json " +
                                 tmp.file("run.json") + " --save-weights " + tmp.file("w"));
  ASSERT_EQ(run.code, 0) << run.err;
  const auto record = nlohmann::json::parse(slurp(tmp.file("run.json")));
  const auto eval = run_gradscope("eval " + kTiny + " --eval-batches 2 --init-from " +
                                  tmp.file("w") + " --json " + tmp.file("eval.json"));
  ASSERT_EQ(eval.code, 0) << eval.err;
  const auto out = nlohmann::json::parse(slurp(tmp.file("eval.json")));
  // JSON keeps a double's 17 significant digits: equal text is equal bits.
  EXPECT_EQ(out.at("loss_nats").get<double>(), record.at("final_val_loss").get<double>());
  EXPECT_EQ(out.at("samples"), 8);
  EXPECT_EQ(out.at("targets"), 8 * 32);
  EXPECT_TRUE(contains(eval.out, "perplexity")) << eval.out;
}

TEST(EvalCli, ATextFileIsReadWholeInWindowsThatPredictEachTokenOnce) {
  TempDir tmp;
  const auto r = run_gradscope("eval --model llama --preset tiny --seq 32 --batch 5 --text " +
                               kText + " --json " + tmp.file("e.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto out = nlohmann::json::parse(slurp(tmp.file("e.json")));
  // The bytes tokenizer: one token per byte, no BOS; floor((N - 1) / 32) windows.
  const int64_t tokens = static_cast<int64_t>(slurp(kText).size());
  EXPECT_EQ(out.at("samples").get<int64_t>(), (tokens - 1) / 32);
  EXPECT_EQ(out.at("targets").get<int64_t>(), (tokens - 1) / 32 * 32);
  EXPECT_EQ(out.at("split"), "all");
  EXPECT_NEAR(out.at("perplexity").get<double>(), std::exp(out.at("loss_nats").get<double>()),
              1e-9);
}

TEST(EvalCli, BadInputIsExitTwo) {
  TempDir tmp;
  for (const std::string& args :
       std::vector<std::string>{std::string("eval --model quadratic"),
                                "eval " + kTiny + " --init-from " + tmp.file("none"),
                                "eval " + kTiny + " --split all --eval-batches 2",
                                std::string("eval --model vit --preset tiny --split all"),
                                "eval " + kTiny + " --split test"}) {
    const auto r = run_gradscope(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << args << "\n" << r.err;
  }
}

// eval takes the run settings that decide a forward pass over held-out data, and none that
// only training reads.
TEST(EvalCli, TakesTheSettingsThatDecideTheLoss) {
  const auto r = run_gradscope("eval --help");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* flag : {"--model", "--preset", "--init-from", "--arch", "--dataset",
                           "--tokenizer", "--seq", "--seed", "--batch", "--accum-steps",
                           "--eval-batches", "--dtype", "--device", "--threads", "--loss",
                           "--loss-chunk", "--projections", "--split", "--text", "--json"})
    EXPECT_TRUE(contains(r.out, std::string(flag) + " ")) << flag << "\n" << r.out;
  for (const char* flag : {"--dropout", "--lora-rank", "--optimizer", "--lr", "--steps",
                           "--eval-every", "--recompute", "--attention", "--nproc", "--timeout",
                           "--sample-period", "--db", "--quiet"})
    EXPECT_FALSE(contains(r.out, std::string(flag) + " ")) << flag << "\n" << r.out;
}

}  // namespace
}  // namespace gradscope
