// Weights out and back in: a trained tiny model written with --save-weights and read with
// --init-from evaluates to the very same loss, for every model; what a folder holds decides
// the architecture and the tokenizer.
#include <gtest/gtest.h>

#include <filesystem>

#include "gradscope/core/files.h"
#include "gradscope/core/safetensors.h"
#include "gradscope/models/hf_weights.h"
#include "gradscope/train/eval.h"
#include "gradscope/train/trainer.h"
#include "gradscope/train/weights_io.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::expect_usage_error;
using testing::TempDir;

RunConfig tiny_config(const std::string& model) {
  RunConfig c;
  c.model = model;
  c.preset = "tiny";
  c.optimizer = "adam";
  c.quiet = true;
  c.sample_period_s = 0;
  c.steps = 2;
  c.warmup_steps = 0;
  c.eval_batches = 1;
  if (model == "llama") {
    c.seq_len = 32;
    c.dataset = testing::fixture("text/sotu-excerpt.txt");
  }
  return c;
}

// The validation loss training's own evaluation reads, for a model built by a session.
double reevaluate(const RunConfig& c) {
  SessionOptions options;
  options.updater = false;
  Session session(c, options);
  EvalPass pass;
  pass.batch = session.config().batch;
  pass.micro_batches =
      eval_micro_batches(c.eval_batches, c.accum_steps, c.batch, session.data().val_samples());
  return evaluate_model(session.model(), session.data(), session.device(), pass).val_loss;
}

class WeightsRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(WeightsRoundTrip, SavedWeightsEvaluateToTheRunsValidationLossBitwise) {
  TempDir tmp;
  RunConfig c = tiny_config(GetParam());
  c.save_weights = tmp.file("weights");
  const RunRecord r = Trainer(c).run();
  ASSERT_TRUE(r.ok()) << (r.failure ? r.failure->message : "");
  ASSERT_TRUE(r.final_val_loss.has_value());
  ASSERT_TRUE(std::filesystem::exists(tmp.file("weights/config.json")));
  ASSERT_TRUE(std::filesystem::exists(tmp.file("weights/model.safetensors")));

  RunConfig from = c;
  from.save_weights.clear();
  from.init_from = tmp.file("weights");
  // The same seed: ModernBERT's validation masks are drawn from it.
  EXPECT_EQ(reevaluate(from), *r.final_val_loss);

  // The seed's own (untrained) initialisation is another model: the weights were read.
  RunConfig seeded = from;
  seeded.init_from.clear();
  EXPECT_NE(reevaluate(seeded), *r.final_val_loss);
}

INSTANTIATE_TEST_SUITE_P(Models, WeightsRoundTrip,
                         ::testing::Values("llama", "modernbert", "vit", "nanovlm"));

TEST(WeightsFolder, ConfigGivesTheArchitectureAndTheFolderTheTokenizer) {
  TempDir tmp;
  RunConfig c = tiny_config("llama");
  c.arch_overrides["num_hidden_layers"] = "3";
  c.save_weights = tmp.file("w");
  ASSERT_TRUE(Trainer(c).run().ok());

  // The folder's config.json says 3 layers: a run from it needs no --arch.
  RunConfig from = tiny_config("llama");
  from.init_from = tmp.file("w");
  const ResolvedRun resolved = resolve_run(from);
  EXPECT_EQ(resolved.arch.at("num_hidden_layers"), 3);
  // Another shape asked on top of the weights is refused, naming a tensor.
  from.arch_overrides["hidden_size"] = "48";
  const Error e = expect_usage_error([&] { Session s(from); });
  EXPECT_TRUE(testing::contains(e.what(), "model.")) << e.what();
}

