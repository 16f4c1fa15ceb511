#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/registry.h"
#include "gradscope/train/session.h"
#include "models/model_test_util.h"

namespace gradscope {
namespace {

using testing::max_abs_diff;
using testing::module_param_count;
using testing::random_ids;
using testing::random_normal;

std::shared_ptr<NanoVlmModel> make_vlm(const nlohmann::json& arch, uint64_t seed = 1) {
  auto model = std::dynamic_pointer_cast<NanoVlmModel>(make_nanovlm(arch, seed));
  EXPECT_TRUE(model);
  return model;
}

TEST(NanoVlmPreset, PaperCountNear222M) {
  const auto arch = nanovlm_preset("paper");
  const double count = static_cast<double>(nanovlm_count_params(arch));
  EXPECT_NEAR(count, 222.1e6, 0.005 * 222.1e6) << count;
  EXPECT_EQ(nanovlm_config(arch).image_tokens(), 49);
}

TEST(NanoVlmPreset, PaperTrainsWithGpt2VocabularyAndSaysSo) {
  RunConfig c;
  c.model = "nanovlm";
  c.preset = "paper";
  const auto arch = resolve_arch(c);
  EXPECT_EQ(arch["vocab_size"], 50304);            // 49152 cannot hold GPT-2's ids
  EXPECT_EQ(arch["published_vocab_size"], 49152);  // and the record says so
}

TEST(NanoVlmPreset, CountMatchesModulesAtTinyAndSmall) {
  for (const char* preset : {"tiny", "small"}) {
    const auto arch = nanovlm_preset(preset);
    auto model = make_vlm(arch);
    EXPECT_EQ(module_param_count(*model), nanovlm_count_params(arch)) << preset;
  }
  EXPECT_EQ(nanovlm_config(nanovlm_preset("tiny")).image_tokens(), 4);
  EXPECT_EQ(nanovlm_config(nanovlm_preset("small")).image_tokens(), 16);
}

TEST(PixelShuffle, GroupsNeighbouringPatches) {
  // A 4x4 grid of one-channel tokens numbered row-major; factor 2 gives 4 tokens of 4.
  auto x = torch::arange(16, torch::kFloat).reshape({1, 16, 1});
  auto y = pixel_shuffle_tokens(x, 2);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 4, 4}));
  EXPECT_TRUE(torch::equal(y[0][0], torch::tensor({0.f, 1.f, 4.f, 5.f})));
  EXPECT_TRUE(torch::equal(y[0][1], torch::tensor({2.f, 3.f, 6.f, 7.f})));
  EXPECT_TRUE(torch::equal(y[0][3], torch::tensor({10.f, 11.f, 14.f, 15.f})));
  EXPECT_THROW(pixel_shuffle_tokens(torch::zeros({1, 9, 1}), 2), c10::Error);
}

TEST(NanoVlm, LogitsCoverCaptionPositionsOnly) {
  auto model = make_vlm(nanovlm_preset("tiny"));
  model->eval();
  auto images = random_normal({2, 3, 32, 32}, 1);
  auto ids = random_ids(2, 10, 256, 2);
  EXPECT_EQ(model->logits(images, ids).sizes(), (std::vector<int64_t>{2, 10, 320}));
}

TEST(NanoVlm, FutureCaptionTokensDoNotChangeEarlierLogits) {
  auto model = make_vlm(nanovlm_preset("tiny"));
  model->eval();
  auto images = random_normal({1, 3, 32, 32}, 3);
  auto ids = random_ids(1, 12, 256, 4);
  auto changed = ids.clone();
  changed.index_put_({0, 8}, (ids.index({0, 8}) + 1).remainder(256));
  auto a = model->logits(images, ids), b = model->logits(images, changed);
  EXPECT_EQ(max_abs_diff(a.narrow(1, 0, 8), b.narrow(1, 0, 8)), 0.0);
  EXPECT_GT(max_abs_diff(a.narrow(1, 8, 4), b.narrow(1, 8, 4)), 0.0);
}

TEST(NanoVlm, TheImageReachesEveryCaptionPosition) {
  auto model = make_vlm(nanovlm_preset("tiny"));
  model->eval();
  auto ids = random_ids(1, 6, 256, 5);
  auto a = model->logits(random_normal({1, 3, 32, 32}, 6), ids);
  auto b = model->logits(random_normal({1, 3, 32, 32}, 7), ids);
  auto diff = (a - b).abs().amax({0, 2});  // (T)
  for (int64_t t = 0; t < 6; ++t) EXPECT_GT(diff[t].item<double>(), 0.0) << t;
}

TEST(NanoVlm, PaddingDoesNotChangeRealPositions) {
  auto model = make_vlm(nanovlm_preset("tiny"));
  model->eval();
  auto images = random_normal({1, 3, 32, 32}, 8);
  auto ids = random_ids(1, 10, 256, 9);
  auto real = torch::ones({1, 10}, torch::kBool);
  real.index_put_({0, torch::indexing::Slice(7, 10)}, false);
  auto masked = model->logits(images, ids, real);
  auto short_caption = model->logits(images, ids.narrow(1, 0, 7));
  EXPECT_LT(max_abs_diff(masked.narrow(1, 0, 7), short_caption), 1e-5);
}

TEST(NanoVlm, ImageTokensAreNotInTheLoss) {
  auto model = make_vlm(nanovlm_preset("tiny"));
  model->eval();
  Batch batch;
  batch.images = random_normal({2, 3, 32, 32}, 10);
  batch.input_ids = random_ids(2, 8, 256, 11);
  batch.targets = random_ids(2, 8, 256, 12);
  batch.targets.index_put_({1, torch::indexing::Slice(5, 8)}, kIgnoreIndex);
  const LossOutput out = model->loss(batch);
  EXPECT_EQ(out.target_count, 13);  // 16 caption positions, 3 ignored; no image position
  auto lg = model->logits(batch.images, batch.input_ids);
  auto expected = torch::nn::functional::cross_entropy(
      lg.reshape({-1, lg.size(-1)}), batch.targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions()
          .reduction(torch::kSum)
          .ignore_index(kIgnoreIndex));
  EXPECT_NEAR(out.loss_sum.item<double>(), expected.item<double>(), 1e-3);
}

TEST(NanoVlm, BlocksAreVisionThenDecoderAndAllTrain) {
  auto model = make_vlm(nanovlm_preset("tiny"));
  EXPECT_EQ(model->blocks().size(), 4u);  // 2 vision + 2 decoder layers
  Batch batch;
  batch.images = random_normal({2, 3, 32, 32}, 13);
  batch.input_ids = random_ids(2, 8, 256, 14);
  batch.targets = random_ids(2, 8, 256, 15);
  model->loss(batch).loss_sum.backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

TEST(NanoVlm, SameSeedSameWeightsWhateverTheDefaultGenerator) {
  torch::manual_seed(1);
  auto a = make_nanovlm(nanovlm_preset("tiny"), 3);
  torch::manual_seed(2);
  auto b = make_nanovlm(nanovlm_preset("tiny"), 3);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
}

}  // namespace
}  // namespace gradscope
