// GaLore against its formula (galore.h), computed here from an SVD of the test's own: the
// projection side, the Adam moments in the projected shape, the projector refresh, AdamW on
// vectors, the state's size, the refusal of bad settings, descent and a save/load round trip;
// which parameters of each model the registry's galore projects, by name.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <map>
#include <sstream>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/models/registry.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/galore.h"
#include "gradscope/optim/state_bytes.h"
#include "gradscope/optim/state_key.h"
#include "test_util.h"

namespace gradscope {
namespace {

const GaloreParamState& state_of(const torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  return static_cast<const GaloreParamState&>(*optimizer.state().at(param_state_key(p)));
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// The first r singular vectors of g, from the test's own SVD, on the side GaLore's published
// projector takes: the right ones when m >= n (`shape[0] >= shape[1]`), else the left ones.
torch::Tensor reference_projector(const torch::Tensor& g, int64_t r) {
  const auto svd = torch::linalg_svd(g, /*full_matrices=*/false);
  const auto& u = std::get<0>(svd);   // (m, k)
  const auto& vh = std::get<2>(svd);  // (k, n)
  if (g.size(0) < g.size(1))
    return u.index({torch::indexing::Slice(), torch::indexing::Slice(0, r)});
  return vh.index({torch::indexing::Slice(0, r)}).t();
}

struct Hyper {
  double lr = 0.05, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.1, scale = 0.25;
  int64_t rank = 2;
};

GaloreOptions options_of(const Hyper& h) {
  return GaloreOptions(h.lr)
      .betas(std::make_tuple(h.beta1, h.beta2))
      .eps(h.eps)
      .weight_decay(h.wd)
      .scale(h.scale)
      .rank(h.rank);
}

// Two steps on a float64 (m, n) matrix with fixed gradients (the projector from step 1's
// gradient serves step 2, the gap being 200), against the formula step by step.
void check_two_steps(int64_t m, int64_t n) {
  const Hyper h;
  torch::manual_seed(11);
  const auto w0 = torch::randn({m, n}, torch::kFloat64);
  // A gradient with a clear low-rank part, so the top singular vectors are well separated.
  const auto g1 = torch::randn({m, 3}, torch::kFloat64)
                      .mm(torch::randn({3, n}, torch::kFloat64))
                      .add_(torch::randn({m, n}, torch::kFloat64), 0.1);
  const auto g2 = torch::randn({m, n}, torch::kFloat64);

  auto w = w0.clone().requires_grad_(true);
  Galore optimizer(std::vector<torch::Tensor>{w}, options_of(h));
  std::vector<torch::Tensor> got;
  for (const auto& g : {g1, g2}) {
    w.mutable_grad() = g.clone();
    optimizer.step();
    got.push_back(w.detach().clone());
  }

  const bool left = m < n;  // the published rule: a square matrix goes to the right
  const auto p = reference_projector(g1, h.rank);  // (m, r) if left, else (n, r)
  ASSERT_EQ(p.size(0), left ? m : n);
  auto x = w0.clone();
  auto mom = torch::zeros(left ? std::vector<int64_t>{h.rank, n} : std::vector<int64_t>{m, h.rank},
                          torch::kFloat64);
  auto vel = mom.clone();
  int t = 0;
  for (const auto& g : {g1, g2}) {
    ++t;
    const auto r = left ? p.t().mm(g) : g.mm(p);
    mom = h.beta1 * mom + (1 - h.beta1) * r;
    vel = h.beta2 * vel + (1 - h.beta2) * r * r;
    const auto m_hat = mom / (1 - std::pow(h.beta1, t));
    const auto v_hat = vel / (1 - std::pow(h.beta2, t));
    const auto n_upd = m_hat / (v_hat.sqrt() + h.eps);
    x = x * (1 - h.lr * h.wd) - h.lr * h.scale * (left ? p.mm(n_upd) : n_upd.mm(p.t()));
    const double diff = max_abs_diff(got[t - 1], x);
    EXPECT_LT(diff, 1e-12) << "(" << m << ", " << n << ") step " << t;
    std::cout << "GaLore (" << m << ", " << n << ") step " << t << " OK maxdiff=" << diff << "\n";
  }
  // The step moved W by more than the tolerance, so the comparison means something.
  EXPECT_GT(max_abs_diff(got[1], w0), 1e-3);
  const auto& state = state_of(optimizer, w);
  EXPECT_EQ(state.exp_avg().sizes(), mom.sizes());
  EXPECT_EQ(state.projector().sizes(), p.sizes());
}

TEST(GaloreOptim, TwoStepsMatchTheFormulaWide) { check_two_steps(6, 10); }

TEST(GaloreOptim, TwoStepsMatchTheFormulaTall) { check_two_steps(10, 6); }

// A square matrix (a model's q_proj and o_proj) is projected on the right, as the published
// projector does, and as APOLLO does (apollo_test.cpp).
TEST(GaloreOptim, TwoStepsMatchTheFormulaSquare) { check_two_steps(8, 8); }

// With update_gap T = 3 the projector changes at steps 1, 4, 7, 10 and nowhere else, is then
// the top-r subspace of that step's gradient, and the moments carry over a refresh.
TEST(GaloreOptim, ProjectorRefreshesEveryUpdateGapSteps) {
  for (const auto& shape : {std::vector<int64_t>{5, 9}, std::vector<int64_t>{9, 5}}) {
    torch::manual_seed(5);
    auto w = torch::randn(shape, torch::kFloat64).requires_grad_(true);
    const double beta1 = 0.9;
    Galore optimizer(std::vector<torch::Tensor>{w},
                     GaloreOptions(0.01).rank(2).update_gap(3).betas(std::make_tuple(beta1, 0.99)));
    torch::Tensor previous;
    for (int t = 1; t <= 10; ++t) {
      const auto g = torch::randn(shape, torch::kFloat64);
      const auto moment_before = t > 1 ? state_of(optimizer, w).exp_avg().clone() : torch::Tensor();
      w.mutable_grad() = g.clone();
      optimizer.step();
      const auto& state = state_of(optimizer, w);
      const auto p = state.projector().clone();
      const bool refresh = (t - 1) % 3 == 0;
      if (t > 1) {
        EXPECT_EQ(!torch::equal(p, previous), refresh)
            << "shape " << c10::IntArrayRef(shape) << " step " << t;
      }
      if (refresh) {
        // Column signs of singular vectors are arbitrary: compare the subspaces, P P^T.
        const auto want = reference_projector(g, 2);
        EXPECT_LT(max_abs_diff(p.mm(p.t()), want.mm(want.t())), 1e-12) << "step " << t;
      }
      if (t > 1) {  // M = beta1 M + (1 - beta1) R, never reset
        const auto r = shape[0] <= shape[1] ? p.t().mm(g) : g.mm(p);
        EXPECT_LT(max_abs_diff(state.exp_avg(), beta1 * moment_before + (1 - beta1) * r), 1e-12)
            << "step " << t;
      }
      previous = p;
    }
  }
}

// Vectors and higher-dim tensors get exactly torch::optim::AdamW.
TEST(GaloreOptim, NonMatricesGetAdamW) {
  torch::manual_seed(9);
  const std::vector<torch::Tensor> init = {torch::randn({7}), torch::randn({2, 3, 4})};
  auto clone = [&] {
    std::vector<torch::Tensor> out;
    for (const auto& p : init) out.push_back(p.clone().requires_grad_(true));
    return out;
  };
  auto a = clone();
  auto b = clone();
  Galore galore(a, GaloreOptions(0.01).weight_decay(0.05).betas(std::make_tuple(0.8, 0.95)));
  torch::optim::AdamW adamw(
      b, torch::optim::AdamWOptions(0.01).weight_decay(0.05).betas(std::make_tuple(0.8, 0.95)));
  for (int i = 0; i < 20; ++i) {
    for (size_t k = 0; k < a.size(); ++k) {
      const auto g = torch::randn_like(init[k]);
      a[k].mutable_grad() = g.clone();
      b[k].mutable_grad() = g.clone();
    }
    galore.step();
    adamw.step();
  }
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::allclose(a[k], b[k], 1e-6, 1e-8))
        << "parameter " << k << " maxdiff " << max_abs_diff(a[k], b[k]);
    EXPECT_GT(max_abs_diff(a[k], init[k]), 1e-2);  // they moved
    EXPECT_FALSE(state_of(galore, a[k]).projector().defined());
  }
}

// P (m r) + M and V (2 r n) per (m, n) matrix with m < n, 2x per vector.
TEST(GaloreStateBytes, ProjectorAndMomentsOfTheProjectedShape) {
  torch::manual_seed(1);
  const int64_t m = 64, n = 256, r = 16;
  for (const bool tall : {false, true}) {
    auto w = (tall ? torch::randn({n, m}) : torch::randn({m, n})).requires_grad_(true);
    Galore optimizer(std::vector<torch::Tensor>{w}, GaloreOptions().rank(r));
    EXPECT_EQ(optimizer_state_bytes(optimizer), 0);  // lazy
    w.mutable_grad() = torch::randn_like(w);
    optimizer.step();
    const int64_t bytes = optimizer_state_bytes(optimizer);
    EXPECT_EQ(bytes, 4 * (m * r + 2 * r * n)) << (tall ? "tall" : "wide");

    auto w_adam = w.detach().clone().requires_grad_(true);
    torch::optim::AdamW adam(std::vector<torch::Tensor>{w_adam});
    w_adam.mutable_grad() = torch::randn_like(w_adam);
    adam.step();
    const int64_t adam_bytes = optimizer_state_bytes(adam);
    EXPECT_EQ(adam_bytes, 4 * 2 * m * n);
    const double ratio = static_cast<double>(bytes) / adam_bytes;
    EXPECT_DOUBLE_EQ(ratio, static_cast<double>(r) / m + static_cast<double>(r) / (2 * n));
    std::cout << "GaLore state " << bytes << " B vs AdamW " << adam_bytes << " B (ratio " << ratio
              << ")\n";
  }
}

TEST(GaloreStateBytes, DefaultRankIsAQuarterOfTheShorterSide) {
  torch::manual_seed(2);
  std::vector<torch::Tensor> params = {
      torch::randn({128, 512}).requires_grad_(true), torch::randn({96, 40}).requires_grad_(true),
      torch::randn({3, 8}).requires_grad_(true), torch::randn({33}).requires_grad_(true)};
  Galore optimizer(params);
  for (const auto& p : params) p.mutable_grad() = torch::randn_like(p);
  optimizer.step();
  EXPECT_EQ(state_of(optimizer, params[0]).projector().sizes(), (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(state_of(optimizer, params[0]).exp_avg().sizes(), (std::vector<int64_t>{32, 512}));
  EXPECT_EQ(state_of(optimizer, params[1]).projector().sizes(), (std::vector<int64_t>{40, 10}));
  EXPECT_EQ(state_of(optimizer, params[1]).exp_avg().sizes(), (std::vector<int64_t>{96, 10}));
  // min(3, 8) / 4 = 0, raised to 1.
  EXPECT_EQ(state_of(optimizer, params[2]).projector().sizes(), (std::vector<int64_t>{3, 1}));
  const int64_t want =
      4 * ((128 * 32 + 2 * 32 * 512) + (40 * 10 + 2 * 96 * 10) + (3 * 1 + 2 * 1 * 8) + 2 * 33);
  EXPECT_EQ(optimizer_state_bytes(optimizer), want);
}

std::string constructor_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "expected a c10::Error";
  return "";
}

TEST(GaloreOptim, RefusesARankLargerThanAMatrixNamingIt) {
  auto params = [] {
    return std::vector<torch::Tensor>{torch::zeros({64, 256}, torch::requires_grad()),
                                      torch::zeros({300}, torch::requires_grad())};
  };
  const auto msg = constructor_error([&] { Galore(params(), GaloreOptions().rank(65)); });
  EXPECT_TRUE(testing::contains(msg, "65")) << msg;
  EXPECT_TRUE(testing::contains(msg, "(64, 256)")) << msg;
  // The largest valid rank, and a vector longer than the rank, are fine.
  Galore(params(), GaloreOptions().rank(64));
  EXPECT_TRUE(testing::contains(
      constructor_error([&] { Galore(params(), GaloreOptions().rank(0)); }), "rank value: 0"));
  EXPECT_TRUE(testing::contains(
      constructor_error([&] { Galore(params(), GaloreOptions().rank(-3)); }), "-3"));
}

TEST(GaloreOptim, RefusesBadHyperparametersNamingThem) {
  auto p = [] { return std::vector<torch::Tensor>{torch::zeros({4, 6}, torch::requires_grad())}; };
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] { Galore(p(), GaloreOptions(-0.5)); }, "-0.5"},
      {[&] { Galore(p(), GaloreOptions().betas(std::make_tuple(1.0, 0.999))); }, "index 0: 1"},
      {[&] { Galore(p(), GaloreOptions().betas(std::make_tuple(0.9, -0.25))); }, "-0.25"},
      {[&] { Galore(p(), GaloreOptions().eps(-1e-3)); }, "epsilon value: -0.001"},
      {[&] { Galore(p(), GaloreOptions().weight_decay(-0.75)); }, "-0.75"},
      {[&] { Galore(p(), GaloreOptions().update_gap(0)); }, "update_gap value: 0"},
      {[&] { Galore(p(), GaloreOptions().scale(0)); }, "scale value: 0"},
      {[&] { Galore(p(), GaloreOptions().scale(-2)); }, "scale value: -2"},
  };
  for (const auto& [make, named] : cases) {
    const auto msg = constructor_error(make);
    EXPECT_TRUE(testing::contains(msg, named)) << "'" << msg << "' does not name '" << named << "'";
  }
}

