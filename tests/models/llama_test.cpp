#include <cmath>
#include <cstdio>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "gradscope/core/error.h"
#include "gradscope/models/common/layers.h"
#include "gradscope/models/llama.h"
#include "models/model_test_util.h"

namespace gradscope {
namespace {

std::shared_ptr<LlamaModel> make_llama_model(const nlohmann::json& arch, uint64_t seed) {
  auto model = std::dynamic_pointer_cast<LlamaModel>(make_llama(arch, seed));
  EXPECT_TRUE(model);
  return model;
}

using testing::max_abs_diff;
using testing::module_param_count;
using testing::random_ids;

// ---------------------------------------------------------------------------------------
// Presets and parameter counts

TEST(LlamaPreset, PaperCountFromConfigAlone) {
  const auto arch = llama_preset("paper");
  EXPECT_EQ(arch["tokenizer"], "llama3");
  EXPECT_EQ(arch["vocab_size"], 128256);
  EXPECT_EQ(arch["seq_len"], 2048);
  EXPECT_EQ(llama_count_params(arch), 1235814400LL);
}

TEST(LlamaPreset, TinyAndSmallAsDesigned) {
  const auto tiny = llama_preset("tiny");
  EXPECT_EQ(tiny["tokenizer"], "bytes");
  EXPECT_EQ(tiny["num_hidden_layers"], 2);
  EXPECT_EQ(tiny["hidden_size"], 64);
  EXPECT_EQ(tiny["num_attention_heads"], 4);
  EXPECT_EQ(tiny["num_key_value_heads"], 2);
  EXPECT_EQ(tiny["intermediate_size"], 192);
  EXPECT_EQ(tiny["seq_len"], 64);
  EXPECT_EQ(tiny["vocab_size"], 320);
  const auto small = llama_preset("small");
  EXPECT_EQ(small["tokenizer"], "gpt2");
  EXPECT_EQ(small["num_hidden_layers"], 6);
  EXPECT_EQ(small["hidden_size"], 256);
  EXPECT_EQ(small["num_attention_heads"], 8);
  EXPECT_EQ(small["num_key_value_heads"], 4);
  EXPECT_EQ(small["intermediate_size"], 768);
  EXPECT_EQ(small["seq_len"], 128);
  EXPECT_EQ(small["vocab_size"], 50304);
}

TEST(LlamaPreset, UnknownPresetListsValidOnes) {
  try {
    llama_preset("huge");
    FAIL() << "expected a usage error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("huge"), std::string::npos);
    EXPECT_NE(e.hint().find("tiny, small, paper"), std::string::npos);
  }
}

TEST(LlamaConfigCheck, BadArchitecturesAreUsageErrors) {
  auto arch = llama_preset("tiny");
  arch["num_key_value_heads"] = 3;  // 4 heads are not a multiple of 3
  EXPECT_THROW(llama_config(arch), Error);
  arch = llama_preset("tiny");
  arch.erase("hidden_size");
  EXPECT_THROW(llama_config(arch), Error);
  arch = llama_preset("tiny");
  arch["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_THROW(llama_config(arch), Error);
  arch = llama_preset("tiny");
  arch["hidden_size"] = 64.5;
  EXPECT_THROW(llama_config(arch), Error);
  arch = llama_preset("tiny");
  arch["rope_scaling"] = nullptr;  // allowed: plain RoPE
  EXPECT_FALSE(llama_config(arch).rope_scaling.has_value());
}

TEST(LlamaParams, CountMatchesModuleAtTinyAndSmall) {
  for (const std::string preset : {"tiny", "small"}) {
    const auto arch = llama_preset(preset);
    auto model = make_llama_model(arch, 0);
    EXPECT_EQ(llama_count_params(arch), module_param_count(*model)) << preset;
    // Tied: the LM head reuses the embedding, no second (V, C) weight.
    EXPECT_FALSE(model->lm_head) << preset;
  }
}

TEST(LlamaParams, CountMatchesModuleUntiedWithBiases) {
  auto arch = llama_preset("tiny");
  arch["tie_word_embeddings"] = false;
  arch["attention_bias"] = true;
  arch["mlp_bias"] = true;
  auto model = make_llama_model(arch, 0);
  EXPECT_TRUE(model->lm_head);
  EXPECT_EQ(llama_count_params(arch), module_param_count(*model));
  EXPECT_EQ(llama_count_params(arch), llama_count_params(llama_preset("tiny")) + 320 * 64 +
                                          2 * (64 + 2 * 32 + 64 + 2 * 192 + 64));
}

TEST(LlamaParams, HuggingFaceParameterNames) {
  auto model = make_llama_model(llama_preset("tiny"), 0);
  auto params = model->named_parameters();
  for (const char* name : {"embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
                           "layers.0.self_attn.k_proj.weight", "layers.1.self_attn.o_proj.weight",
                           "layers.1.mlp.gate_proj.weight", "layers.1.mlp.up_proj.weight",
                           "layers.1.mlp.down_proj.weight", "layers.0.input_layernorm.weight",
                           "layers.0.post_attention_layernorm.weight", "norm.weight"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  EXPECT_EQ(params["layers.0.self_attn.k_proj.weight"].sizes(), torch::IntArrayRef({32, 64}));
}

// ---------------------------------------------------------------------------------------
// FLOPs

TEST(LlamaFlops, TinyEqualsHandCount) {
  // tiny: C 64, L 2, NH 4, NKV 2, HS 16, I 192, V 320, T 64.
  // per layer matmul weights: q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12288,
  //                           gate/up/down 3*64*192 = 36864           -> 49152
  // 2 layers 98304 + LM head 320*64 = 20480                         -> 118784
  // 2 FLOPs per multiply-add: 237568; attention 2 layers * 2*2*64*64 = 32768.
  EXPECT_DOUBLE_EQ(llama_forward_flops_per_token(llama_preset("tiny"), 64), 270336.0);
}

TEST(LlamaFlops, PaperIsTwiceTheMatmulParametersPlusAttention) {
  // Tied: every parameter but the norms is a matmul weight, the embedding counted once as
  // the LM head.
  const auto arch = llama_preset("paper");
  const double n = 1235814400.0, norms = (2 * 16 + 1) * 2048.0;
  EXPECT_DOUBLE_EQ(llama_forward_flops_per_token(arch, 2048),
                   2 * (n - norms) + 16 * 4.0 * 2048 * 2048);
  EXPECT_THROW(llama_forward_flops_per_token(arch, 0), Error);
}

// ---------------------------------------------------------------------------------------
// Attention

// softmax(q k^T / sqrt(HS) + mask) v one query and one head at a time, with explicit
// loops: query head h reads key/value head h / (NH / NKV).
torch::Tensor naive_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& add_mask, bool causal) {
  const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
  const int64_t NKV = k.size(1), S = k.size(2);
  auto out = torch::zeros_like(q);
  auto qa = q.accessor<double, 4>();
  auto ka = k.accessor<double, 4>();
  auto va = v.accessor<double, 4>();
  auto oa = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t kvh = h / (NH / NKV);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> scores(S, -std::numeric_limits<double>::infinity());
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < S; ++s) {
          if (causal && s > t) continue;
          double dot = 0;
          for (int64_t d = 0; d < HS; ++d) dot += qa[b][h][t][d] * ka[b][kvh][s][d];
          double m = add_mask.defined() ? add_mask[b][0][t][s].item<double>() : 0.0;
          scores[s] = dot / std::sqrt(static_cast<double>(HS)) + m;
          max_score = std::max(max_score, scores[s]);
        }
        double denom = 0;
        for (int64_t s = 0; s < S; ++s) denom += std::exp(scores[s] - max_score);
        for (int64_t s = 0; s < S; ++s) {
          const double w = std::exp(scores[s] - max_score) / denom;
          for (int64_t d = 0; d < HS; ++d) oa[b][h][t][d] += w * va[b][kvh][s][d];
        }
      }
    }
  }
  return out;
}

