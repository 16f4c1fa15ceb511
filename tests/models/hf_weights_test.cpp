#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/models/hf_weights.h"
#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/registry.h"
#include "gradscope/models/vit.h"
#include "models/model_test_util.h"

namespace gradscope {
namespace hf_weights_test {

using nlohmann::json;
using testing::model_output;
using testing::module_param_count;
using testing::random_ids;
using testing::random_normal;
using TensorList = std::vector<std::pair<std::string, torch::Tensor>>;
using ShapeList = std::vector<std::pair<std::string, std::vector<int64_t>>>;

const char* const kPublishedModels[] = {"llama", "modernbert", "vit", "nanovlm"};

json preset_of(const std::string& model, const std::string& preset) {
  return model_registry().get(model).preset(preset);
}

std::shared_ptr<Model> build_model(const std::string& model, const json& arch, uint64_t seed) {
  return model_registry().get(model).build(arch, seed);
}

// Every parameter set to values drawn from `seed`, so that two models agree nowhere by chance
// (norms start at one and biases at zero whatever the seed).
void scramble(Model& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(random_normal(p.sizes(), seed++));
}

std::map<std::string, torch::Tensor> as_map(const TensorList& list) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : list) out[name] = t.clone();
  return out;
}

ShapeList names_and_shapes(const TensorList& list) {
  ShapeList out;
  for (const auto& [name, t] : list) out.emplace_back(name, t.sizes().vec());
  return out;
}

std::vector<int64_t> shape_of(const ShapeList& list, const std::string& name) {
  for (const auto& [n, shape] : list)
    if (n == name) return shape;
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

bool has_name(const ShapeList& list, const std::string& name) {
  for (const auto& entry : list)
    if (entry.first == name) return true;
  return false;
}

int64_t numel_of(const ShapeList& list, const std::string& skip = "") {
  int64_t n = 0;
  for (const auto& [name, shape] : list) {
    if (name == skip) continue;
    int64_t k = 1;
    for (const int64_t d : shape) k *= d;
    n += k;
  }
  return n;
}

// Runs fn, expecting a usage error whose message holds every one of `parts`.
template <typename Fn>
void expect_usage_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming " << parts.front();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << e.what() << "' lacks '" << part << "'";
  }
}

// Every parameter of `a` equals `b`'s bitwise.
void expect_same_parameters(Model& a, Model& b, const std::string& what) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size()) << what;
  for (const auto& item : pa) {
    const torch::Tensor* other = pb.find(item.key());
    ASSERT_TRUE(other) << what << ": " << item.key();
    EXPECT_TRUE(torch::equal(item.value(), *other)) << what << ": " << item.key();
  }
}

// ---------------------------------------------------------------------------------------
// Tensors

TEST(HfWeights, RoundTripAtTinyLoadsEveryParameterBitwise) {
  for (const char* model : kPublishedModels) {
    const json arch = preset_of(model, "tiny");
    auto a = build_model(model, arch, 1);
    scramble(*a, 100);
    auto b = build_model(model, arch, 2);
    load_hf_tensors(model, *b, as_map(hf_tensors(model, *a)), "a.safetensors");
    expect_same_parameters(*a, *b, model);
    EXPECT_TRUE(torch::equal(model_output(model, *a, arch), model_output(model, *b, arch)))
        << model;
  }
}

