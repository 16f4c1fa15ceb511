// Adam-mini against its update (adam_mini.h) re-stated here element by element in float64 on
// named parameters shaped like a 2-layer attention + MLP model; the blocks each model's
// parameters fall into; a convex quadratic; the state's size; refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/models/common/layers.h"
#include "gradscope/models/registry.h"
#include "gradscope/optim/adam_mini.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_bytes.h"
#include "gradscope/optim/state_key.h"
#include "test_util.h"

namespace gradscope {
namespace adam_mini_test {
namespace {

// How the test expects a parameter to be cut, written out by hand per name.
enum class Cut { kHead, kRow, kElement, kWhole };

struct Named {
  std::string name;
  std::vector<int64_t> shape;
  Cut cut;
  bool decayed;
  int64_t head_size = 0;  // what the session hands in for q/k/v weights and biases
};

// C = 8, 2 query heads and 1 key/value head of 4 rows, MLP width 12, vocabulary 10.
std::vector<Named> two_layer_model() {
  std::vector<Named> out = {{"embed_tokens.weight", {10, 8}, Cut::kRow, true}};
  for (const std::string l : {"layers.0.", "layers.1."}) {
    out.push_back({l + "input_layernorm.weight", {8}, Cut::kWhole, false});
    out.push_back({l + "self_attn.q_proj.weight", {8, 8}, Cut::kHead, true, 4});
    out.push_back({l + "self_attn.q_proj.bias", {8}, Cut::kElement, false, 4});
    out.push_back({l + "self_attn.k_proj.weight", {4, 8}, Cut::kHead, true, 4});
    out.push_back({l + "self_attn.v_proj.weight", {4, 8}, Cut::kRow, true, 4});
    out.push_back({l + "self_attn.o_proj.weight", {8, 8}, Cut::kRow, true});
    out.push_back({l + "post_attention_layernorm.weight", {8}, Cut::kWhole, false});
    out.push_back({l + "mlp.fc1.weight", {12, 8}, Cut::kRow, true});
    out.push_back({l + "mlp.fc1.bias", {12}, Cut::kElement, false});
    out.push_back({l + "mlp.fc2.weight", {8, 12}, Cut::kRow, true});
  }
  out.push_back({"norm.weight", {8}, Cut::kWhole, false});
  out.push_back({"lm_head.weight", {10, 8}, Cut::kRow, true});
  return out;
}

// The block of flat element i of a row-major tensor of `shape` under `cut`.
int64_t block_of(const Named& p, int64_t i) {
  int64_t cols = 1;
  for (size_t d = 1; d < p.shape.size(); ++d) cols *= p.shape[d];
  switch (p.cut) {
    case Cut::kHead:
      return i / (p.head_size * cols);
    case Cut::kRow:
      return i / cols;
    case Cut::kElement:
      return i;
    case Cut::kWhole:
      return 0;
  }
  return 0;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  return n;
}

// Adam-mini for one parameter, plain float64 loops over its elements.
struct ReferenceAdamMini {
  const Named* p;
  std::vector<double> x, m, v;  // v: one per block
  int64_t t = 0;

