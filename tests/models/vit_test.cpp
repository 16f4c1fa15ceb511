#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/models/registry.h"
#include "gradscope/models/vit.h"
#include "gradscope/train/session.h"
#include "models/model_test_util.h"

namespace gradscope {
namespace {

using testing::max_abs_diff;
using testing::module_param_count;
using testing::random_normal;

std::shared_ptr<ViTModel> make_vit_model(const nlohmann::json& arch, uint64_t seed = 1) {
  auto model = std::dynamic_pointer_cast<ViTModel>(make_vit(arch, seed));
  EXPECT_TRUE(model);
  return model;
}

TEST(VitPreset, PaperCountsAsPublished) {
  auto arch = vit_preset("paper");
  EXPECT_EQ(arch["seq_len"], 197);              // 14 x 14 patches + the class token
  EXPECT_EQ(vit_count_params(arch), 85806346);  // the 10-class head gradscope trains
  arch["num_labels"] = 1000;
  EXPECT_EQ(vit_count_params(arch), 86567656);  // ViT-B/16 with its ImageNet head
}

TEST(VitPreset, CountMatchesModulesAtTinyAndSmall) {
  for (const char* preset : {"tiny", "small"}) {
    const auto arch = vit_preset(preset);
    auto model = make_vit_model(arch);
    EXPECT_EQ(module_param_count(*model), vit_count_params(arch)) << preset;
  }
}

TEST(VitPreset, TokensFollowImageAndPatchSize) {
  EXPECT_EQ(vit_preset("tiny")["seq_len"], 17);   // (28 / 7)^2 + 1
  EXPECT_EQ(vit_preset("small")["seq_len"], 65);  // (32 / 4)^2 + 1
  RunConfig c;
  c.model = "vit";
  c.arch_overrides = {{"image_size", "56"}};
  EXPECT_EQ(resolve_arch(c)["seq_len"], 65);  // (56 / 7)^2 + 1
  c.arch_overrides = {{"image_size", "30"}};
  EXPECT_THROW(resolve_arch(c), Error);  // 30 is not a multiple of the patch size 7
  c.arch_overrides = {};
  c.seq_len = 100;
  EXPECT_THROW(resolve_arch(c), Error);  // the token count is not a free setting
}

TEST(Vit, ShapesAndClassTokenLogits) {
  auto model = make_vit_model(vit_preset("tiny"));
  model->eval();
  auto images = random_normal({3, 3, 28, 28}, 5);
  auto logits = model->logits(images);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10}));
  // The encoder output has the class token first, then the 16 patches.
  auto hidden = model->encoder->forward(
      images,
      [](Block& b, const torch::Tensor& x, const BlockContext& c) { return b.forward(x, c); });
  EXPECT_EQ(hidden.sizes(), (std::vector<int64_t>{3, 17, 64}));
  EXPECT_LT(max_abs_diff(model->classifier(hidden.select(1, 0)), logits), 1e-6);
}

TEST(Vit, LossCountsCorrectPredictions) {
  auto model = make_vit_model(vit_preset("tiny"));
  model->eval();
  Batch batch;
  batch.images = random_normal({6, 3, 28, 28}, 6);
  auto predicted = model->logits(batch.images).argmax(-1);
  batch.labels = predicted.clone();
  batch.labels.index_put_({torch::indexing::Slice(0, 2)},
                          (predicted.index({torch::indexing::Slice(0, 2)}) + 1).remainder(10));
  const LossOutput out = model->loss(batch);
  EXPECT_EQ(out.target_count, 6);
  EXPECT_EQ(out.correct, 4);
  auto expected = torch::nn::functional::cross_entropy(
      model->logits(batch.images), batch.labels,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  EXPECT_NEAR(out.loss_sum.item<double>(), expected.item<double>(), 1e-4);
}

TEST(Vit, EveryPatchReachesTheClassToken) {
  // Bidirectional attention: a change in the last patch moves the class token's logits.
  auto model = make_vit_model(vit_preset("tiny"));
  model->eval();
  auto images = random_normal({1, 3, 28, 28}, 7);
  auto changed = images.clone();
  changed.index_put_(
      {0, torch::indexing::Slice(), torch::indexing::Slice(21, 28), torch::indexing::Slice(21, 28)},
      0.0);
  EXPECT_GT(max_abs_diff(model->logits(images), model->logits(changed)), 1e-4);
}

TEST(Vit, DropoutOnlyInTraining) {
  auto arch = vit_preset("tiny");
  auto model = make_vit_model(arch);
  auto images = random_normal({2, 3, 28, 28}, 8);
  model->eval();
  auto a = model->logits(images), b = model->logits(images);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  model->train();
  torch::manual_seed(1);
  auto c = model->logits(images);
  torch::manual_seed(2);
  auto d = model->logits(images);
  EXPECT_GT(max_abs_diff(c, d), 1e-6);  // hidden_dropout 0.1 as published
}

TEST(Vit, GradientsReachEveryParameter) {
  auto model = make_vit_model(vit_preset("tiny"));
  Batch batch;
  batch.images = random_normal({2, 3, 28, 28}, 9);
  batch.labels = torch::tensor({1, 7}, torch::kLong);
  model->loss(batch).loss_sum.backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
}

TEST(Vit, FlopsPerTokenMatchHandCount) {
  const auto arch = vit_preset("tiny");
  // 16 patches + class token, C 64, I 128, 2 layers, patch 7, 3 channels, 10 classes.
  const double T = 17, N = 16, C = 64, I = 128;
  const double per_image =
      2 * N * 3 * 49 * C + 2 * (2 * T * (4 * C * C + 2 * C * I) + 4 * T * T * C) + 2 * C * 10;
  EXPECT_DOUBLE_EQ(vit_forward_flops_per_token(arch, 17), per_image / T);
  EXPECT_THROW(vit_forward_flops_per_token(arch, 64), Error);
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

TEST(Vit, SameSeedSameWeightsWhateverTheDefaultGenerator) {
  // Every weight comes from the run seed, the head included: the default generator's state
  // (which torch::nn's own initialisation would read) must not matter.
  torch::manual_seed(1);
  auto a = make_vit(vit_preset("tiny"), 3);
  torch::manual_seed(2);
  auto b = make_vit(vit_preset("tiny"), 3);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
}

}  // namespace
}  // namespace gradscope