struct AttentionInputs {
  torch::Tensor q, k, v;
  torch::Tensor add_mask;   // (B, 1, T, S) 0 / -inf: batch 1 cannot see its last 3 keys
  torch::Tensor keep_mask;  // (B, 1, T, S) bool, the same mask in SDPA's convention
};

AttentionInputs attention_inputs(torch::Dtype dtype) {
  const int64_t B = 2, NH = 4, NKV = 2, T = 7, HS = 8;
  auto gen = at::detail::createCPUGenerator(11);
  auto opts = torch::TensorOptions().dtype(dtype);
  AttentionInputs in;
  in.q = torch::randn({B, NH, T, HS}, gen, opts);
  in.k = torch::randn({B, NKV, T, HS}, gen, opts);
  in.v = torch::randn({B, NKV, T, HS}, gen, opts);
  in.keep_mask = torch::ones({B, 1, T, T}, torch::kBool);
  in.keep_mask.index_put_(
      {1, torch::indexing::Slice(), torch::indexing::Slice(), torch::indexing::Slice(T - 3, T)},
      false);
  in.add_mask =
      torch::zeros({B, 1, T, T}, opts)
          .masked_fill(in.keep_mask.logical_not(), -std::numeric_limits<double>::infinity());
  return in;
}

TEST(Attention, MathPathMatchesNaiveLoopWithGqaAndMasks) {
  AttentionPathGuard guard(Attention::kMath);
  auto in = attention_inputs(torch::kDouble);
  // Causal only, padding mask only (additive and bool), and both together. In the last case
  // batch 1's early queries still see key 0, so no row is fully masked.
  struct Case {
    const char* name;
    bool causal;
    bool use_mask;
  };
  for (const Case& c : {Case{"causal", true, false}, Case{"mask", false, true},
                        Case{"mask+causal", true, true}, Case{"none", false, false}}) {
    const torch::Tensor add = c.use_mask ? in.add_mask : torch::Tensor();
    auto ref = naive_attention(in.q, in.k, in.v, add, c.causal);
    auto got = attention(in.q, in.k, in.v, add, c.causal);
    const double diff = max_abs_diff(got, ref);
    EXPECT_LT(diff, 1e-12) << c.name;
    std::printf("  float64 %-11s maxdiff=%.3g\n", c.name, diff);
    if (c.use_mask) {
      auto got_bool = attention(in.q, in.k, in.v, in.keep_mask, c.causal);
      EXPECT_LT(max_abs_diff(got_bool, ref), 1e-12) << c.name << " (bool mask)";
    }
  }
  // float32 too, against the float64 reference.
  auto in32 = attention_inputs(torch::kFloat);
  auto ref = naive_attention(in32.q.to(torch::kDouble), in32.k.to(torch::kDouble),
                             in32.v.to(torch::kDouble), in32.add_mask.to(torch::kDouble), true);
  auto got = attention(in32.q, in32.k, in32.v, in32.add_mask, true);
  const double diff32 = max_abs_diff(got.to(torch::kDouble), ref);
  EXPECT_LT(diff32, 1e-6);
  std::printf("  float32 mask+causal maxdiff=%.3g\n", diff32);
}