  void step(const std::vector<double>& g, double lr, double b1, double b2, double eps, double wd) {
    ++t;
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<double> sum(v.size(), 0.0);
    std::vector<int64_t> count(v.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
      sum[block_of(*p, i)] += g[i] * g[i];
      ++count[block_of(*p, i)];
    }
    for (size_t b = 0; b < v.size(); ++b) v[b] = b2 * v[b] + (1 - b2) * sum[b] / count[b];
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (int64_t i = 0; i < n; ++i) {
      if (p->decayed) x[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      const double denom = std::sqrt(v[block_of(*p, i)] / bc2) + eps;
      x[i] -= lr * (m[i] / bc1) / denom;
    }
  }
};

std::vector<double> values_of(const torch::Tensor& t) {
  const auto flat = t.detach().contiguous().view(-1);
  return std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
}

ParamInfo info_of(const std::vector<Named>& model) {
  ParamInfo info;
  for (const auto& p : model) {
    info.names.push_back(p.name);
    info.head_sizes.push_back(p.head_size);
  }
  return info;
}

const AdamMiniParamState& mini_state(const torch::optim::Optimizer& optimizer,
                                     const torch::Tensor& p) {
  return static_cast<const AdamMiniParamState&>(*optimizer.state().at(param_state_key(p)));
}

// Five steps of the registry's adam-mini (betas 0.9,0.95, weight decay 0.1) against the loops
// above, every parameter after every step.
TEST(AdamMiniOptim, FiveStepsMatchTheUpdateOnATwoLayerModel) {
  const auto model = two_layer_model();
  const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  torch::manual_seed(5);
  std::vector<torch::Tensor> params;
  std::vector<ReferenceAdamMini> reference;
  for (const auto& p : model) {
    params.push_back(torch::randn(p.shape, torch::kFloat64).requires_grad_(true));
    int64_t blocks = 0;
    for (int64_t i = 0; i < numel_of(p.shape); ++i) blocks = std::max(blocks, block_of(p, i) + 1);
    reference.push_back({&p, values_of(params.back()), std::vector<double>(numel_of(p.shape), 0.0),
                         std::vector<double>(blocks, 0.0)});
  }
  auto optimizer =
      make_optimizer("adam-mini", params, info_of(model), lr, wd, {{"betas", "0.9,0.95"}});
  double worst = 0;
  for (int step = 0; step < 5; ++step) {
    for (size_t k = 0; k < params.size(); ++k) {
      // Gradients of very different scales per row, so one v per block differs from Adam's.
      auto g = torch::randn(model[k].shape, torch::kFloat64);
      if (g.dim() == 2) g.mul_(torch::linspace(0.1, 3, g.size(0), torch::kFloat64).unsqueeze(1));
      params[k].mutable_grad() = g;
      reference[k].step(values_of(g), lr, b1, b2, eps, wd);
    }
    optimizer->step();
    for (size_t k = 0; k < params.size(); ++k) {
      const auto want = torch::tensor(reference[k].x, torch::kFloat64).view(model[k].shape);
      const double diff = (params[k].detach() - want).abs().max().item<double>();
      worst = std::max(worst, diff);
      EXPECT_LT(diff, 1e-12) << model[k].name << " after step " << step + 1;
    }
  }
  for (size_t k = 0; k < params.size(); ++k)
    EXPECT_EQ(mini_state(*optimizer, params[k]).exp_avg_sq().numel(),
              static_cast<int64_t>(reference[k].v.size()))
        << model[k].name;
  std::cout << "Adam-mini against the float64 loops: worst difference " << worst << "\n";
}

// With one block per element Adam-mini is AdamW: torch::optim::AdamW's trajectory.
TEST(AdamMiniOptim, ElementPartitionIsAdamW) {
  torch::manual_seed(2);
  auto a = torch::randn({3, 5}, torch::kFloat64).requires_grad_(true);
  auto b = a.detach().clone().requires_grad_(true);
  AdamMini mini(std::vector<torch::Tensor>{a},
                AdamMiniOptions(0.05).weight_decay(0.1).partition("element"));
  torch::optim::AdamW adamw(std::vector<torch::Tensor>{b},
                            torch::optim::AdamWOptions(0.05).weight_decay(0.1));
  for (int i = 0; i < 10; ++i) {
    const auto g = torch::randn({3, 5}, torch::kFloat64);
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    mini.step();
    adamw.step();
  }
  EXPECT_TRUE(torch::allclose(a, b, 1e-12, 1e-14));
}

// A convex quadratic, 0.5 sum_i c_i (x_i - x*_i)^2 with curvatures c in [1, 10], over a query
// weight (two heads), an MLP matrix and a norm: with the rate decayed linearly to 0 over 1500
// steps the parameters end near x*.
TEST(AdamMiniOptim, ReachesTheMinimumOfAConvexQuadratic) {
  torch::manual_seed(9);
  const std::vector<Named> model = {
      {"layers.0.self_attn.q_proj.weight", {8, 6}, Cut::kHead, true, 4},
      {"layers.0.mlp.fc1.weight", {5, 6}, Cut::kRow, true},
      {"layers.0.input_layernorm.weight", {6}, Cut::kWhole, false}};
  std::vector<torch::Tensor> params, targets, curvature;
  for (const auto& p : model) {
    params.push_back(torch::zeros(p.shape, torch::kFloat64).requires_grad_(true));
    targets.push_back(torch::randn(p.shape, torch::kFloat64));
    curvature.push_back(torch::rand(p.shape, torch::kFloat64).mul_(9).add_(1));
  }
  auto optimizer = make_optimizer("adam-mini", params, info_of(model), 0.05, 0, {});
  auto distance = [&] {
    double d = 0;
    for (size_t k = 0; k < params.size(); ++k)
      d = std::max(d, (params[k].detach() - targets[k]).abs().max().item<double>());
    return d;
  };
  const double start = distance();
  const int steps = 1500;
  for (int t = 0; t < steps; ++t) {
    set_learning_rate(*optimizer, 0.05 * (1.0 - static_cast<double>(t) / steps));
    for (size_t k = 0; k < params.size(); ++k)
      params[k].mutable_grad() = curvature[k] * (params[k].detach() - targets[k]);
    optimizer->step();
  }
  EXPECT_LT(distance(), 1e-3) << "from " << start;
  std::cout << "Adam-mini on the quadratic: largest distance from the minimum " << start << " -> "
            << distance() << "\n";
}

// ------------------------------------------------------------------------- state bytes

// m for every element plus one value per block, in the parameter's dtype.
TEST(AdamMiniStateBytes, OneFirstMomentPerElementAndOneSecondPerBlock) {
  const auto model = two_layer_model();
  std::vector<torch::Tensor> params;
  for (const auto& p : model) params.push_back(torch::randn(p.shape).requires_grad_(true));
  auto optimizer = make_optimizer("adam-mini", params, info_of(model), 1e-3, 0, {});
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 0);
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
  optimizer->step();
  int64_t want = 0, adamw = 0;
  for (const auto& p : model) {
    int64_t blocks = 0;
    for (int64_t i = 0; i < numel_of(p.shape); ++i) blocks = std::max(blocks, block_of(p, i) + 1);
    want += 4 * (numel_of(p.shape) + blocks);
    adamw += 4 * 2 * numel_of(p.shape);
  }
  EXPECT_EQ(optimizer_state_bytes(*optimizer), want);
  EXPECT_LT(optimizer_state_bytes(*optimizer), 0.6 * adamw);
}

// A preset of a model family, as a session builds it.
std::shared_ptr<Model> tiny_model(const std::string& family_name,
                                  const nlohmann::json& overrides = nlohmann::json::object()) {
  const auto& family = model_registry().get(family_name);
  auto arch = family.preset("tiny");
  arch.update(overrides);
  if (family.finalize != nullptr) family.finalize(arch);
  return family.build(arch, 0);
}

// What each name of gradscope's models becomes: the blocks of the parameter's v.
int64_t expected_blocks(const std::string& name, const torch::Tensor& p, int64_t head_size) {
  const bool is_bias = name.find("bias") != std::string::npos;
  if (is_bias) return p.numel();
  for (const char* qk : {"q_proj.weight", "k_proj.weight"})
    if (name.size() > std::strlen(qk) &&
        name.compare(name.size() - std::strlen(qk), std::strlen(qk), qk) == 0)
      return p.size(0) / head_size;
  std::vector<int64_t> sizes(p.sizes().begin(), p.sizes().end());
  while (!sizes.empty() && sizes.front() == 1) sizes.erase(sizes.begin());
  return sizes.size() >= 2 ? sizes[0] : 1;
}

// Each model's parameters through the registry with the session's head sizes: the blocks of
// every v, named ones checked by hand, and the state bytes the sum of m and v.
TEST(AdamMiniPartition, EachModelsParametersGetTheirBlocks) {
  struct Case {
    std::string family;
    nlohmann::json overrides;
    std::map<std::string, std::string> named;  // name -> "head", "row", "element" or "whole"
  };
  const std::vector<Case> cases = {
      {"llama",
       {{"tie_word_embeddings", false}},
       {{"embed_tokens.weight", "row"},
        {"layers.0.self_attn.q_proj.weight", "head"},
        {"layers.1.self_attn.k_proj.weight", "head"},
        {"layers.0.self_attn.v_proj.weight", "row"},
        {"layers.0.self_attn.o_proj.weight", "row"},
        {"layers.0.mlp.gate_proj.weight", "row"},
        {"layers.0.mlp.down_proj.weight", "row"},
        {"layers.0.input_layernorm.weight", "whole"},
        {"norm.weight", "whole"},
        {"lm_head.weight", "row"}}},
      {"vit",
       nlohmann::json::object(),
       {{"encoder.patch_embeddings.projection.weight", "row"},
        {"encoder.patch_embeddings.projection.bias", "element"},
        {"encoder.position_embeddings", "row"},
        {"encoder.layers.0.attention.q_proj.weight", "head"},
        {"encoder.layers.0.attention.q_proj.bias", "element"},
        {"encoder.layers.0.mlp.fc1.weight", "row"},
        {"encoder.layers.0.layernorm_before.weight", "whole"},
        {"classifier.weight", "row"},
        {"classifier.bias", "element"}}},
      {"modernbert",
       nlohmann::json::object(),
       {{"tok_embeddings.weight", "row"},
        {"embedding_norm.weight", "whole"},
        {"layers.0.attn.k_proj.weight", "head"},
        {"layers.0.mlp.Wi.weight", "row"},
        {"layers.0.mlp_norm.weight", "whole"},
        {"head_dense.weight", "row"},
        {"decoder_bias", "element"}}},
      {"nanovlm",
       nlohmann::json::object(),
       {{"vision.layers.0.attention.q_proj.weight", "head"},
        {"projector.weight", "row"},
        {"decoder.embed_tokens.weight", "row"},
        {"decoder.layers.0.self_attn.k_proj.weight", "head"},
        {"decoder.layers.0.mlp.up_proj.weight", "row"}}},
  };
  for (const auto& c : cases) {
    auto model = tiny_model(c.family, c.overrides);
    const auto named = model->named_parameters();
    const auto heads = attention_head_sizes(*model);
    ParamInfo info;
    info.names = named.keys();
    for (const auto& name : info.names) {
      auto it = heads.find(name);
      info.head_sizes.push_back(it == heads.end() ? 0 : it->second);
    }
    torch::manual_seed(3);
    for (auto& p : named.values()) p.mutable_grad() = torch::randn_like(p);
    auto optimizer = make_optimizer("adam-mini", named.values(), info, 1e-3, 0.1, {});
    optimizer->step();
    int64_t want_bytes = 0;
    for (size_t i = 0; i < info.names.size(); ++i) {
      const auto& name = info.names[i];
      const auto& p = named[name];
      const int64_t blocks = mini_state(*optimizer, p).exp_avg_sq().numel();
      EXPECT_EQ(blocks, expected_blocks(name, p, info.head_sizes[i])) << c.family << " " << name;
      want_bytes += 4 * (p.numel() + blocks);
      // The reference's "ln" (GPT-2's ln_1, ln_f) matches none of gradscope's names: decay is
      // off exactly for norms and biases.
      const bool norm_or_bias =
          name.find("norm") != std::string::npos || name.find("bias") != std::string::npos;
      EXPECT_EQ(adam_mini_role(name).weight_decay, !norm_or_bias) << c.family << " " << name;
    }
    for (const auto& [name, cut] : c.named) {
      ASSERT_NE(named.find(name), nullptr) << c.family << " has no parameter " << name;
      const auto& p = named[name];
      const int64_t blocks = mini_state(*optimizer, p).exp_avg_sq().numel();
      if (cut == "element") EXPECT_EQ(blocks, p.numel()) << c.family << " " << name;
      if (cut == "whole") EXPECT_EQ(blocks, 1) << c.family << " " << name;
      if (cut == "row") {
        EXPECT_GT(blocks, 1) << c.family << " " << name;
        EXPECT_LT(blocks, p.numel()) << c.family << " " << name;
      }
      if (cut == "head") {
        const auto it = heads.find(name);
        ASSERT_NE(it, heads.end()) << c.family << " " << name;
        EXPECT_EQ(blocks * it->second, p.size(0)) << c.family << " " << name;
      }
    }
    const int64_t bytes = optimizer_state_bytes(*optimizer);
    EXPECT_EQ(bytes, want_bytes) << c.family;
    std::cout << "Adam-mini on tiny " << c.family << ": state " << bytes << " B for "
              << tensors_bytes(named.values()) << " B of parameters\n";
  }
}

// Weight decay, as the reference: not on names with "norm", "ln" or "bias".
TEST(AdamMiniPartition, RolesOfNames) {
  EXPECT_EQ(adam_mini_role("layers.0.self_attn.q_proj.weight").partition, "head");
  EXPECT_EQ(adam_mini_role("layers.0.attention.k_proj.weight").partition, "head");
  EXPECT_EQ(adam_mini_role("layers.0.self_attn.q_proj.bias").partition, "element");
  EXPECT_EQ(adam_mini_role("layers.0.self_attn.q_proj.lora.A").partition, "row");
  EXPECT_EQ(adam_mini_role("layers.0.mlp.Wo.weight").partition, "row");
  EXPECT_TRUE(adam_mini_role("embed_tokens.weight").weight_decay);
  EXPECT_TRUE(adam_mini_role("lm_head.weight").weight_decay);
  EXPECT_FALSE(adam_mini_role("layers.0.input_layernorm.weight").weight_decay);
  EXPECT_FALSE(adam_mini_role("layers.0.mlp.fc1.bias").weight_decay);
  EXPECT_FALSE(adam_mini_role("h.0.ln_1.weight").weight_decay);
}

// ---------------------------------------------------------------------------- refusals

std::string usage_refusal(const OptSettings& opt) {
  const std::vector<Named> model = {{"layers.0.mlp.fc1.weight", {3, 2}, Cut::kRow, true}};
  const Error e = testing::expect_usage_error([&] {
    make_optimizer("adam-mini", {torch::ones({3, 2}, torch::requires_grad())}, info_of(model), 1e-3,
                   0, opt);
  });
  return std::string(e.what()) + " | " + e.hint();
}

TEST(AdamMiniSettings, RefusesBadValuesNamingThem) {
  EXPECT_TRUE(testing::contains(usage_refusal({{"betas", "1,0.999"}}), "betas=1,0.999"));
  EXPECT_TRUE(testing::contains(usage_refusal({{"betas", "0.9,-0.5"}}), "betas=0.9,-0.5"));
  EXPECT_TRUE(testing::contains(usage_refusal({{"eps", "-1e-8"}}), "eps=-1e-08"));
  EXPECT_TRUE(testing::contains(usage_refusal({{"eps", "tiny"}}), "eps=tiny"));
  EXPECT_TRUE(testing::contains(usage_refusal({{"dim", "2048"}}), "betas, eps"));
}

std::string runtime_refusal(const std::vector<Named>& model, bool with_head_sizes) {
  std::vector<torch::Tensor> params;
  for (const auto& p : model) params.push_back(torch::zeros(p.shape, torch::requires_grad()));
  ParamInfo info = info_of(model);
  if (!with_head_sizes) info.head_sizes.clear();
  try {
    make_optimizer("adam-mini", params, info, 1e-3, 0, {});
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    return e.what();
  }
  ADD_FAILURE() << "expected a gradscope::Error";
  return "";
}

// Without names or head sizes the blocks cannot be told: refused, not guessed.
TEST(AdamMiniSettings, RefusesParametersWithoutNamesOrHeadSizes) {
  try {
    make_optimizer("adam-mini", {torch::ones({3}, torch::requires_grad())}, 1e-3, 0, {});
    ADD_FAILURE() << "expected a gradscope::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_TRUE(testing::contains(e.what(), "names")) << e.what();
  }
  const std::vector<Named> query = {
      {"layers.0.self_attn.q_proj.weight", {8, 4}, Cut::kHead, true, 4}};
  EXPECT_TRUE(testing::contains(runtime_refusal(query, false), "q_proj.weight"));
  const std::vector<Named> uneven = {
      {"layers.0.self_attn.k_proj.weight", {6, 4}, Cut::kHead, true, 4}};
  EXPECT_TRUE(testing::contains(runtime_refusal(uneven, true), "head size 4"));
}

TEST(AdamMiniSettings, ConstructorRefusesBadValuesNamingThem) {
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const c10::Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a c10::Error";
    return "";
  };
  const auto p = [] {
    return std::vector<torch::Tensor>{torch::ones({6, 4}, torch::requires_grad())};
  };
  EXPECT_TRUE(testing::contains(
      message([&] { AdamMini(p(), AdamMiniOptions().partition("rows")); }), "'rows'"));
  EXPECT_TRUE(testing::contains(
      message([&] { AdamMini(p(), AdamMiniOptions().partition("head").head_size(0)); }),
      "head_size value: 0"));
  EXPECT_TRUE(testing::contains(
      message([&] { AdamMini(p(), AdamMiniOptions().partition("head").head_size(4)); }),
      "head_size value: 4"));
  EXPECT_TRUE(testing::contains(
      message([&] { AdamMini(p(), AdamMiniOptions().betas(std::make_tuple(0.9, 1.0))); }),
      "index 1: 1"));
}

TEST(AdamMiniSettings, SettingsReachTheOptimizer) {
  const std::vector<Named> model = {{"layers.0.mlp.fc1.weight", {3, 2}, Cut::kRow, true},
                                    {"layers.0.mlp.fc1.bias", {3}, Cut::kElement, false}};
  auto optimizer = make_optimizer(
      "adam-mini",
      {torch::ones({3, 2}, torch::requires_grad()), torch::ones({3}, torch::requires_grad())},
      info_of(model), 2e-3, 0.05, {{"betas", "0.8,0.95"}, {"eps", "1e-6"}});
  ASSERT_EQ(optimizer->param_groups().size(), 2u);
  const auto& rows = static_cast<const AdamMiniOptions&>(optimizer->param_groups()[0].options());
  const auto& bias = static_cast<const AdamMiniOptions&>(optimizer->param_groups()[1].options());
  EXPECT_EQ(rows.partition(), "row");
  EXPECT_EQ(bias.partition(), "element");
  EXPECT_DOUBLE_EQ(rows.lr(), 2e-3);
  EXPECT_DOUBLE_EQ(std::get<0>(rows.betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(rows.betas()), 0.95);
  EXPECT_DOUBLE_EQ(rows.eps(), 1e-6);
  EXPECT_DOUBLE_EQ(rows.weight_decay(), 0.05);
  EXPECT_DOUBLE_EQ(bias.weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(optimizer_registry().get("adam-mini").default_lr, 1e-3);
}

}  // namespace
}  // namespace adam_mini_test
}  // namespace gradscope
