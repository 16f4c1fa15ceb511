// Each model learns at its tiny preset on CPU within about a minute: these tests train for
// real and check a measured outcome against a reference the data itself gives.
#include <gtest/gtest.h>

#include <cstdio>

#include "gradscope/models/nanovlm.h"
#include "gradscope/models/registry.h"
#include "gradscope/train/data_source.h"
#include "gradscope/train/trainer.h"
#include "test_util.h"

namespace gradscope {
namespace {

RunConfig learning_config(const std::string& model) {
  RunConfig c;
  c.model = model;
  c.preset = "tiny";
  c.optimizer = "adam";
  c.warmup_steps = 0;
  c.quiet = true;
  return c;
}

TEST(Learning, VitReaches70PercentOnFashionMnist) {
  RunConfig c = learning_config("vit");
  c.lr = 2e-3;
  c.batch = 64;
  c.steps = 600;
  c.eval_batches = 32;  // 2048 test images
  const auto r = record_to_json(Trainer(c).run());
  ASSERT_EQ(r["status"], "ok");
  const double accuracy = r["final_accuracy"].get<double>();
  std::printf("ViT tiny: test accuracy %.1f%% after %d steps\n", 100 * accuracy, 600);
  EXPECT_GE(accuracy, 0.70);
}

TEST(Learning, ModernBertBeatsTheUnigramEntropy) {
  RunConfig c = learning_config("modernbert");
  c.dataset = testing::fixture("text/sotu-excerpt.txt");
  c.lr = 3e-3;
  c.batch = 16;
  c.steps = 300;
  c.eval_batches = 8;
  const auto r = record_to_json(Trainer(c).run());
  ASSERT_EQ(r["status"], "ok");
  const double entropy = r["data"]["unigram_entropy_nats"].get<double>();
  const double loss = r["final_val_loss"].get<double>();
  std::printf("ModernBERT tiny: masked-token loss %.4f, unigram entropy %.4f (%.1f%% below)\n",
              loss, entropy, 100 * (1 - loss / entropy));
  EXPECT_LE(loss, 0.9 * entropy);
}

TEST(Learning, NanoVlmReadsTheImage) {
  RunConfig c = learning_config("nanovlm");
  c.lr = 3e-3;
  c.batch = 32;
  c.steps = 300;
  c.eval_batches = 1;
  Trainer trainer(c);
  const auto r = record_to_json(trainer.run());
  ASSERT_EQ(r["status"], "ok");
  auto data = make_data_source(model_registry().get("nanovlm"), trainer.arch(), c);
  Model& model = trainer.model();
  model.eval();
  torch::NoGradGuard no_grad;
  double matched = 0, shuffled = 0, count = 0;
  for (int64_t i = 0; i < 8; ++i) {
    Batch batch = data->val_batch(i * 64, 64);
    LossOutput a = model.loss(batch);
    batch.images = batch.images.roll(1, 0);  // each caption gets its neighbour's image
    LossOutput b = model.loss(batch);
    matched += a.loss_sum.item<double>();
    shuffled += b.loss_sum.item<double>();
    count += static_cast<double>(a.target_count);
  }
  matched /= count;
  shuffled /= count;
  std::printf("NanoVLM tiny: caption loss %.4f with the true images, %.4f shuffled\n", matched,
              shuffled);
  EXPECT_LT(matched, shuffled - 0.05);
}

}  // namespace
}  // namespace gradscope