// Fits W (32, 64) to X W = Y with Y from a rank-4 W*, from zero, at the default rank 8: the
// loss falls by more than 6x in 400 steps.
TEST(GaloreOptim, LowersALowRankLeastSquaresLoss) {
  torch::manual_seed(4);
  const auto x = torch::randn({256, 32});                                   // (N, 32)
  const auto w_star = torch::randn({32, 4}).mm(torch::randn({4, 64})) / 2;  // (32, 64), rank 4
  const auto y = x.mm(w_star);                                              // (N, 64)
  auto w = torch::zeros({32, 64}).requires_grad_(true);
  Galore optimizer(std::vector<torch::Tensor>{w}, GaloreOptions(5e-2).update_gap(50));
  auto loss_fn = [&] { return (x.mm(w) - y).pow(2).mean(); };
  const double before = loss_fn().item<double>();
  for (int i = 0; i < 400; ++i) {
    optimizer.zero_grad();
    loss_fn().backward();
    optimizer.step();
  }
  const double after = loss_fn().item<double>();
  std::cout << "GaLore low-rank least squares: " << before << " -> " << after << "\n";
  EXPECT_LT(after, 0.15 * before);
}

// Saves after three steps, loads into a fresh optimizer over copies of the parameters, then
// steps both twice (the second crossing a projector refresh) with the same gradients: equal
// bit for bit, and different from an optimizer that lost its state.
TEST(GaloreOptim, SerializationRoundTripContinuesExactly) {
  torch::manual_seed(8);
  std::vector<torch::Tensor> a = {torch::randn({6, 10}).requires_grad_(true),
                                  torch::randn({9, 4}).requires_grad_(true),
                                  torch::randn({5}).requires_grad_(true)};
  const auto options = GaloreOptions(0.01).rank(2).update_gap(4).weight_decay(0.01);
  std::vector<std::vector<torch::Tensor>> grads(5);
  for (auto& g : grads)
    for (const auto& p : a) g.push_back(torch::randn_like(p));
  auto step = [&](torch::optim::Optimizer& optimizer, std::vector<torch::Tensor>& params, int i) {
    for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = grads[i][k].clone();
    optimizer.step();
  };
  Galore original(a, options);
  for (int i = 0; i < 3; ++i) step(original, a, i);

  std::stringstream buffer;
  torch::save(original, buffer);
  auto copy = [&] {
    std::vector<torch::Tensor> out;
    for (const auto& p : a) out.push_back(p.detach().clone().requires_grad_(true));
    return out;
  };
  auto b = copy();
  auto c = copy();
  // LibTorch's load restores the state, not the options: construct with the same ones.
  Galore loaded(b, options);
  torch::load(loaded, buffer);
  Galore forgetful(c, options);
  EXPECT_EQ(optimizer_state_bytes(loaded), optimizer_state_bytes(original));
  EXPECT_TRUE(
      torch::equal(state_of(loaded, b[0]).projector(), state_of(original, a[0]).projector()));
  EXPECT_EQ(state_of(loaded, b[1]).step(), 3);

  for (int i = 3; i < 5; ++i) {
    step(original, a, i);
    step(loaded, b, i);
    step(forgetful, c, i);
  }
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::equal(a[k], b[k])) << "parameter " << k << " after loading";
    EXPECT_FALSE(torch::equal(a[k], c[k])) << "parameter " << k << ": losing the state changed "
                                           << "nothing, so the test proves nothing";
  }
}