TEST(Attention, SdpaMatchesMathPath) {
  auto in = attention_inputs(torch::kFloat);
  for (bool causal : {false, true}) {
    for (int mask_kind = 0; mask_kind < 3; ++mask_kind) {
      const torch::Tensor mask = mask_kind == 0   ? torch::Tensor()
                                 : mask_kind == 1 ? in.add_mask
                                                  : in.keep_mask;
      torch::Tensor math, sdpa;
      {
        AttentionPathGuard guard(Attention::kMath);
        math = attention(in.q, in.k, in.v, mask, causal);
      }
      {
        AttentionPathGuard guard(Attention::kSdpa);
        sdpa = attention(in.q, in.k, in.v, mask, causal);
      }
      const double diff = max_abs_diff(math, sdpa);
      // Fused kernels sum in another order (online softmax): float32 rounding, no more.
      EXPECT_LT(diff, 2e-6) << "causal " << causal << " mask " << mask_kind;
      std::printf("  causal %d mask %d maxdiff=%.3g\n", causal, mask_kind, diff);
    }
  }
}

TEST(Attention, AutoTakesTheFusedKernelWhereItRunsOne) {
  const torch::Device cpu(torch::kCPU), cuda(torch::kCUDA);
  EXPECT_EQ(resolved_attention(Attention::kAuto, cpu, 0.0), Attention::kSdpa);
  EXPECT_EQ(resolved_attention(Attention::kAuto, cpu, 0.1), Attention::kMath);
  EXPECT_EQ(resolved_attention(Attention::kAuto, cuda, 0.1), Attention::kSdpa);
  EXPECT_EQ(resolved_attention(Attention::kSdpa, cpu, 0.1), Attention::kSdpa);
  EXPECT_EQ(resolved_attention(Attention::kMath, cpu, 0.0), Attention::kMath);
  // What autograd records says which kernel ran: the CPU's fused one without dropout, with or
  // without a mask; the written-out path's softmax and products under math.
  auto in = attention_inputs(torch::kFloat);
  in.q.requires_grad_(true);
  for (const torch::Tensor& mask : {torch::Tensor(), in.keep_mask}) {
    AttentionPathGuard guard(Attention::kAuto);
    const auto y = attention(in.q, in.k, in.v, mask, true);
    EXPECT_NE(std::string(y.grad_fn()->name()).find("FlashAttention"), std::string::npos)
        << y.grad_fn()->name();
  }
  AttentionPathGuard guard(Attention::kMath);
  const auto y = attention(in.q, in.k, in.v, torch::Tensor(), true);
  EXPECT_EQ(std::string(y.grad_fn()->name()).find("FlashAttention"), std::string::npos);
}

