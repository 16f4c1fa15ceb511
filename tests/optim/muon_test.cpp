// Muon against its update (muon.h) re-stated here in float64 on named parameters shaped like
// a 2-layer attention + MLP model (Muon on the blocks' matrices, AdamW on the rest); the
// Newton-Schulz iteration's singular values; the bfloat16 iteration against float64; the
// state's size; refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/models/registry.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/galore.h"
#include "gradscope/optim/muon.h"
#include "gradscope/optim/state_bytes.h"
#include "gradscope/optim/state_key.h"
#include "test_util.h"

namespace gradscope {
namespace muon_test {
namespace {

struct Named {
  std::string name;
  std::vector<int64_t> shape;
  bool muon;  // whether the test expects Muon (else AdamW)
};

// C = 8, attention projections of 8 and 4 rows, MLP width 12 (fc1 tall, fc2 wide), vocab 10.
std::vector<Named> two_layer_model() {
  std::vector<Named> out = {{"embed_tokens.weight", {10, 8}, false}};
  for (const std::string l : {"layers.0.", "layers.1."}) {
    out.push_back({l + "input_layernorm.weight", {8}, false});
    out.push_back({l + "self_attn.q_proj.weight", {8, 8}, true});
    out.push_back({l + "self_attn.q_proj.bias", {8}, false});
    out.push_back({l + "self_attn.k_proj.weight", {4, 8}, true});
    out.push_back({l + "self_attn.v_proj.weight", {4, 8}, true});
    out.push_back({l + "self_attn.o_proj.weight", {8, 8}, true});
    out.push_back({l + "post_attention_layernorm.weight", {8}, false});
    out.push_back({l + "mlp.fc1.weight", {12, 8}, true});
    out.push_back({l + "mlp.fc1.bias", {12}, false});
    out.push_back({l + "mlp.fc2.weight", {8, 12}, true});
  }
  out.push_back({"norm.weight", {8}, false});
  out.push_back({"lm_head.weight", {10, 8}, false});
  return out;
}

std::vector<std::string> names_of(const std::vector<Named>& model) {
  std::vector<std::string> out;
  for (const auto& p : model) out.push_back(p.name);
  return out;
}

// The quintic Newton-Schulz iteration, written out for a float64 matrix.
torch::Tensor reference_ns5(const torch::Tensor& g, int steps) {
  const bool tall = g.size(0) > g.size(1);
  torch::Tensor x = tall ? g.t().clone() : g.clone();
  x = x / (x.pow(2).sum().sqrt() + 1e-7);
  for (int i = 0; i < steps; ++i) {
    const auto a = torch::matmul(x, x.t());
    x = 3.4445 * x + torch::matmul(-4.7750 * a + 2.0315 * torch::matmul(a, a), x);
  }
  return tall ? x.t() : x;
}

struct Hyper {
  double lr = 0.02, mu = 0.95, wd = 0.1, adamw_lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-10;
  bool nesterov = true;
  bool moonlight = false;
};

// One parameter's reference state and step.
struct ReferenceMuon {
  bool muon;
  torch::Tensor x, momentum, m, v;  // float64
  int64_t t = 0;