// ----------------------------------------------------------------- the registry's galore

std::vector<torch::Tensor> registry_params() {
  return {torch::zeros({8, 12}, torch::requires_grad()), torch::zeros({5}, torch::requires_grad())};
}
// An MLP matrix of a block and its bias: the matrix is projected.
const std::vector<std::string> kRegistryNames = {"layers.0.mlp.up_proj.weight",
                                                 "layers.0.mlp.up_proj.bias"};

std::string usage_refusal(const OptSettings& opt) {
  const Error e = testing::expect_usage_error(
      [&] { make_optimizer("galore", registry_params(), kRegistryNames, 1e-3, 0, opt); });
  return std::string(e.what()) + " | " + e.hint();
}

TEST(GaloreSettings, RegistryRefusesBadValuesNamingThem) {
  const std::vector<std::pair<OptSettings, std::string>> cases = {
      {{{"rank", "0"}}, "rank=0"},
      {{{"rank", "1.5"}}, "rank=1.5"},
      {{{"rank", "-2"}}, "rank=-2"},
      {{{"rank", "9"}}, "9"},  // larger than min(8, 12): the constructor's refusal
      {{{"update_gap", "0"}}, "update_gap=0"},
      {{{"update_gap", "2.5"}}, "update_gap=2.5"},
      {{{"scale", "0"}}, "scale=0"},
      {{{"betas", "0.9,1"}}, "betas=0.9,1"},
      {{{"eps", "-1"}}, "eps=-1"},
      {{{"momentum", "0.9"}}, "rank, update_gap, scale, betas, eps, targets"},
      {{{"targets", "q_proj,"}}, "targets=q_proj,"},
      {{{"targets", "mlp.fc1"}}, "targets=mlp.fc1"},
      {{{"targets", "lm_head"}}, "targets=lm_head name no matrix"},
  };
  for (const auto& [opt, named] : cases) {
    const auto msg = usage_refusal(opt);
    EXPECT_TRUE(testing::contains(msg, named)) << "'" << msg << "' does not name '" << named << "'";
  }
  EXPECT_TRUE(testing::contains(usage_refusal({{"rank", "9"}}), "(8, 12)"));
}