TEST(WeightsFolder, APublishedFolderBringsItsTokenizer) {
  // A folder as Hugging Face publishes it: config.json without gradscope's keys, and the
  // tokenizer.json the model was trained with.
  const std::string tokenizer = data_dir() + "/tokenizers/llama3/tokenizer.json";
  if (!std::filesystem::exists(tokenizer)) GTEST_SKIP() << "needs " << tokenizer;
  TempDir tmp;
  RunConfig c = tiny_config("llama");
  c.tokenizer = "llama3";
  c.steps = 1;
  c.save_weights = tmp.file("w");
  ASSERT_TRUE(Trainer(c).run().ok());
  ASSERT_TRUE(std::filesystem::exists(tmp.file("w/tokenizer.json")));  // copied beside them
  nlohmann::json config =
      nlohmann::json::parse(read_input_file(tmp.file("w/config.json"), "config", 1 << 20));
  config.erase("gradscope");
  write_file_atomically(tmp.file("w/config.json"), config.dump(2));

  RunConfig from = tiny_config("llama");
  from.init_from = tmp.file("w");
  const ResolvedRun resolved = resolve_run(from);
  EXPECT_EQ(resolved.arch.at("tokenizer"),
            std::filesystem::absolute(tmp.file("w/tokenizer.json")).string());
  EXPECT_EQ(resolved.arch.at("vocab_size"), config.at("vocab_size"));
  from.eval_batches = 1;
  EXPECT_TRUE(std::isfinite(reevaluate(from)));
}

TEST(WeightsFolder, BadSourcesAreRefusedByName) {
  TempDir tmp;
  RunConfig c = tiny_config("llama");
  c.init_from = tmp.file("missing");
  EXPECT_TRUE(testing::contains(expect_usage_error([&] { resolve_run(c); }).what(), "missing"));
  c.init_from = tmp.path();  // a folder without weights
  EXPECT_TRUE(
      testing::contains(expect_usage_error([&] { resolve_run(c); }).what(), "model.safetensors"));
  write_file_atomically(tmp.file("notes.txt"), "x");
  c.init_from = tmp.file("notes.txt");
  EXPECT_TRUE(
      testing::contains(expect_usage_error([&] { resolve_run(c); }).what(), ".safetensors"));
  // A file holding another model's tensors: the first missing one is named.
  write_safetensors(tmp.file("other.safetensors"),
                    {{"vit.embeddings.cls_token", torch::zeros({1, 1, 8})}});
  c.init_from = tmp.file("other.safetensors");
  EXPECT_TRUE(testing::contains(expect_usage_error([&] { Session s(c); }).what(),
                                "model.embed_tokens.weight"));
  // --save-weights writes over an empty folder or an earlier save, nothing else, and never
  // over the weights the run starts from.
  RunConfig save = tiny_config("llama");
  save.steps = 1;
  save.save_weights = tmp.path();  // holds notes.txt and other.safetensors
  EXPECT_TRUE(
      testing::contains(expect_usage_error([&] { Session s(save); }).what(), "holds other files"));
  save.save_weights = tmp.file("w");
  ASSERT_TRUE(Trainer(save).run().ok());
  ASSERT_TRUE(Trainer(save).run().ok());  // an earlier save is written over
  save.init_from = tmp.file("w");
  EXPECT_TRUE(testing::contains(expect_usage_error([&] { Session s(save); }).what(),
                                "is the --init-from folder"));
  // A published folder (config.json without gradscope's keys) and no tokenizer.json: the
  // tokenizer is asked for, not guessed.
  nlohmann::json config =
      nlohmann::json::parse(read_input_file(tmp.file("w/config.json"), "config", 1 << 20));
  config.erase("gradscope");
  write_file_atomically(tmp.file("w/config.json"), config.dump(2));
  RunConfig published = tiny_config("llama");
  published.init_from = tmp.file("w");
  EXPECT_TRUE(testing::contains(expect_usage_error([&] { resolve_run(published); }).what(),
                                "no tokenizer.json"));
  published.tokenizer = "bytes";
  EXPECT_EQ(resolve_run(published).arch.at("tokenizer"), "bytes");

  RunConfig toy;
  toy.model = "quadratic";
  toy.save_weights = tmp.file("w");
  expect_usage_error([&] { Session s(toy); });
}

}  // namespace
}  // namespace gradscope