  void step(const torch::Tensor& g, const Hyper& h) {
    ++t;
    if (muon) {
      momentum = h.mu * momentum + (1 - h.mu) * g;
      const auto u = h.nesterov ? (1 - h.mu) * g + h.mu * momentum : momentum;
      const double rows = static_cast<double>(g.size(0)), cols = static_cast<double>(g.size(1));
      const double scale = h.moonlight ? 0.2 * std::sqrt(std::max(rows, cols))
                                       : std::sqrt(std::max(1.0, rows / cols));
      x = x * (1 - h.lr * h.wd) - h.lr * scale * reference_ns5(u, 5);
      return;
    }
    m = h.b1 * m + (1 - h.b1) * g;
    v = h.b2 * v + (1 - h.b2) * g * g;
    const double bc1 = 1 - std::pow(h.b1, t), bc2 = 1 - std::pow(h.b2, t);
    x = x * (1 - h.adamw_lr * h.wd) - h.adamw_lr * (m / bc1) / ((v / bc2).sqrt() + h.eps);
  }
};

// Runs `steps` steps of the registry's muon with `opt` and of the reference on the two-layer
// model, and returns the worst difference of a parameter from the reference, relative to how
// far the reference moved it, over all steps.
double worst_relative_difference(const Hyper& h, const OptSettings& opt, int steps) {
  const auto model = two_layer_model();
  torch::manual_seed(21);
  std::vector<torch::Tensor> params;
  std::vector<ReferenceMuon> reference;
  std::vector<torch::Tensor> start;
  for (const auto& p : model) {
    params.push_back(torch::randn(p.shape, torch::kFloat64).requires_grad_(true));
    const auto x = params.back().detach().clone();
    start.push_back(x);
    reference.push_back(
        {p.muon, x, torch::zeros_like(x), torch::zeros_like(x), torch::zeros_like(x)});
  }
  auto optimizer = make_optimizer("muon", params, names_of(model), h.lr, h.wd, opt);
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    for (size_t k = 0; k < params.size(); ++k) {
      const auto g = torch::randn(model[k].shape, torch::kFloat64);
      params[k].mutable_grad() = g.clone();
      reference[k].step(g, h);
    }
    optimizer->step();
    for (size_t k = 0; k < params.size(); ++k) {
      const double off = (reference[k].x - params[k].detach()).norm().item<double>();
      const double moved = (reference[k].x - start[k]).norm().item<double>();
      worst = std::max(worst, off / moved);
    }
  }
  return worst;
}

OptSettings exact_settings() {
  return {{"ns_dtype", "float32"}, {"adamw_lr", "0.003"}, {"adamw_betas", "0.9,0.95"}};
}

// Four steps in float64 (ns_dtype float32 runs float64 parameters in float64) equal the
// reference's, Muon's and AdamW's parameters alike.
TEST(MuonOptim, FourStepsMatchTheUpdateOnATwoLayerModel) {
  const double worst = worst_relative_difference(Hyper{}, exact_settings(), 4);
  EXPECT_LT(worst, 1e-10);
  std::cout << "Muon (float64 Newton-Schulz) against the re-statement: worst relative "
               "difference "
            << worst << "\n";
}

TEST(MuonOptim, PlainMomentumAndMoonlightScaleMatchTheUpdate) {
  Hyper h;
  h.nesterov = false;
  h.moonlight = true;
  h.lr = 1e-3;
  h.adamw_lr = 1e-3;  // Moonlight's default: AdamW at Muon's rate
  auto opt = exact_settings();
  opt.erase("adamw_lr");
  opt["nesterov"] = "false";
  opt["update_scale"] = "moonlight";
  EXPECT_LT(worst_relative_difference(h, opt, 3), 1e-10);
}

// The reference's bfloat16 iteration (the default) stays close to the float64 one: after four
// steps every parameter is within 15% of the distance the float64 re-statement moved it
// (measured: 9%, on these small matrices whose smallest singular values NS5 stretches most).
TEST(MuonOptim, BFloat16NewtonSchulzStaysCloseToFloat64) {
  auto opt = exact_settings();
  opt.erase("ns_dtype");
  const double worst = worst_relative_difference(Hyper{}, opt, 4);
  EXPECT_LT(worst, 0.15);
  EXPECT_GT(worst, 1e-6);  // it did run in bfloat16
  std::cout << "Muon (bfloat16 Newton-Schulz) against the float64 re-statement: worst relative "
               "difference "
            << worst << "\n";
}

// NS5 of a random matrix: every singular value in the quintic's band around 1, and the result
// close to U V^T of the matrix's SVD, in float64 and in bfloat16; wide and tall alike.
TEST(MuonNewtonSchulz, SingularValuesNearOne) {
  torch::manual_seed(4);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{32, 64}, {64, 32}, {12, 8}}) {
    const auto g = torch::randn(shape, torch::kFloat64);
    const auto svd = torch::linalg_svd(g, /*full_matrices=*/false);
    const auto polar = torch::matmul(std::get<0>(svd), std::get<2>(svd));  // U V^T
    for (const auto dtype : {torch::kFloat64, torch::kBFloat16}) {
      const auto o = newton_schulz5(g, 5, dtype).to(torch::kFloat64);
      ASSERT_EQ(o.sizes(), g.sizes());
      const auto s = torch::linalg_svdvals(o);
      const double lo = s.min().item<double>(), hi = s.max().item<double>();
      const double off = ((o - polar).norm() / polar.norm()).item<double>();
      EXPECT_GT(lo, 0.6) << shape[0] << "x" << shape[1] << " " << dtype;
      EXPECT_LT(hi, 1.25) << shape[0] << "x" << shape[1] << " " << dtype;
      EXPECT_LT(off, 0.3) << shape[0] << "x" << shape[1] << " " << dtype;
      std::cout << "NS5 " << shape[0] << "x" << shape[1] << " " << dtype << ": singular values ["
                << lo << ", " << hi << "], ||O - UV^T|| / ||UV^T|| = " << off << "\n";
    }
    // The float64 iteration agrees with the test's own, and bfloat16 stays near it.
    const auto exact = newton_schulz5(g, 5, torch::kFloat64);
    EXPECT_TRUE(torch::allclose(exact, reference_ns5(g, 5), 1e-10, 1e-12));
    const double bf16_off =
        ((newton_schulz5(g, 5, torch::kBFloat16).to(torch::kFloat64) - exact).norm() / exact.norm())
            .item<double>();
    EXPECT_LT(bf16_off, 0.1) << shape[0] << "x" << shape[1];
    std::cout << "NS5 " << shape[0] << "x" << shape[1] << ": bfloat16 off float64 by " << bf16_off
              << " (relative)\n";
  }
}