TEST(GaloreSettings, SettingsReachTheOptimizer) {
  auto optimizer = make_optimizer("galore", registry_params(), kRegistryNames, 2e-3, 0.05,
                                  {{"rank", "3"},
                                   {"update_gap", "50"},
                                   {"scale", "0.5"},
                                   {"betas", "0.8,0.95"},
                                   {"eps", "1e-6"}});
  const auto& o = static_cast<const GaloreOptions&>(optimizer->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.lr(), 2e-3);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.05);
  EXPECT_EQ(o.rank(), c10::optional<int64_t>(3));
  EXPECT_EQ(o.update_gap(), 50);
  EXPECT_DOUBLE_EQ(o.scale(), 0.5);
  EXPECT_DOUBLE_EQ(std::get<0>(o.betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.95);
  EXPECT_DOUBLE_EQ(o.eps(), 1e-6);
  EXPECT_TRUE(o.project());

  auto defaults = make_optimizer("galore", registry_params(), kRegistryNames, 1e-3, 0, {});
  const auto& d = static_cast<const GaloreOptions&>(defaults->param_groups()[0].options());
  EXPECT_FALSE(d.rank().has_value());
  EXPECT_EQ(d.update_gap(), 200);
  EXPECT_DOUBLE_EQ(d.scale(), 0.25);
  EXPECT_DOUBLE_EQ(optimizer_registry().get("galore").default_lr, 1e-2);
}