TEST(HfWeights, CoverEveryParameterExactlyOnce) {
  for (const char* model : kPublishedModels) {
    const json arch = preset_of(model, "tiny");
    auto m = build_model(model, arch, 1);
    const TensorList tensors = hf_tensors(model, *m);
    std::set<std::string> names;
    std::set<const void*> storage;
    for (const auto& p : m->parameters()) storage.insert(p.data_ptr());
    int64_t shared = 0;
    for (const auto& [name, t] : tensors) {
      EXPECT_TRUE(names.insert(name).second) << model << ": " << name << " twice";
      if (storage.count(t.data_ptr())) ++shared;  // the model's own tensor, not a copy
    }
    // The tensors hold every parameter's values once (nanoVLM's rotary frequencies are not a
    // parameter), and all but the stacked projections are the parameters themselves.
    EXPECT_EQ(numel_of(names_and_shapes(tensors), "decoder.rotary_embd.inv_freq"),
              module_param_count(*m))
        << model;
    EXPECT_EQ(numel_of(names_and_shapes(tensors), "decoder.rotary_embd.inv_freq"),
              model_registry().get(model).count_params(arch))
        << model;
    int64_t stacked = 0;
    for (const auto& [name, t] : tensors)
      if (name.find("Wqkv") != std::string::npos || name.find("qkv_proj") != std::string::npos)
        ++stacked;
    const int64_t computed = std::string(model) == "nanovlm" ? 1 : 0;
    EXPECT_EQ(shared + stacked + computed, static_cast<int64_t>(tensors.size())) << model;
  }
}

TEST(HfWeights, ShapesWithoutBuildingMatchTheTensorsAtTinyAndSmall) {
  for (const char* model : kPublishedModels) {
    for (const char* preset : {"tiny", "small"}) {
      const json arch = preset_of(model, preset);
      auto m = build_model(model, arch, 1);
      EXPECT_EQ(hf_tensor_shapes(model, arch), names_and_shapes(hf_tensors(model, *m)))
          << model << " " << preset;
    }
  }
}