// Muon lowers a least-squares loss on a hidden matrix (its update moves W by lr in spectral
// norm): from W = 0 to within a tenth of the starting loss in 200 steps at lr 0.02.
TEST(MuonOptim, LowersALeastSquaresLoss) {
  torch::manual_seed(8);
  const auto x = torch::randn({128, 16});
  const auto w_star = torch::randn({16, 24}) * 0.3;
  const auto y = x.mm(w_star);
  auto w = torch::zeros({16, 24}).requires_grad_(true);
  auto optimizer = make_optimizer("muon", {w}, {"layers.0.mlp.fc1.weight"}, 0.02, 0, {});
  auto loss_fn = [&] { return (x.mm(w) - y).pow(2).mean(); };
  const double before = loss_fn().item<double>();
  for (int i = 0; i < 200; ++i) {
    optimizer->zero_grad();
    loss_fn().backward();
    optimizer->step();
  }
  EXPECT_LT(loss_fn().item<double>(), 0.1 * before);
}

// ------------------------------------------------------------------------- state bytes

const MuonParamState& muon_state(const torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  return static_cast<const MuonParamState&>(*optimizer.state().at(param_state_key(p)));
}

// A momentum per Muon matrix (1x), AdamW's two moments (2x) per other parameter.
TEST(MuonStateBytes, MomentumPerMatrixAndTwiceForAdamW) {
  const auto model = two_layer_model();
  std::vector<torch::Tensor> params;
  for (const auto& p : model) params.push_back(torch::randn(p.shape).requires_grad_(true));
  auto optimizer = make_optimizer("muon", params, names_of(model), 0.02, 0, {});
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 0);
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
  optimizer->step();
  int64_t want = 0;
  for (size_t k = 0; k < model.size(); ++k) {
    want += (model[k].muon ? 1 : 2) * 4 * params[k].numel();
    EXPECT_EQ(muon_state(*optimizer, params[k]).momentum_buffer().defined(), model[k].muon)
        << model[k].name;
  }
  EXPECT_EQ(optimizer_state_bytes(*optimizer), want);
}