// ----------------------------------------------- which parameters galore projects, by name

// A preset of a model family, built as a session builds it, with `overrides` applied.
std::shared_ptr<Model> build_model(const std::string& family_name, const std::string& preset,
                                   const nlohmann::json& overrides = nlohmann::json::object()) {
  const auto& family = model_registry().get(family_name);
  auto arch = family.preset(preset);
  arch.update(overrides);
  if (family.finalize != nullptr) family.finalize(arch);
  return family.build(arch, 0);
}

// Whether `name` lies inside a block ("layers.<i>." somewhere in it).
bool in_block(const std::string& name) {
  for (size_t at = name.find("layers."); at != std::string::npos;
       at = name.find("layers.", at + 1)) {
    if ((at == 0 || name[at - 1] == '.') && at + 7 < name.size() && std::isdigit(name[at + 7]))
      return true;
  }
  return false;
}

// Every model's own names: the blocks' attention and MLP matrices are projected, and the
// embeddings, the LM head, the classifier, ModernBERT's head and NanoVLM's modality projector
// are not. Each name is checked to exist, so a renamed module fails here rather than silently
// dropping out of the rule.
TEST(GaloreTargets, EachModelsBlockMatricesAndNothingElse) {
  const std::map<std::string, std::vector<std::pair<std::string, bool>>> cases = {
      {"llama",
       {{"embed_tokens.weight", false},
        {"layers.0.self_attn.q_proj.weight", true},
        {"layers.1.self_attn.k_proj.weight", true},
        {"layers.0.self_attn.v_proj.weight", true},
        {"layers.0.self_attn.o_proj.weight", true},
        {"layers.0.mlp.gate_proj.weight", true},
        {"layers.0.mlp.up_proj.weight", true},
        {"layers.1.mlp.down_proj.weight", true},
        {"layers.0.input_layernorm.weight", false},
        {"lm_head.weight", false}}},
      {"vit",
       {{"encoder.patch_embeddings.projection.weight", false},
        {"encoder.layers.0.attention.q_proj.weight", true},
        {"encoder.layers.0.attention.o_proj.weight", true},
        {"encoder.layers.0.mlp.fc1.weight", true},
        {"encoder.layers.0.mlp.fc2.weight", true},
        {"encoder.layers.0.mlp.fc1.bias", false},
        {"classifier.weight", false}}},
      {"modernbert",
       {{"tok_embeddings.weight", false},
        {"layers.0.attn.q_proj.weight", true},
        {"layers.0.mlp.Wi.weight", true},
        {"layers.0.mlp.Wo.weight", true},
        {"head_dense.weight", false}}},
      {"nanovlm",
       {{"vision.layers.0.attention.v_proj.weight", true},
        {"vision.layers.0.mlp.fc2.weight", true},
        {"projector.weight", false},
        {"decoder.embed_tokens.weight", false},
        {"decoder.layers.0.self_attn.q_proj.weight", true},
        {"decoder.layers.0.mlp.down_proj.weight", true}}},
  };
  for (const auto& [family, names] : cases) {
    // The tiny Llama ties its head to the embeddings; untied, it has lm_head.
    const auto model =
        build_model(family, "tiny",
                    family == "llama" ? nlohmann::json{{"tie_word_embeddings", false}}
                                      : nlohmann::json::object());
    const auto params = model->named_parameters();
    for (const auto& [name, projected] : names) {
      EXPECT_NE(params.find(name), nullptr) << family << " has no parameter " << name;
      EXPECT_EQ(galore_projects(name, galore_default_targets()), projected)
          << family << " " << name;
    }
    // Inside a block every matrix is attention or MLP (the rest are norms); outside none is.
    int64_t projected = 0;
    for (const auto& item : params) {
      if (item.value().dim() != 2) continue;
      const bool target = galore_projects(item.key(), galore_default_targets());
      EXPECT_EQ(target, in_block(item.key())) << family << " " << item.key();
      projected += target;
    }
    EXPECT_GT(projected, 0) << family;
  }
}

