#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gradscope/models/common/layers.h"
#include "gradscope/models/common/lora.h"
#include "gradscope/models/hf_adapters.h"
#include "gradscope/models/hf_weights.h"
#include "gradscope/models/hf_weights_detail.h"
#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/registry.h"
#include "gradscope/models/vit.h"
#include "models/model_test_util.h"

namespace gradscope {
namespace lora_test {

using nlohmann::json;
using testing::random_ids;
using testing::random_normal;

const char* const kModels[] = {"llama", "modernbert", "vit", "nanovlm"};
const std::vector<std::string> kAllTargets = {"q", "k", "v", "o", "gate", "up", "down"};

json tiny(const std::string& model) { return model_registry().get(model).preset("tiny"); }

std::shared_ptr<Model> build(const std::string& model, uint64_t seed = 1) {
  return model_registry().get(model).build(tiny(model), seed);
}

LoraOptions options(std::vector<std::string> targets, int64_t rank = 4, double alpha = 8) {
  LoraOptions o;
  o.targets = std::move(targets);
  o.rank = rank;
  o.alpha = alpha;
  return o;
}

// The model's output on a fixed input, in evaluation mode (no dropout).
torch::Tensor output(const std::string& model, Model& m) {
  return testing::model_output(model, m, tiny(model));
}

// An adapted linear layer is x W^T + b + (alpha / r) x A^T B^T, written out in float64.
TEST(Lora, AdaptedLinearIsTheLowRankUpdate) {
  auto gen = at::detail::createCPUGenerator(7);
  SelfAttention attention(SelfAttentionOptions(6, 2));
  auto names = attach_lora(*attention, options({"q"}, 3, 6), gen);
  ASSERT_EQ(names, std::vector<std::string>{"q_proj"});
  auto* adapter = lora_adapter_of(*attention->q_proj);
  ASSERT_NE(adapter, nullptr);
  EXPECT_EQ(adapter->A.sizes(), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(adapter->B.sizes(), (std::vector<int64_t>{6, 3}));
  // A drawn in +-1/sqrt(in), B zero: the adapted layer starts as the base.
  EXPECT_LE(adapter->A.abs().max().item<double>(), 1.0 / std::sqrt(6.0));
  EXPECT_GT(adapter->A.abs().max().item<double>(), 0.0);
  EXPECT_EQ(adapter->B.abs().max().item<double>(), 0.0);
  draw_lora_b(*attention, 0.5, gen);
  const auto x = random_normal({4, 6}, 11);
  const auto y = adapted_linear(*attention->q_proj, x);
  const auto xd = x.to(torch::kFloat64);
  const auto w = attention->q_proj->weight.detach().to(torch::kFloat64);
  const auto a = adapter->A.detach().to(torch::kFloat64);
  const auto b = adapter->B.detach().to(torch::kFloat64);
  const auto expected = xd.mm(w.t()) + (6.0 / 3.0) * xd.mm(a.t()).mm(b.t());
  EXPECT_TRUE(torch::allclose(y.to(torch::kFloat64), expected, 1e-5, 1e-6));
  // The merged weight gives the same product.
  const auto merged = lora_merged_weights(*attention);
  ASSERT_EQ(merged.count("q_proj.weight"), 1u);
  EXPECT_TRUE(torch::allclose(xd.mm(merged.at("q_proj.weight").to(torch::kFloat64).t()), expected,
                              1e-5, 1e-6));
}

// Each model: the targeted projections get adapters, everything else is frozen (but ViT's
// classifier), an adapted model starts equal to its base, and backward reaches only the
// trainable parameters.
TEST(Lora, AdaptsEveryModelAndFreezesTheRest) {
  for (const char* model : kModels) {
    SCOPED_TRACE(model);
    auto base = build(model);
    auto adapted = build(model);
    auto gen = at::detail::createCPUGenerator(3);
    const auto names = adapted->add_lora(options(kAllTargets), gen);
    ASSERT_FALSE(names.empty());
    if (std::string(model) == "nanovlm") {
      for (const auto& n : names) EXPECT_EQ(n.rfind("decoder.", 0), 0u) << n;
    }
    for (const auto& item : adapted->named_parameters()) {
      const bool trains = is_lora_parameter(item.key()) ||
                          (std::string(model) == "vit" && item.key().rfind("classifier.", 0) == 0);
      EXPECT_EQ(item.value().requires_grad(), trains) << item.key();
    }
    EXPECT_TRUE(torch::equal(output(model, *base), output(model, *adapted)));
  }
}

TEST(Lora, TargetsMapToEachModelsProjections) {
  auto count = [](const std::string& model, std::vector<std::string> targets) {
    auto m = build(model);
    auto gen = at::detail::createCPUGenerator(3);
    return m->add_lora(options(std::move(targets)), gen);
  };
  const int64_t llama_layers = tiny("llama")["num_hidden_layers"].get<int64_t>();
  EXPECT_EQ(count("llama", {"q", "v"}).size(), static_cast<size_t>(2 * llama_layers));
  // ViT: fc1 is up, fc2 down; it has no gate.
  const auto vit = count("vit", {"up", "down"});
  ASSERT_FALSE(vit.empty());
  for (const auto& n : vit)
    EXPECT_TRUE(n.size() > 4 &&
                (n.substr(n.size() - 3) == "fc1" || n.substr(n.size() - 3) == "fc2"))
        << n;
  EXPECT_TRUE(count("vit", {"gate"}).empty());
  // ModernBERT: Wi holds gate and up, adapted once for either or both.
  const auto bert_gate = count("modernbert", {"gate"});
  const auto bert_both = count("modernbert", {"gate", "up"});
  EXPECT_EQ(bert_gate, bert_both);
  for (const auto& n : bert_both) EXPECT_EQ(n.substr(n.size() - 2), "Wi") << n;
}

// The merged weights saved under the published names reproduce the adapted model's output
// when loaded into a plain model.
TEST(Lora, MergedWeightsReproduceTheAdaptedModel) {
  for (const char* model : kModels) {
    SCOPED_TRACE(model);
    auto adapted = build(model);
    auto gen = at::detail::createCPUGenerator(5);
    adapted->add_lora(options(kAllTargets), gen);
    draw_lora_b(*adapted, 0.05, gen);
    const auto expected = output(model, *adapted);
    auto plain = build(model, 2);
    std::map<std::string, torch::Tensor> tensors;
    for (const auto& [name, t] : hf_tensors(model, *adapted)) tensors[name] = t.clone();
    load_hf_tensors(model, *plain, tensors, "merged");
    const auto got = output(model, *plain);
    EXPECT_TRUE(torch::allclose(got, expected, 1e-4, 1e-5))
        << (got - expected).abs().max().item<double>();
    EXPECT_FALSE(torch::equal(output(model, *build(model)), expected));  // the adapters mattered
  }
}

// Exported adapters (PEFT's layout) rebuild each adapted weight: W + (alpha' / r') B' A' with
// the module's rank and alpha from the patterns, ModernBERT's stacked Wqkv included.
TEST(Lora, ExportedAdaptersRebuildTheMergedWeights) {
  for (const char* model : kModels) {
    SCOPED_TRACE(model);
    auto m = build(model);
    auto gen = at::detail::createCPUGenerator(9);
    const auto lora = options({"q", "v", "down"}, 3, 5);
    m->add_lora(lora, gen);
    draw_lora_b(*m, 0.05, gen);
    const AdapterExport exported = hf_adapters(model, *m, lora, "");
    std::map<std::string, torch::Tensor> merged;
    for (const auto& [name, t] : hf_tensors(model, *m)) merged[name] = t;
    auto base = build(model);
    std::map<std::string, torch::Tensor> plain;
    for (const auto& [name, t] : hf_tensors(model, *base)) plain[name] = t;
    std::map<std::string, torch::Tensor> tensors(exported.tensors.begin(), exported.tensors.end());
    // The module names PEFT finds in the model transformers builds, and the published module
    // each stands for (they differ for ViT under transformers 5).
    std::map<std::string, std::string> published_of;
    const PublishedNames& names = hf_weights_detail::published_names(model);
    for (const auto& [name, t] : plain) {
      const std::string module = name.substr(0, name.rfind('.'));
      published_of[names.adapter_module ? names.adapter_module(module) : module] = module;
    }
    const json& c = exported.config;
    EXPECT_EQ(c["peft_type"], "LORA");
    EXPECT_EQ(c["r"], 3);
    ASSERT_FALSE(c["target_modules"].empty());
    for (const auto& module : c["target_modules"]) {
      const std::string name = module.get<std::string>();
      const auto& a = tensors.at("base_model.model." + name + ".lora_A.weight");
      const auto& b = tensors.at("base_model.model." + name + ".lora_B.weight");
      const double r = c["rank_pattern"].value(name, 3.0);
      const double alpha = c["alpha_pattern"].value(name, 5.0);
      EXPECT_EQ(a.size(0), static_cast<int64_t>(r));
      const std::string weight = published_of.at(name) + ".weight";
      const auto rebuilt = plain.at(weight) + (alpha / r) * b.mm(a);
      EXPECT_TRUE(torch::allclose(rebuilt, merged.at(weight), 1e-5, 1e-6)) << name;
    }
    if (std::string(model) == "vit") {
      EXPECT_EQ(published_of.at("vit.layers.1.attention.q_proj"),
                "vit.encoder.layer.1.attention.attention.query");
      EXPECT_EQ(published_of.at("vit.layers.0.mlp.fc2"), "vit.encoder.layer.0.output.dense");
      EXPECT_EQ(c["modules_to_save"], json::array({"classifier"}));
      EXPECT_EQ(tensors.count("base_model.model.classifier.weight"), 1u);
    }
  }
}

// Text from an adapters file reaches a message without its control characters: a key that
// would drive the terminal is refused, and named with '?' where its control bytes were.
TEST(Lora, AnAdapterConfigKeyIsNamedWithoutItsControlCharacters) {
  auto m = build("llama");
  auto gen = at::detail::createCPUGenerator(9);
  const auto lora = options({"q"}, 3, 5);
  m->add_lora(lora, gen);
  const AdapterExport exported = hf_adapters("llama", *m, lora, "");
  const std::map<std::string, torch::Tensor> tensors(exported.tensors.begin(),
                                                     exported.tensors.end());
  json config = exported.config;
  load_hf_adapters("llama", *m, lora, config, tensors, "adapters");  // as written: loads
  config["\x1b]0;title\x07"] = true;
  std::string what;
  try {
    load_hf_adapters("llama", *m, lora, config, tensors, "adapters");
    ADD_FAILURE() << "a key that turns on a LoRA variant was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    what = e.what();
  }
  EXPECT_EQ(what.find('\x1b'), std::string::npos) << what;
  EXPECT_NE(what.find("?]0;title?"), std::string::npos) << what;
}

}  // namespace lora_test
}  // namespace gradscope