TEST(Attention, RepeatKvMatchesHuggingFaceOrder) {
  auto x = torch::arange(2 * 3 * 1 * 1).reshape({2, 3, 1, 1});  // (B, NKV, S, HS)
  auto y = repeat_kv(x, 2);                                     // (B, 6, S, HS)
  EXPECT_TRUE(torch::equal(y.flatten(), torch::tensor({0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5})));
}

// ---------------------------------------------------------------------------------------
// RMSNorm and rotary embeddings

TEST(RMSNorm, MatchesFormula) {
  RMSNorm norm(RMSNormOptions(6).eps(1e-5));
  auto gen = at::detail::createCPUGenerator(3);
  auto x = torch::randn({2, 3, 6}, gen, torch::TensorOptions());
  {
    torch::NoGradGuard no_grad;
    norm->weight.copy_(torch::arange(1, 7).to(torch::kFloat));
  }
  auto expected = x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-5) * torch::arange(1, 7);
  EXPECT_LT(max_abs_diff(norm(x), expected), 1e-5);
}

TEST(Rope, Llama3InverseFrequenciesMatchHandComputed) {
  // HS 64, theta 500000, Llama 3.2's scaling: factor 32, low 1, high 4, original 8192, so
  // wavelengths below 2048 are kept, above 8192 divided by 32, between interpolated.
  // Expected values: the closed form of Hugging Face's _compute_llama3_parameters in float64.
  auto inv = rope_inv_freq(
      RotaryOptions(64).theta(500000).llama3_scaling(Llama3RopeScaling{32.0, 1.0, 4.0, 8192}));
  ASSERT_EQ(inv.sizes(), torch::IntArrayRef({32}));
  ASSERT_EQ(inv.scalar_type(), torch::kFloat);
  const std::vector<std::pair<int64_t, double>> expected = {
      {0, 1.0},                      // wavelength 2 pi: kept
      {10, 0.016560440080994446},    // wavelength 379: kept
      {15, 0.001290547928209264},    // 2948: smooth factor 0.5928
      {16, 0.00042955679655936815},  // 4443: smooth factor 0.2813
      {17, 9.70828780262767e-05},    // 6695: smooth factor 0.0745
      {18, 1.9461638184831125e-05},  // 10089: 0.000622772 / 32
      {20, 8.570255489881478e-06},   // 22911: 0.000274248 / 32
      {31, 9.41830672543491e-08},    // 2084765: 3.01386e-06 / 32
  };
  for (const auto& [j, value] : expected) {
    EXPECT_NEAR(inv[j].item<double>() / value, 1.0, 2e-6) << "frequency " << j;
  }
  // Without scaling: theta^(-2j/HS).
  auto plain = rope_inv_freq(RotaryOptions(64).theta(500000));
  EXPECT_NEAR(plain[16].item<double>() / 0.001414213562373095, 1.0, 1e-6);
  EXPECT_NEAR(plain[31].item<double>() / 3.013858152139171e-06, 1.0, 2e-6);
}