// The registry's muon on the tiny Llama (untied) and ViT: Muon exactly on the blocks' 2-D
// attention and MLP weights, AdamW on embeddings, head, classifier, norms and biases.
TEST(MuonStateBytes, RegistryOnTinyModels) {
  for (const std::string family : {"llama", "vit"}) {
    const auto& entry = model_registry().get(family);
    auto arch = entry.preset("tiny");
    if (family == "llama") arch.update(nlohmann::json{{"tie_word_embeddings", false}});
    if (entry.finalize != nullptr) entry.finalize(arch);
    auto model = entry.build(arch, 0);
    const auto named = model->named_parameters();
    for (auto& p : named.values()) p.mutable_grad() = torch::randn_like(p);
    auto optimizer = make_optimizer("muon", named.values(), named.keys(), 0.02, 0, {});
    optimizer->step();
    int64_t want = 0, matrices = 0;
    for (const auto& item : named) {
      const bool muon =
          item.value().dim() == 2 && galore_projects(item.key(), galore_default_targets());
      want += (muon ? 1 : 2) * 4 * item.value().numel();
      matrices += muon;
      EXPECT_EQ(muon_state(*optimizer, item.value()).momentum_buffer().defined(), muon)
          << family << " " << item.key();
    }
    for (const std::string outside : {"lm_head.weight", "embed_tokens.weight", "classifier.weight",
                                      "encoder.patch_embeddings.projection.weight"}) {
      if (named.find(outside) == nullptr) continue;
      EXPECT_FALSE(muon_state(*optimizer, named[outside]).momentum_buffer().defined()) << outside;
    }
    EXPECT_EQ(matrices, family == "llama" ? 2 * 7 : 2 * 6) << family;
    EXPECT_EQ(optimizer_state_bytes(*optimizer), want) << family;
    std::cout << "Muon on tiny " << family << ": " << matrices << " matrices, state "
              << optimizer_state_bytes(*optimizer) << " B for " << tensors_bytes(named.values())
              << " B of parameters\n";
  }
}

// ---------------------------------------------------------------------------- settings

std::string usage_refusal(const OptSettings& opt) {
  const Error e = testing::expect_usage_error([&] {
    make_optimizer("muon", {torch::ones({3, 2}, torch::requires_grad())},
                   {"layers.0.mlp.fc1.weight"}, 0.02, 0, opt);
  });
  return std::string(e.what()) + " | " + e.hint();
}

TEST(MuonSettings, RefusesBadValuesNamingThem) {
  const std::vector<std::pair<OptSettings, std::string>> cases = {
      {{{"momentum", "1"}}, "momentum=1"},
      {{{"momentum", "-0.1"}}, "momentum=-0.1"},
      {{{"ns_steps", "0"}}, "ns_steps=0"},
      {{{"ns_steps", "2.5"}}, "ns_steps=2.5"},
      {{{"nesterov", "maybe"}}, "nesterov=maybe"},
      {{{"update_scale", "mup"}}, "'mup'"},
      {{{"ns_dtype", "float16"}}, "'float16'"},
      {{{"adamw_lr", "0"}}, "adamw_lr=0"},
      {{{"adamw_betas", "0.9,1"}}, "adamw_betas=0.9,1"},
      {{{"adamw_eps", "-1"}}, "adamw_eps=-1"},
      {{{"betas", "0.9,0.95"}}, "momentum, nesterov, ns_steps"},
  };
  for (const auto& [opt, named] : cases) {
    const auto msg = usage_refusal(opt);
    EXPECT_TRUE(testing::contains(msg, named)) << "'" << msg << "' does not name '" << named << "'";
  }
}