TEST(HfWeights, LlamaPaperListsLlama32OneBAsPublished) {
  const json arch = preset_of("llama", "paper");
  const ShapeList shapes = hf_tensor_shapes("llama", arch);
  ASSERT_EQ(shapes.size(), 146u);  // 16 layers x 9, embeddings, final norm; head tied
  EXPECT_EQ(shapes.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(shapes.front().second, (std::vector<int64_t>{128256, 2048}));
  EXPECT_EQ(shapes.back().first, "model.norm.weight");
  const std::vector<std::string> layer0 = {
      "model.layers.0.self_attn.q_proj.weight",        "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",        "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.mlp.gate_proj.weight",           "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",           "model.layers.0.input_layernorm.weight",
      "model.layers.0.post_attention_layernorm.weight"};
  for (size_t i = 0; i < layer0.size(); ++i) EXPECT_EQ(shapes[1 + i].first, layer0[i]);
  EXPECT_EQ(shape_of(shapes, "model.layers.0.self_attn.k_proj.weight"),
            (std::vector<int64_t>{512, 2048}));
  EXPECT_EQ(shape_of(shapes, "model.layers.15.mlp.down_proj.weight"),
            (std::vector<int64_t>{2048, 8192}));
  EXPECT_FALSE(has_name(shapes, "lm_head.weight"));
  EXPECT_EQ(numel_of(shapes), llama_count_params(arch));
}

TEST(HfWeights, ModernBertPaperListsFusedProjectionsAndNoDecoderWeight) {
  const json arch = preset_of("modernbert", "paper");
  const ShapeList shapes = hf_tensor_shapes("modernbert", arch);
  // Embeddings and their norm, 22 layers of 6 (layer 0 without attn_norm), the final norm,
  // the head's dense and norm, the decoder's bias.
  EXPECT_EQ(shapes.size(), 2u + 22 * 6 - 1 + 1 + 2 + 1);
  EXPECT_EQ(shapes.front().first, "model.embeddings.tok_embeddings.weight");
  EXPECT_FALSE(has_name(shapes, "model.layers.0.attn_norm.weight"));
  EXPECT_TRUE(has_name(shapes, "model.layers.1.attn_norm.weight"));
  EXPECT_EQ(shape_of(shapes, "model.layers.0.attn.Wqkv.weight"), (std::vector<int64_t>{2304, 768}));
  EXPECT_EQ(shape_of(shapes, "model.layers.21.mlp.Wi.weight"), (std::vector<int64_t>{2304, 768}));
  EXPECT_EQ(shape_of(shapes, "model.layers.21.mlp.Wo.weight"), (std::vector<int64_t>{768, 1152}));
  EXPECT_EQ(shape_of(shapes, "head.dense.weight"), (std::vector<int64_t>{768, 768}));
  EXPECT_EQ(shapes.back().first, "decoder.bias");
  EXPECT_EQ(shapes.back().second, (std::vector<int64_t>{50368}));
  EXPECT_FALSE(has_name(shapes, "decoder.weight"));  // tied, as the published file
  EXPECT_EQ(numel_of(shapes), 149655232);
}

TEST(HfWeights, VitPaperListsVitBase16AsPublished) {
  const json arch = preset_of("vit", "paper");
  const ShapeList shapes = hf_tensor_shapes("vit", arch);
  EXPECT_EQ(shapes.size(), 4u + 12 * 16 + 2 + 2);
  EXPECT_EQ(shapes[0].first, "vit.embeddings.cls_token");
  EXPECT_EQ(shapes[1].first, "vit.embeddings.position_embeddings");
  EXPECT_EQ(shapes[1].second, (std::vector<int64_t>{1, 197, 768}));
  EXPECT_EQ(shape_of(shapes, "vit.embeddings.patch_embeddings.projection.weight"),
            (std::vector<int64_t>{768, 3, 16, 16}));
  EXPECT_EQ(shape_of(shapes, "vit.encoder.layer.11.attention.attention.value.bias"),
            (std::vector<int64_t>{768}));
  EXPECT_EQ(shape_of(shapes, "vit.encoder.layer.0.intermediate.dense.weight"),
            (std::vector<int64_t>{3072, 768}));
  EXPECT_EQ(shape_of(shapes, "classifier.weight"), (std::vector<int64_t>{10, 768}));
  EXPECT_EQ(shapes.back().first, "classifier.bias");
  EXPECT_EQ(numel_of(shapes), vit_count_params(arch));
}

TEST(HfWeights, NanoVlmPaperListsNanoVlm222MStateDict) {
  const json arch = preset_of("nanovlm", "paper");
  const ShapeList shapes = hf_tensor_shapes("nanovlm", arch);
  // Vision: position, conv weight and bias, 12 blocks of 12, final norm; decoder: embeddings,
  // rotary frequencies, 30 blocks of 9, final norm; the projector.
  EXPECT_EQ(shapes.size(), (3u + 12 * 12 + 2) + (2 + 30 * 9 + 1) + 1);
  EXPECT_EQ(shapes.front().first, "vision_encoder.patch_embedding.position_embedding");
  EXPECT_EQ(shapes.front().second, (std::vector<int64_t>{1, 196, 768}));
  EXPECT_EQ(shape_of(shapes, "vision_encoder.blocks.0.attn.qkv_proj.weight"),
            (std::vector<int64_t>{2304, 768}));
  EXPECT_EQ(shape_of(shapes, "decoder.token_embedding.weight"), (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(shape_of(shapes, "decoder.rotary_embd.inv_freq"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shape_of(shapes, "decoder.blocks.29.attn.k_proj.weight"),
            (std::vector<int64_t>{192, 576}));
  EXPECT_EQ(shapes.back().first, "MP.proj.weight");
  EXPECT_EQ(shapes.back().second, (std::vector<int64_t>{576, 3072}));
  EXPECT_FALSE(has_name(shapes, "decoder.head.weight"));
  EXPECT_EQ(numel_of(shapes, "decoder.rotary_embd.inv_freq"), nanovlm_count_params(arch));
}

TEST(HfWeights, ModernBertStacksQueryKeyValueByRows) {
  const json arch = preset_of("modernbert", "tiny");
  auto m = std::dynamic_pointer_cast<ModernBertModel>(build_model("modernbert", arch, 1));
  const auto tensors = as_map(hf_tensors("modernbert", *m));
  const torch::Tensor wqkv = tensors.at("model.layers.1.attn.Wqkv.weight");  // (3C, C)
  const auto blocks = m->blocks();
  const auto& attn = dynamic_cast<const ModernBertBlock&>(*blocks[1]).attn;
  EXPECT_TRUE(torch::equal(wqkv.narrow(0, 0, 64), attn->q_proj->weight));
  EXPECT_TRUE(torch::equal(wqkv.narrow(0, 64, 64), attn->k_proj->weight));
  EXPECT_TRUE(torch::equal(wqkv.narrow(0, 128, 64), attn->v_proj->weight));
}

TEST(HfWeights, UntiedLlamaWritesItsHeadLast) {
  json arch = preset_of("llama", "tiny");
  arch["tie_word_embeddings"] = false;
  auto a = build_model("llama", arch, 1);
  const TensorList tensors = hf_tensors("llama", *a);
  EXPECT_EQ(tensors.back().first, "lm_head.weight");
  auto b = build_model("llama", arch, 2);
  load_hf_tensors("llama", *b, as_map(tensors), "a.safetensors");
  expect_same_parameters(*a, *b, "untied llama");
}

TEST(HfWeights, LoadConvertsToTheParameterDtype) {
  const json arch = preset_of("llama", "tiny");
  auto a = build_model("llama", arch, 1);
  std::map<std::string, torch::Tensor> half;
  for (const auto& [name, t] : hf_tensors("llama", *a)) half[name] = t.to(torch::kBFloat16);
  auto b = build_model("llama", arch, 2);
  load_hf_tensors("llama", *b, half, "half.safetensors");
  const torch::Tensor& w = dynamic_cast<LlamaModel&>(*b).embed_tokens->weight;
  EXPECT_EQ(w.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(w, half.at("model.embed_tokens.weight").to(torch::kFloat)));
}

TEST(HfWeights, MissingExtraOrMisshapenTensorIsAUsageErrorAndNothingLoads) {
  const json arch = preset_of("llama", "tiny");
  auto a = build_model("llama", arch, 1);
  auto b = build_model("llama", arch, 2);
  auto untouched = build_model("llama", arch, 2);
  const auto good = as_map(hf_tensors("llama", *a));

  auto missing = good;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  expect_usage_error([&] { load_hf_tensors("llama", *b, missing, "w.safetensors"); },
                     {"w.safetensors", "model.layers.1.mlp.up_proj.weight"});

  auto extra = good;
  extra["model.layers.2.mlp.up_proj.weight"] = torch::zeros({192, 64});
  expect_usage_error([&] { load_hf_tensors("llama", *b, extra, "w.safetensors"); },
                     {"w.safetensors", "model.layers.2.mlp.up_proj.weight"});

  // The last tensor of the list: every other one would have been copied before it.
  auto misshapen = good;
  misshapen["model.norm.weight"] = torch::ones({65});
  expect_usage_error([&] { load_hf_tensors("llama", *b, misshapen, "w.safetensors"); },
                     {"w.safetensors", "model.norm.weight", "[65]", "[64]"});

  expect_same_parameters(*b, *untouched, "after the failed loads");
}

TEST(HfWeights, TiedHeadAcceptedOnlyWhenEqualToTheEmbedding) {
  const json arch = preset_of("llama", "tiny");
  auto a = build_model("llama", arch, 1);
  auto b = build_model("llama", arch, 2);
  auto tensors = as_map(hf_tensors("llama", *a));
  EXPECT_EQ(tensors.count("lm_head.weight"), 0u);

  tensors["lm_head.weight"] = tensors.at("model.embed_tokens.weight").clone();
  load_hf_tensors("llama", *b, tensors, "w.safetensors");
  expect_same_parameters(*a, *b, "head given too");

  auto c = build_model("llama", arch, 3);
  tensors["lm_head.weight"][0][0] += 1.0f;
  expect_usage_error([&] { load_hf_tensors("llama", *c, tensors, "w.safetensors"); },
                     {"w.safetensors", "lm_head.weight", "not tied"});

  // ModernBERT's tied decoder, likewise.
  const json bert_arch = preset_of("modernbert", "tiny");
  auto bert = build_model("modernbert", bert_arch, 1);
  auto bert_tensors = as_map(hf_tensors("modernbert", *bert));
  bert_tensors["decoder.weight"] =
      bert_tensors.at("model.embeddings.tok_embeddings.weight").clone();
  auto bert_b = build_model("modernbert", bert_arch, 2);
  load_hf_tensors("modernbert", *bert_b, bert_tensors, "w.safetensors");
  expect_same_parameters(*bert, *bert_b, "modernbert with decoder.weight");
  bert_tensors["decoder.weight"] = bert_tensors["decoder.weight"].to(torch::kBFloat16);
  expect_usage_error([&] { load_hf_tensors("modernbert", *bert_b, bert_tensors, "w.safetensors"); },
                     {"decoder.weight", "not tied"});
}

TEST(HfWeights, NanoVlmReadsItsTiedHeadUnderEitherName) {
  // nanoVLM's files come from safetensors' save_model, which keeps the first name in sorted
  // order of a shared tensor: decoder.head.weight, not decoder.token_embedding.weight.
  const json arch = preset_of("nanovlm", "tiny");
  auto a = build_model("nanovlm", arch, 1);
  scramble(*a, 7);
  auto tensors = as_map(hf_tensors("nanovlm", *a));
  tensors["decoder.head.weight"] = tensors.at("decoder.token_embedding.weight");
  tensors.erase("decoder.token_embedding.weight");
  auto b = build_model("nanovlm", arch, 2);
  load_hf_tensors("nanovlm", *b, tensors, "nanovlm.safetensors");
  expect_same_parameters(*a, *b, "nanovlm, head name only");
}

TEST(HfWeights, NanoVlmRotaryFrequenciesMustMatchTheConfig) {
  const json arch = preset_of("nanovlm", "tiny");
  auto a = build_model("nanovlm", arch, 1);
  auto tensors = as_map(hf_tensors("nanovlm", *a));
  // nanoVLM's inv_freq = 1 / base^(2j / HS) with base lm_re_base = rope_theta.
  const torch::Tensor inv_freq = tensors.at("decoder.rotary_embd.inv_freq");
  const double theta = arch["rope_theta"].get<double>();
  const int64_t hs = 64 / 4;
  EXPECT_NEAR(inv_freq[1].item<double>(), std::pow(theta, -2.0 / hs), 1e-6);
  tensors["decoder.rotary_embd.inv_freq"] = inv_freq * 2;
  auto b = build_model("nanovlm", arch, 2);
  expect_usage_error([&] { load_hf_tensors("nanovlm", *b, tensors, "w.safetensors"); },
                     {"w.safetensors", "decoder.rotary_embd.inv_freq"});
}

TEST(HfWeights, ToyModelsHaveNoPublishedNames) {
  const json arch = preset_of("quadratic", "tiny");
  auto toy = build_model("quadratic", arch, 1);
  expect_usage_error([&] { hf_config("quadratic", arch); }, {"quadratic"});
  expect_usage_error([&] { hf_tensor_shapes("quadratic", arch); }, {"quadratic"});
  expect_usage_error([&] { hf_tensors("quadratic", *toy); }, {"quadratic"});
  expect_usage_error([&] { load_hf_tensors("quadratic", *toy, {}, "w.safetensors"); },
                     {"quadratic"});
  expect_usage_error([&] { arch_from_hf_config("rosenbrock", json::object(), arch, "c.json"); },
                     {"rosenbrock"});
}

// ---------------------------------------------------------------------------------------
// Configurations

TEST(HfConfig, RoundTripsEveryPresetExactly) {
  for (const char* model : kPublishedModels) {
    for (const auto& preset : model_registry().get(model).presets) {
      const json arch = preset_of(model, preset);
      const json config = hf_config(model, arch);
      EXPECT_EQ(arch_from_hf_config(model, config, json::object(), "config.json").dump(),
                arch.dump())
          << model << " " << preset;
      // Whatever the base: the config gives every key.
      EXPECT_EQ(arch_from_hf_config(model, config, preset_of(model, "tiny"), "config.json").dump(),
                arch.dump())
          << model << " " << preset;
    }
  }
}

TEST(HfConfig, WritesThePublishedClassAndKeys) {
  const json llama = hf_config("llama", preset_of("llama", "paper"));
  EXPECT_EQ(llama["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(llama["model_type"], "llama");
  EXPECT_EQ(llama["hidden_act"], "silu");
  EXPECT_EQ(llama["num_key_value_heads"], 8);
  EXPECT_EQ(llama["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(llama["gradscope"]["tokenizer"], "llama3");
  EXPECT_EQ(llama["gradscope"]["seq_len"], 2048);
  EXPECT_EQ(llama["gradscope"]["hidden_dropout"], 0.0);
  EXPECT_FALSE(llama.contains("seq_len"));
  EXPECT_FALSE(llama["gradscope"].contains("hidden_size"));

  const json bert = hf_config("modernbert", preset_of("modernbert", "paper"));
  EXPECT_EQ(bert["architectures"], json::array({"ModernBertForMaskedLM"}));
  EXPECT_EQ(bert["global_rope_theta"], 160000.0);
  EXPECT_EQ(bert["gradscope"]["mlm_probability"], 0.3);

  const json vit = hf_config("vit", preset_of("vit", "paper"));
  EXPECT_EQ(vit["architectures"], json::array({"ViTForImageClassification"}));
  EXPECT_EQ(vit["hidden_dropout_prob"], 0.1);
  EXPECT_EQ(vit["id2label"].size(), 10u);
  EXPECT_EQ(vit["id2label"]["3"], "LABEL_3");
  EXPECT_EQ(vit["gradscope"]["seq_len"], 197);

  const json vlm = hf_config("nanovlm", preset_of("nanovlm", "paper"));
  EXPECT_FALSE(vlm.contains("architectures"));
  EXPECT_EQ(vlm["vit_hidden_dim"], 768);
  EXPECT_EQ(vlm["lm_hidden_dim"], 576);
  EXPECT_EQ(vlm["lm_re_base"], 100000.0);
  EXPECT_EQ(vlm["lm_vocab_size"], 49152);
  EXPECT_EQ(vlm["mp_pixel_shuffle_factor"], 2);
  EXPECT_EQ(vlm["vit_cls_flag"], false);
  EXPECT_EQ(vlm["lm_max_length"], 64);
  EXPECT_EQ(vlm["gradscope"]["published_vocab_size"], 49152);
}

// meta-llama/Llama-3.2-1B's config.json.
const char* const kLlama32OneB = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

// answerdotai/ModernBERT-base's config.json.
const char* const kModernBertBase = R"({
  "architectures": ["ModernBertForMaskedLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 50281, "classifier_activation": "gelu",
  "classifier_bias": false, "classifier_dropout": 0.0, "classifier_pooling": "mean",
  "cls_token_id": 50281, "decoder_bias": true, "deterministic_flash_attn": false,
  "embedding_dropout": 0.0, "eos_token_id": 50282, "global_attn_every_n_layers": 3,
  "global_rope_theta": 160000.0, "gradient_checkpointing": false, "hidden_activation": "gelu",
  "hidden_size": 768, "initializer_cutoff_factor": 2.0, "initializer_range": 0.02,
  "intermediate_size": 1152, "layer_norm_eps": 1e-05, "local_attention": 128,
  "local_rope_theta": 10000.0, "max_position_embeddings": 8192, "mlp_bias": false,
  "mlp_dropout": 0.0, "model_type": "modernbert", "norm_bias": false, "norm_eps": 1e-05,
  "num_attention_heads": 12, "num_hidden_layers": 22, "pad_token_id": 50283,
  "position_embedding_type": "absolute", "sep_token_id": 50282,
  "sparse_pred_ignore_index": -100, "sparse_prediction": false, "torch_dtype": "float32",
  "transformers_version": "4.47.0.dev0", "vocab_size": 50368})";

// lusxvr/nanoVLM-222M's config.json: nanoVLM v0.1's VLMConfig.
const char* const kNanoVlm222M = R"({
  "vit_hidden_dim": 768, "vit_inter_dim": 3072, "vit_patch_size": 16, "vit_img_size": 224,
  "vit_n_heads": 12, "vit_dropout": 0.0, "vit_n_blocks": 12, "vit_ln_eps": 1e-06,
  "vit_cls_flag": false, "vit_model_type": "google/siglip-base-patch16-224",
  "lm_hidden_dim": 576, "lm_inter_dim": 1536, "lm_rms_eps": 1e-05, "lm_re_base": 100000,
  "lm_max_position_embeddings": 8192, "lm_vocab_size": 49152, "lm_n_heads": 9,
  "lm_n_kv_heads": 3, "lm_dropout": 0.0, "lm_n_blocks": 30, "lm_attn_scaling": 1.0,
  "lm_max_length": 79, "lm_use_tokens": false, "lm_tie_weights": true,
  "lm_model_type": "HuggingFaceTB/SmolLM2-135M", "lm_tokenizer": "HuggingFaceTB/cosmo2-tokenizer",
  "lm_eos_token_id": 0, "mp_pixel_shuffle_factor": 2, "vlm_load_backbone_weights": true,
  "vlm_checkpoint_path": "checkpoints/nanoVLM-222M"})";

TEST(HfConfig, ReadsThePublishedConfigsOverThePaperPresets) {
  const json llama_paper = preset_of("llama", "paper");
  json llama = arch_from_hf_config("llama", json::parse(kLlama32OneB), llama_paper, "config.json");
  EXPECT_EQ(llama["head_dim"], 64);  // given by the config, 2048 / 32 as the preset implies
  llama.erase("head_dim");
  EXPECT_EQ(llama.dump(), llama_paper.dump());

  const json bert_paper = preset_of("modernbert", "paper");
  EXPECT_EQ(
      arch_from_hf_config("modernbert", json::parse(kModernBertBase), bert_paper, "config.json")
          .dump(),
      bert_paper.dump());

  const json vlm_paper = preset_of("nanovlm", "paper");
  EXPECT_EQ(
      arch_from_hf_config("nanovlm", json::parse(kNanoVlm222M), vlm_paper, "config.json").dump(),
      vlm_paper.dump());

  // google/vit-base-patch16-224: 1000 ImageNet classes and no dropout.
  json vit_config = {{"architectures", {"ViTForImageClassification"}},
                     {"attention_probs_dropout_prob", 0.0},
                     {"hidden_act", "gelu"},
                     {"hidden_dropout_prob", 0.0},
                     {"hidden_size", 768},
                     {"image_size", 224},
                     {"initializer_range", 0.02},
                     {"intermediate_size", 3072},
                     {"layer_norm_eps", 1e-12},
                     {"model_type", "vit"},
                     {"num_attention_heads", 12},
                     {"num_channels", 3},
                     {"num_hidden_layers", 12},
                     {"patch_size", 16},
                     {"qkv_bias", true}};
  for (int i = 0; i < 1000; ++i)
    vit_config["id2label"][std::to_string(i)] = "class " + std::to_string(i);
  json vit_expected = preset_of("vit", "paper");
  vit_expected["num_labels"] = 1000;
  vit_expected["hidden_dropout"] = 0.0;
  EXPECT_EQ(arch_from_hf_config("vit", vit_config, preset_of("vit", "paper"), "config.json").dump(),
            vit_expected.dump());
  EXPECT_EQ(hf_tensor_shapes("vit", vit_expected).back().second, (std::vector<int64_t>{1000}));
}

TEST(HfConfig, KeysTheConfigDoesNotGiveKeepTheBase) {
  const json base = preset_of("llama", "small");
  const json arch = arch_from_hf_config("llama", {{"num_hidden_layers", 3}}, base, "c.json");
  json expected = base;
  expected["num_hidden_layers"] = 3;
  EXPECT_EQ(arch.dump(), expected.dump());
  // A published integer where the architecture holds a float: stored as a float.
  EXPECT_TRUE(arch_from_hf_config("llama", {{"rope_theta", 10000}}, base, "c.json")["rope_theta"]
                  .is_number_float());
}

TEST(HfConfig, ReadsTheNewerRopeParametersSpelling) {
  const json base = preset_of("llama", "tiny");
  const json config = {{"rope_parameters",
                        {{"rope_type", "llama3"},
                         {"rope_theta", 500000.0},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}}}};
  const json arch = arch_from_hf_config("llama", config, base, "c.json");
  EXPECT_EQ(arch["rope_theta"], 500000.0);
  EXPECT_EQ(arch["rope_scaling"]["factor"], 8.0);
  EXPECT_FALSE(arch["rope_scaling"].contains("rope_theta"));
  const json plain = arch_from_hf_config(
      "llama", {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}, base,
      "c.json");
  EXPECT_TRUE(plain["rope_scaling"].is_null());

  const json bert = arch_from_hf_config(
      "modernbert",
      {{"rope_parameters",
        {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 80000.0}}},
         {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 5000.0}}}}},
       {"layer_types", {"full_attention", "sliding_attention", "sliding_attention"}}},
      preset_of("modernbert", "tiny"), "c.json");
  EXPECT_EQ(bert["global_rope_theta"], 80000.0);
  EXPECT_EQ(bert["local_rope_theta"], 5000.0);
}