TEST(Rope, ApplyRotaryRotatesHalfPairs) {
  // Position p rotates the pair (x_j, x_{j+HS/2}) by the angle p * inv_freq_j.
  const int64_t hs = 8, t = 5;
  RotaryOptions options(hs);
  options.theta(100.0);
  auto tables = rope_tables(options, t);
  ASSERT_EQ(tables.cos.sizes(), torch::IntArrayRef({t, hs}));
  auto inv = rope_inv_freq(options);
  auto gen = at::detail::createCPUGenerator(5);
  auto x = torch::randn({1, 1, t, hs}, gen, torch::TensorOptions());
  auto y = apply_rotary(x, tables.cos, tables.sin);
  for (int64_t p = 0; p < t; ++p) {
    for (int64_t j = 0; j < hs / 2; ++j) {
      const double angle = p * inv[j].item<double>();
      const double a = x[0][0][p][j].item<double>(), b = x[0][0][p][j + hs / 2].item<double>();
      EXPECT_NEAR(y[0][0][p][j].item<double>(), a * std::cos(angle) - b * std::sin(angle), 1e-5);
      EXPECT_NEAR(y[0][0][p][j + hs / 2].item<double>(), b * std::cos(angle) + a * std::sin(angle),
                  1e-5);
    }
  }
}

TEST(SelfAttention, WithoutRotaryAndWithBiasCloneGivesTheSameOutput) {
  // The ViT shape of the module: full multi-head attention, biases, no rotary tables.
  SelfAttention attn(SelfAttentionOptions(32, 4).bias(true));
  EXPECT_TRUE(attn->q_proj->bias.defined());
  EXPECT_EQ(attn->num_kv_heads(), 4);
  EXPECT_EQ(attn->head_size(), 8);
  auto gen = at::detail::createCPUGenerator(4);
  auto x = torch::randn({2, 5, 32}, gen, torch::TensorOptions());  // (B, T, C)
  auto copy = std::dynamic_pointer_cast<SelfAttentionImpl>(attn->clone());
  ASSERT_TRUE(copy);
  torch::NoGradGuard no_grad;
  auto y = attn(x);
  ASSERT_EQ(y.sizes(), x.sizes());
  EXPECT_TRUE(torch::equal(y, copy->forward(x)));
  // By hand: heads of q, k, v, attention, output projection.
  auto split = [](const torch::Tensor& t) { return t.view({2, 5, 4, 8}).transpose(1, 2); };
  auto ref = attention(split(attn->q_proj(x)), split(attn->k_proj(x)), split(attn->v_proj(x)));
  ref = attn->o_proj(ref.transpose(1, 2).reshape({2, 5, 32}));
  EXPECT_LT(max_abs_diff(y, ref), 1e-6);
}

// ---------------------------------------------------------------------------------------
// The model

TEST(Llama, SameSeedSameWeightsAndLogitsOtherSeedDiffers) {
  const auto arch = llama_preset("tiny");
  auto a = make_llama_model(arch, 42);
  auto b = make_llama_model(arch, 42);
  auto c = make_llama_model(arch, 43);
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  }
  EXPECT_FALSE(torch::equal(pa["embed_tokens.weight"], pc["embed_tokens.weight"]));
  EXPECT_FALSE(
      torch::equal(pa["layers.1.mlp.down_proj.weight"], pc["layers.1.mlp.down_proj.weight"]));
  // HF initialisation: std 0.02 weights, unit norms.
  EXPECT_NEAR(pa["layers.0.mlp.up_proj.weight"].std().item<double>(), 0.02, 0.001);
  EXPECT_TRUE(torch::equal(pa["norm.weight"], torch::ones({64})));

  auto ids = random_ids(2, 16, 320, 1);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(a->logits(ids), b->logits(ids)));
  EXPECT_FALSE(torch::equal(a->logits(ids), c->logits(ids)));
}

TEST(Llama, CausalFutureTokensDoNotChangeEarlierLogits) {
  auto model = make_llama_model(llama_preset("tiny"), 7);
  model->eval();
  torch::NoGradGuard no_grad;
  auto ids = random_ids(2, 16, 320, 2);
  auto changed = ids.clone();
  changed.index_put_({torch::indexing::Slice(), 10},
                     (ids.index({torch::indexing::Slice(), 10}) + 1) % 320);
  auto before = model->logits(ids);     // (B, T, V)
  auto after = model->logits(changed);  // (B, T, V)
  ASSERT_EQ(before.sizes(), torch::IntArrayRef({2, 16, 320}));
  using torch::indexing::Slice;
  EXPECT_LT(
      max_abs_diff(before.index({Slice(), Slice(0, 10)}), after.index({Slice(), Slice(0, 10)})),
      1e-6);
  EXPECT_GT(max_abs_diff(before.index({Slice(), Slice(10)}), after.index({Slice(), Slice(10)})),
            1e-4);
}