TEST(MuonSettings, ConstructorRefusesBadValuesNamingThem) {
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const c10::Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a c10::Error";
    return "";
  };
  EXPECT_TRUE(testing::contains(
      message([] { Muon(std::vector<torch::Tensor>{torch::ones({4}, torch::requires_grad())}); }),
      "at least 2 dimensions"));
  const auto m = [] {
    return std::vector<torch::Tensor>{torch::ones({2, 2}, torch::requires_grad())};
  };
  EXPECT_TRUE(testing::contains(message([&] { Muon(m(), MuonOptions().momentum(1.5)); }),
                                "momentum value: 1.5"));
  EXPECT_TRUE(testing::contains(message([&] { Muon(m(), MuonOptions().ns_steps(0)); }),
                                "ns_steps value: 0"));
  EXPECT_TRUE(testing::contains(message([&] { Muon(m(), MuonOptions().update_scale("x")); }),
                                "update_scale: 'x'"));
}

TEST(MuonSettings, RefusesParametersWithoutNames) {
  try {
    make_optimizer("muon", {torch::ones({3, 2}, torch::requires_grad())}, 0.02, 0, {});
    ADD_FAILURE() << "expected a gradscope::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_TRUE(testing::contains(e.what(), "names")) << e.what();
  }
}

// Settings reach both groups; a schedule's rate moves adamw_lr by the same factor.
TEST(MuonSettings, SettingsReachTheOptimizer) {
  auto optimizer = make_optimizer(
      "muon",
      {torch::ones({3, 2}, torch::requires_grad()), torch::ones({3}, torch::requires_grad())},
      {"layers.0.mlp.fc1.weight", "layers.0.mlp.fc1.bias"}, 0.04, 0.1,
      {{"momentum", "0.9"},
       {"nesterov", "false"},
       {"ns_steps", "6"},
       {"adamw_lr", "1e-3"},
       {"adamw_betas", "0.8,0.99"},
       {"adamw_eps", "1e-8"},
       {"ns_dtype", "float32"}});
  ASSERT_EQ(optimizer->param_groups().size(), 2u);
  const auto& muon = static_cast<const MuonOptions&>(optimizer->param_groups()[0].options());
  const auto& adamw = static_cast<const MuonOptions&>(optimizer->param_groups()[1].options());
  EXPECT_TRUE(muon.use_muon());
  EXPECT_FALSE(adamw.use_muon());
  EXPECT_DOUBLE_EQ(muon.lr(), 0.04);
  EXPECT_DOUBLE_EQ(muon.momentum(), 0.9);
  EXPECT_FALSE(muon.nesterov());
  EXPECT_EQ(muon.ns_steps(), 6);
  EXPECT_EQ(muon.ns_dtype(), "float32");
  EXPECT_EQ(muon.update_scale(), "reference");
  EXPECT_DOUBLE_EQ(adamw.adamw_lr(), 1e-3);
  EXPECT_DOUBLE_EQ(std::get<0>(adamw.adamw_betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(adamw.adamw_betas()), 0.99);
  EXPECT_DOUBLE_EQ(adamw.adamw_eps(), 1e-8);
  EXPECT_DOUBLE_EQ(adamw.weight_decay(), 0.1);
  set_learning_rate(*optimizer, 0.02);
  EXPECT_DOUBLE_EQ(muon.lr(), 0.02);
  EXPECT_DOUBLE_EQ(adamw.adamw_lr(), 5e-4);

  auto defaults = make_optimizer("muon", {torch::ones({3, 2}, torch::requires_grad())},
                                 {"layers.0.mlp.fc1.weight"}, 0.02, 0, {});
  const auto& d = static_cast<const MuonOptions&>(defaults->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(d.momentum(), 0.95);
  EXPECT_TRUE(d.nesterov());
  EXPECT_EQ(d.ns_steps(), 5);
  EXPECT_DOUBLE_EQ(d.adamw_lr(), 3e-4);
  EXPECT_DOUBLE_EQ(std::get<1>(d.adamw_betas()), 0.95);
  EXPECT_DOUBLE_EQ(d.adamw_eps(), 1e-10);
  EXPECT_DOUBLE_EQ(optimizer_registry().get("muon").default_lr, 0.02);
}

}  // namespace
}  // namespace muon_test
}  // namespace gradscope