// The registry's galore on the tiny Llama (untied, so it has a head) and the tiny ViT (10
// classes): after one step the embeddings, the head, the classifier and every other parameter
// outside the blocks' attention and MLP hold AdamW's state (no projector, moments of the
// parameter's shape); the attention and MLP matrices hold P and moments of rank r. The state
// bytes are the sum of exactly that.
TEST(GaloreTargets, RegistryProjectsOnlyTheBlocksMatrices) {
  struct Case {
    std::string family;
    nlohmann::json overrides;
    std::vector<std::string> outside;  // parameters that must get AdamW's state
  };
  for (const auto& [family, overrides, outside] : std::vector<Case>{
           {"llama", {{"tie_word_embeddings", false}}, {"embed_tokens.weight", "lm_head.weight"}},
           {"llama", nlohmann::json::object(), {"embed_tokens.weight"}},  // tied head
           {"vit",
            nlohmann::json::object(),
            {"classifier.weight", "encoder.position_embeddings"}}}) {
    auto model = build_model(family, "tiny", overrides);
    const auto named = model->named_parameters();
    torch::manual_seed(3);
    for (auto& p : named.values()) p.mutable_grad() = torch::randn_like(p);
    auto optimizer = make_optimizer("galore", named.values(), named.keys(), 1e-3, 0, {});
    optimizer->step();

    int64_t want_bytes = 0, projected = 0;
    for (const auto& item : named) {
      const auto& p = item.value();
      const auto& state = state_of(*optimizer, p);
      const bool target = p.dim() == 2 && galore_projects(item.key(), galore_default_targets());
      if (target) {
        const int64_t m = p.size(0), n = p.size(1), r = std::max<int64_t>(1, std::min(m, n) / 4);
        EXPECT_TRUE(state.projector().defined()) << family << " " << item.key();
        EXPECT_EQ(state.exp_avg().numel(), r * std::max(m, n)) << family << " " << item.key();
        want_bytes += 4 * (std::min(m, n) * r + 2 * r * std::max(m, n));
        ++projected;
      } else {
        EXPECT_FALSE(state.projector().defined()) << family << " " << item.key();
        EXPECT_EQ(state.exp_avg().sizes(), p.sizes()) << family << " " << item.key();
        want_bytes += 4 * 2 * p.numel();
      }
    }
    for (const auto& name : outside) {
      ASSERT_NE(named.find(name), nullptr) << family << " " << name;
      EXPECT_FALSE(state_of(*optimizer, named[name]).projector().defined())
          << family << " " << name << " was projected";
      EXPECT_EQ(state_of(*optimizer, named[name]).exp_avg().sizes(), named[name].sizes())
          << family << " " << name;
    }
    EXPECT_EQ(projected, family == "llama" ? 2 * 7 : 2 * 6) << family;
    const int64_t bytes = optimizer_state_bytes(*optimizer);
    EXPECT_EQ(bytes, want_bytes) << family;
    std::cout << "GaLore on tiny " << family << " " << overrides.dump() << ": " << projected
              << " matrices projected, state " << bytes << " B for "
              << tensors_bytes(named.values()) << " B of parameters\n";
  }
}

// targets=mlp projects the MLP matrices of the blocks and not their attention.
TEST(GaloreTargets, TargetsSettingChoosesTheModules) {
  auto model = build_model("llama", "tiny");
  const auto named = model->named_parameters();
  for (auto& p : named.values()) p.mutable_grad() = torch::randn_like(p);
  auto optimizer =
      make_optimizer("galore", named.values(), named.keys(), 1e-3, 0, {{"targets", "mlp"}});
  optimizer->step();
  EXPECT_TRUE(state_of(*optimizer, named["layers.0.mlp.up_proj.weight"]).projector().defined());
  EXPECT_FALSE(
      state_of(*optimizer, named["layers.0.self_attn.q_proj.weight"]).projector().defined());
  EXPECT_FALSE(state_of(*optimizer, named["embed_tokens.weight"]).projector().defined());
}

// Without names galore cannot tell a block's matrix from an embedding: refused, not guessed.
TEST(GaloreTargets, RefusesParametersWithoutNames) {
  try {
    make_optimizer("galore", registry_params(), 1e-3, 0, {});
    ADD_FAILURE() << "expected a gradscope::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_TRUE(testing::contains(e.what(), "names")) << e.what();
  }
}

}  // namespace
}  // namespace gradscope