TEST(Llama, MathAndDefaultAttentionGiveTheSameLogits) {
  auto model = make_llama_model(llama_preset("tiny"), 8);
  torch::NoGradGuard no_grad;
  auto ids = random_ids(2, 32, 320, 3);
  torch::Tensor math, automatic;
  {
    AttentionPathGuard guard(Attention::kMath);
    math = model->logits(ids);
  }
  automatic = model->logits(ids);
  EXPECT_LT(max_abs_diff(math, automatic), 1e-5);
}

TEST(Llama, FreshTinyLossIsNearLogVocab) {
  auto model = make_llama_model(llama_preset("tiny"), 9);
  Batch batch;
  batch.input_ids = random_ids(4, 64, 320, 4);
  batch.targets = random_ids(4, 64, 320, 5);
  torch::NoGradGuard no_grad;
  LossOutput out = model->loss(batch);
  ASSERT_EQ(out.target_count, 4 * 64);
  const double mean = out.loss_sum.item<double>() / out.target_count;
  EXPECT_NEAR(mean, std::log(320.0), 0.1);
}

TEST(Llama, LossIsASumOverTargetsThatSkipsIgnored) {
  auto model = make_llama_model(llama_preset("tiny"), 10);
  Batch batch;
  batch.input_ids = random_ids(2, 8, 320, 6);
  batch.targets = random_ids(2, 8, 320, 7);
  batch.targets.index_put_({0, torch::indexing::Slice(0, 3)}, kIgnoreIndex);
  torch::NoGradGuard no_grad;
  LossOutput out = model->loss(batch);
  EXPECT_EQ(out.target_count, 16 - 3);
  auto logp = torch::log_softmax(model->logits(batch.input_ids), -1);  // (B, T, V)
  double expected = 0;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 8; ++t) {
      const int64_t y = batch.targets[b][t].item<int64_t>();
      if (y != kIgnoreIndex) expected -= logp[b][t][y].item<double>();
    }
  }
  EXPECT_NEAR(out.loss_sum.item<double>(), expected, 1e-4);
}

TEST(Llama, ForwardGoesThroughTheBlockRunner) {
  auto model = make_llama_model(llama_preset("tiny"), 11);
  EXPECT_EQ(model->blocks().size(), 2u);
  int calls = 0;
  model->set_block_runner(RunnerLayer::kRecompute, [&](Block& block, const torch::Tensor& x,
                                                        const BlockContext& ctx,
                                                        const BlockRunner& inner) {
    ++calls;
    EXPECT_TRUE(ctx.rope_cos.defined() && ctx.rope_sin.defined());
    EXPECT_EQ(ctx.rope_cos.sizes(), torch::IntArrayRef({12, 16}));  // (T, HS)
    return inner(block, x, ctx);
  });
  torch::NoGradGuard no_grad;
  model->logits(random_ids(1, 12, 320, 8));
  EXPECT_EQ(calls, 2);
}

TEST(Llama, GradientsReachEveryParameter) {
  auto model = make_llama_model(llama_preset("tiny"), 12);
  model->train();
  Batch batch;
  batch.input_ids = random_ids(2, 16, 320, 9);
  batch.targets = random_ids(2, 16, 320, 10);
  model->loss(batch).loss_sum.backward();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_GT(item.value().grad().abs().max().item<double>(), 0.0) << item.key();
  }
}

TEST(Llama, TinyOverfitsOneBatch) {
  auto model = make_llama_model(llama_preset("tiny"), 13);
  model->train();
  Batch batch;
  auto seq = random_ids(4, 33, 256, 11);
  using torch::indexing::Slice;
  batch.input_ids = seq.index({Slice(), Slice(0, 32)}).contiguous();
  batch.targets = seq.index({Slice(), Slice(1, 33)}).contiguous();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    opt.zero_grad();
    LossOutput out = model->loss(batch);
    auto mean = out.loss_sum / static_cast<double>(out.target_count);
    mean.backward();
    opt.step();
    if (step == 0) first = mean.item<double>();
    last = mean.item<double>();
  }
  std::printf("  loss %.4f -> %.4f in 40 Adam steps\n", first, last);
  EXPECT_NEAR(first, std::log(320.0), 0.2);
  EXPECT_LT(last, 0.25 * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace gradscope