TEST(HfConfig, WrongTypesClassesAndValuesAreUsageErrorsNamingTheKey) {
  const json base = preset_of("llama", "tiny");
  expect_usage_error(
      [&] {
        arch_from_hf_config("llama", {{"hidden_size", "64"}}, base, "m/config.json");
      },
      {"m/config.json", "hidden_size"});
  expect_usage_error(
      [&] {
        arch_from_hf_config("llama", {{"tie_word_embeddings", 1}}, base, "m/config.json");
      },
      {"m/config.json", "tie_word_embeddings"});
  expect_usage_error(
      [&] {
        arch_from_hf_config("llama", {{"architectures", {"MistralForCausalLM"}}}, base,
                            "m/config.json");
      },
      {"m/config.json", "MistralForCausalLM"});
  expect_usage_error(
      [&] {
        arch_from_hf_config("llama", {{"model_type", "vit"}}, base, "m/config.json");
      },
      {"m/config.json", "model_type"});
  expect_usage_error(
      [&] {
        arch_from_hf_config("llama", {{"hidden_act", "gelu"}}, base, "m/config.json");
      },
      {"m/config.json", "hidden_act"});
  expect_usage_error(
      [&] {
        arch_from_hf_config("llama", {{"gradscope", {{"hidden_size", 32}}}}, base, "m/config.json");
      },
      {"m/config.json", "gradscope.hidden_size"});
  expect_usage_error(
      [&] {
        arch_from_hf_config("llama", {{"gradscope", {{"seq_len", "long"}}}}, base, "m/config.json");
      },
      {"m/config.json", "gradscope.seq_len"});
  // A valid type but not a valid architecture: the model's own check, naming the file.
  expect_usage_error(
      [&] {
        arch_from_hf_config("llama", {{"num_key_value_heads", 3}}, base, "m/config.json");
      },
      {"m/config.json", "num_key_value_heads"});

  const json vlm = preset_of("nanovlm", "tiny");
  expect_usage_error(
      [&] {
        arch_from_hf_config("nanovlm", {{"vit_cls_flag", true}}, vlm, "v/config.json");
      },
      {"v/config.json", "vit_cls_flag"});
  expect_usage_error(
      [&] { arch_from_hf_config("nanovlm", json::parse(kLlama32OneB), vlm, "v/config.json"); },
      {"v/config.json", "architectures"});
  expect_usage_error(
      [&] {
        arch_from_hf_config("modernbert", {{"classifier_bias", true}},
                            preset_of("modernbert", "tiny"), "b/config.json");
      },
      {"b/config.json", "classifier_bias"});
  expect_usage_error(
      [&] {
        arch_from_hf_config("vit", {{"num_labels", 3}, {"id2label", {{"0", "a"}}}},
                            preset_of("vit", "tiny"), "i/config.json");
      },
      {"i/config.json", "num_labels"});
}

}  // namespace hf_weights_test
}  // namespace gradscope
