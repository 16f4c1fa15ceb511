// APOLLO and APOLLO-Mini against a float64 re-statement of their update (apollo.h) written here,
// on named parameters through the registry, over a projection refresh; the projection's
// determinism; with the identity for P, the channel norms of AdamW's update; a convex quadratic
// brought near its minimum; the state's bytes against the formula; a save/load round trip;
// refusal of bad settings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <tuple>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/models/registry.h"
#include "gradscope/optim/apollo.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/galore.h"
#include "gradscope/optim/state_bytes.h"
#include "gradscope/optim/state_key.h"
#include "test_util.h"

namespace gradscope {
namespace {

const ApolloParamState& apollo_state_of(const torch::optim::Optimizer& optimizer,
                                        const torch::Tensor& p) {
  return static_cast<const ApolloParamState&>(*optimizer.state().at(param_state_key(p)));
}

double apollo_max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// The parameter's position among all groups' parameters: what P is seeded with.
int64_t apollo_index_of(const torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& q : group.params()) {
      if (q.is_same(p)) return index;
      ++index;
    }
  }
  ADD_FAILURE() << "parameter not in the optimizer";
  return -1;
}

// The sum of squares of x, element by element (the re-statement's norms).
double apollo_sum_sq(const torch::Tensor& x) {
  const auto flat = x.contiguous().view({-1});
  double s = 0;
  for (int64_t i = 0; i < flat.numel(); ++i) s += flat[i].item<double>() * flat[i].item<double>();
  return s;
}

// One parameter of the re-statement: its value and its Adam-like state.
struct ApolloRef {
  std::string name;
  torch::Tensor w, m, v;
  double u = -1;  // the limiter's last norm; < 0 before the first step
  bool projected = false;
};

struct ApolloHyper {
  double lr = 0.02, beta1 = 0.9, beta2 = 0.999, eps = 1e-6, wd = 0.1;
  int64_t seed = 5, gap = 3, rank = 3;
  double scale = 1;
  bool channel = true;
};

// The update of apollo.h, restated in float64 with its channel norms and its limiter written
// out, for `steps` steps of the registry's optimizer `name` on a block's attention and MLP
// matrices (square, tall and wide), an embedding and a norm weight.
void check_apollo_restatement(const std::string& name, const OptSettings& settings,
                              const ApolloHyper& h, int steps) {
  torch::manual_seed(21);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"layers.0.self_attn.q_proj.weight", {8, 8}},  // m = n: "right", like m > n
      {"layers.0.mlp.up_proj.weight", {12, 8}},      // tall: right, channels are rows
      {"layers.0.mlp.down_proj.weight", {8, 12}},    // wide: left, channels are columns
      {"embed_tokens.weight", {16, 8}},              // AdamW
      {"norm.weight", {8}}};                         // AdamW
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  std::vector<ApolloRef> ref;
  for (const auto& [n, shape] : shapes) {
    const auto w = torch::randn(shape, torch::kFloat64);
    params.push_back(w.clone().requires_grad_(true));
    names.push_back(n);
    ref.push_back({n, w.clone(), torch::Tensor(), torch::Tensor(), -1, n.rfind("layers.", 0) == 0});
  }
  auto optimizer = make_optimizer(name, params, names, h.lr, h.wd, settings);
  bool limited = false;  // whether the limiter cut some step's update
  for (int t = 1; t <= steps; ++t) {
    const double bc1 = 1 - std::pow(h.beta1, t), bc2 = 1 - std::pow(h.beta2, t);
    std::vector<torch::Tensor> grads;
    for (auto& p : params) {
      grads.push_back(torch::randn_like(p));
      p.mutable_grad() = grads.back().clone();
    }
    optimizer->step();
    for (size_t k = 0; k < ref.size(); ++k) {
      auto& r = ref[k];
      const auto& g = grads[k];
      if (!r.projected) {  // torch.optim.AdamW
        if (!r.m.defined()) r.m = torch::zeros_like(g), r.v = torch::zeros_like(g);
        r.m = h.beta1 * r.m + (1 - h.beta1) * g;
        r.v = h.beta2 * r.v + (1 - h.beta2) * g * g;
        r.w = r.w * (1 - h.lr * h.wd) - h.lr / bc1 * r.m / (r.v.sqrt() / std::sqrt(bc2) + h.eps);
      } else {
        const int64_t m = g.size(0), n = g.size(1);
        const bool left = m < n;
        const int64_t index = apollo_index_of(*optimizer, params[k]);
        const auto p = apollo_projection(h.seed, index, (t - 1) / h.gap, m, n, h.rank,
                                         torch::dtype(torch::kFloat64));
        const auto low = left ? p.t().mm(g) : g.mm(p.t());  // (r, n) or (m, r)
        if (!r.m.defined()) r.m = torch::zeros_like(low), r.v = torch::zeros_like(low);
        r.m = h.beta1 * r.m + (1 - h.beta1) * low;
        r.v = h.beta2 * r.v + (1 - h.beta2) * low * low;
        const auto nrm = r.m / (r.v.sqrt() + h.eps);
        auto u = g.clone();
        if (h.channel) {
          const int64_t channels = left ? n : m;
          for (int64_t c = 0; c < channels; ++c) {
            const auto n_c = left ? nrm.select(1, c) : nrm.select(0, c);
            const auto r_c = left ? low.select(1, c) : low.select(0, c);
            const double s = std::sqrt(apollo_sum_sq(n_c)) / (std::sqrt(apollo_sum_sq(r_c)) + 1e-8);
            (left ? u.select(1, c) : u.select(0, c)).mul_(s);
          }
        } else {
          u.mul_(std::sqrt(apollo_sum_sq(nrm)) / (std::sqrt(apollo_sum_sq(low)) + 1e-8));
        }
        const double norm = std::sqrt(apollo_sum_sq(u));
        if (r.u < 0) {
          r.u = norm;
        } else {
          const double ratio = norm / (r.u + 1e-8);
          const double cut = std::max(ratio, 1.01) / 1.01;
          limited = limited || ratio > 1.01;
          u = u / cut;
          r.u = norm / cut;
        }
        r.w = r.w * (1 - h.lr * h.wd) - h.lr * std::sqrt(bc2) / bc1 * std::sqrt(h.scale) * u;
      }
      const double diff = apollo_max_diff(params[k].detach(), r.w);
      EXPECT_LT(diff, 1e-12) << name << " " << r.name << " step " << t;
      if (t == steps) {
        std::cout << name << " " << r.name << " after " << t << " steps OK maxdiff=" << diff
                  << "\n";
      }
    }
  }
  EXPECT_TRUE(limited) << "the limiter never acted, so the test does not check it";
  for (size_t k = 0; k < ref.size(); ++k) {
    const auto& state = apollo_state_of(*optimizer, params[k]);
    EXPECT_EQ(state.exp_avg().sizes(), ref[k].m.sizes()) << ref[k].name;
    EXPECT_EQ(state.update_norm().defined(), ref[k].projected) << ref[k].name;
  }
}

// Six steps with draws of P at steps 1 and 4 (update_proj_gap 3).
TEST(ApolloOptim, MatchesTheRestatementAcrossARefresh) {
  check_apollo_restatement("apollo", {{"rank", "3"}, {"update_proj_gap", "3"}, {"seed", "5"}},
                           ApolloHyper{}, 6);
}

TEST(ApolloOptim, MiniMatchesTheRestatementAcrossARefresh) {
  ApolloHyper h;
  h.rank = 1;
  h.scale = 128;
  h.channel = false;
  check_apollo_restatement("apollo-mini", {{"update_proj_gap", "3"}, {"seed", "5"}}, h, 6);
}

// limiter=false: the first step is the same, the later ones (which the limiter cuts) longer,
// and no norm is kept.
TEST(ApolloOptim, LimiterOffLeavesTheUpdateUncut) {
  torch::manual_seed(2);
  auto w = torch::randn({6, 10}, torch::kFloat64).requires_grad_(true);
  auto w_limited = w.detach().clone().requires_grad_(true);
  const auto options = ApolloOptions(0.01).rank(2);
  Apollo free_running(std::vector<torch::Tensor>{w}, ApolloOptions(options).limiter(false));
  Apollo limited(std::vector<torch::Tensor>{w_limited}, options);
  const auto g = torch::randn({6, 10}, torch::kFloat64);
  // A fixed gradient: N grows over the first steps (the bias corrections are outside it), so
  // the limiter cuts steps 2 and on.
  std::vector<double> free_steps;
  for (int t = 1; t <= 3; ++t) {
    const auto before = w.detach().clone();
    const auto before_limited = w_limited.detach().clone();
    w.mutable_grad() = g.clone();
    w_limited.mutable_grad() = g.clone();
    free_running.step();
    limited.step();
    const double step_free = (w.detach() - before).norm().item<double>();
    const double step_limited = (w_limited.detach() - before_limited).norm().item<double>();
    if (t == 1) EXPECT_DOUBLE_EQ(step_free, step_limited);
    if (t > 1) EXPECT_LT(step_limited, step_free * 0.99) << "step " << t;
  }
  EXPECT_FALSE(apollo_state_of(free_running, w).update_norm().defined());
  EXPECT_TRUE(apollo_state_of(limited, w_limited).update_norm().defined());
}

// P depends on (seed, index, draw) alone, has the reference's shape and variance 1/r, and
// leaves the global generator where it was.
TEST(ApolloOptim, ProjectionIsAFunctionOfItsArguments) {
  const auto f32 = torch::dtype(torch::kFloat32);
  torch::manual_seed(1);
  const auto a = apollo_projection(7, 3, 2, 64, 256, 16, f32);
  const auto after_a = torch::randn({4});
  torch::manual_seed(1);
  const auto b = apollo_projection(7, 3, 2, 64, 256, 16, f32);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(torch::randn({4}), after_a));  // the global generator untouched
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{64, 16}));   // m < n: (m, r)
  EXPECT_EQ(apollo_projection(7, 3, 2, 256, 64, 16, f32).sizes(), (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(apollo_projection(7, 3, 2, 32, 32, 4, f32).sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_FALSE(torch::equal(a, apollo_projection(8, 3, 2, 64, 256, 16, f32)));  // seed
  EXPECT_FALSE(torch::equal(a, apollo_projection(7, 4, 2, 64, 256, 16, f32)));  // index
  EXPECT_FALSE(torch::equal(a, apollo_projection(7, 3, 3, 64, 256, 16, f32)));  // draw
  // 16,384 draws: the variance within 10% (9 standard errors), the mean within 0.01 (8).
  const auto big = apollo_projection(7, 0, 0, 256, 1024, 64, f32);  // (256, 64)
  EXPECT_NEAR(big.pow(2).mean().item<double>(), 1.0 / 64, 0.1 / 64);
  EXPECT_NEAR(big.mean().item<double>(), 0, 0.01);
  // Drawn in float32 for every dtype: the float64 matrix is the float32 one, widened.
  EXPECT_TRUE(torch::equal(apollo_projection(7, 3, 2, 64, 256, 16, torch::dtype(torch::kFloat64)),
                           a.to(torch::kFloat64)));
}

// APOLLO with P the identity (rank min(m, n)) sketches nothing away: R = G, N is AdamW's
// normalized update, and each channel of the update is G's channel scaled to the length of
// AdamW's. So with eps 0 (where the two place eps differently) and neither limiter nor decay,
// every column (m < n) or row (m >= n) of APOLLO's step has the norm of AdamW's (up to the
// factor's 1e-8 guard, accounted for) and G's direction; tensor-wise, the whole step has
// AdamW's norm.
class ApolloIdentityProjection : public Apollo {
 public:
  using Apollo::Apollo;

 protected:
  torch::Tensor projection(const ApolloOptions& /*options*/, const torch::Tensor& param,
                           int64_t /*index*/, int64_t /*draw*/, int64_t rank) const override {
    return torch::eye(rank, param.options());
  }
};

TEST(ApolloOptim, IdentityProjectionGivesAdamWsChannelNorms) {
  for (const auto& shape : {std::vector<int64_t>{5, 9}, std::vector<int64_t>{9, 5}}) {
    for (const bool channel : {true, false}) {
      torch::manual_seed(6);
      const auto w0 = torch::randn(shape, torch::kFloat64);
      auto a = w0.clone().requires_grad_(true);
      auto b = w0.clone().requires_grad_(true);
      const int64_t r = std::min(shape[0], shape[1]);
      ApolloIdentityProjection apollo(
          std::vector<torch::Tensor>{a},
          ApolloOptions(0.01).rank(r).eps(0).limiter(false).update_proj_gap(2).scale_type(
              channel ? ApolloScaleType::kChannel
                      : ApolloScaleType::kTensor));
      torch::optim::AdamW adamw(std::vector<torch::Tensor>{b},
                                torch::optim::AdamWOptions(0.01).eps(0).weight_decay(0));
      const bool left = shape[0] < shape[1];
      const int64_t channels = channel ? (left ? shape[1] : shape[0]) : 1;
      double worst = 0;
      for (int t = 1; t <= 5; ++t) {
        const auto g = torch::randn(shape, torch::kFloat64);
        const auto a0 = a.detach().clone(), b0 = b.detach().clone();
        a.mutable_grad() = g.clone();
        b.mutable_grad() = g.clone();
        apollo.step();
        adamw.step();
        const auto da = a0 - a.detach(), db = b0 - b.detach();
        for (int64_t c = 0; c < channels; ++c) {
          auto pick = [&](const torch::Tensor& x) {
            return !channel ? x : left ? x.select(1, c) : x.select(0, c);
          };
          const double na = pick(da).norm().item<double>(), nb = pick(db).norm().item<double>();
          // AdamW's norm, times ||G_c|| / (||G_c|| + 1e-8) from the factor's guard.
          const double gn = pick(g).norm().item<double>();
          const double want = nb * gn / (gn + 1e-8);
          worst = std::max(worst, std::abs(na - want) / want);
          EXPECT_NEAR(na, want, 1e-12 * want)
              << "shape " << c10::IntArrayRef(shape) << " step " << t;
          // Along G: the cosine of the step's channel and G's is 1.
          const double cosine =
              (pick(da) * pick(g)).sum().item<double>() / (na * pick(g).norm().item<double>());
          EXPECT_NEAR(cosine, 1, 1e-12);
        }
      }
      std::cout << "APOLLO with P = I, " << (channel ? "channel" : "tensor") << ", shape "
                << c10::IntArrayRef(shape) << ": norms as AdamW's, worst relative diff " << worst
                << "\n";
    }
  }
}

// f(W) = 1/2 sum_ij a_j (W - W*)_ij^2 with column curvatures a_j from 1 to 100, from W = 0,
// on a block's MLP matrix through the registry at the default learning rate: both variants
// bring f below 1e-10 of its start in 1500 steps (measured: about 1e-22), and W within 1e-4
// of W*.
TEST(ApolloOptim, ReachesTheMinimumOfAConvexQuadratic) {
  for (const std::string name : {"apollo", "apollo-mini"}) {
    torch::manual_seed(12);
    const auto w_star = torch::randn({16, 32}, torch::kFloat64);
    const auto a = torch::logspace(0, 2, 32, 10, torch::kFloat64);  // (32): per column
    auto w = torch::zeros({16, 32}, torch::kFloat64).requires_grad_(true);
    const double lr = optimizer_registry().get(name).default_lr;
    auto optimizer = make_optimizer(
        name, {w}, std::vector<std::string>{"layers.0.mlp.down_proj.weight"}, lr, 0, {});
    auto f = [&] { return 0.5 * (a * (w - w_star).pow(2)).sum(); };
    const double before = f().item<double>();
    for (int i = 0; i < 1500; ++i) {
      optimizer->zero_grad();
      f().backward();
      optimizer->step();
    }
    const double after = f().item<double>();
    const double distance = (w.detach() - w_star).abs().max().item<double>();
    std::cout << name << " on the quadratic: f " << before << " -> " << after << ", max |W - W*| "
              << distance << "\n";
    EXPECT_LT(after, 1e-10 * before) << name;
    EXPECT_LT(distance, 1e-4) << name;
  }
}

// ------------------------------------------------------------------------------ state bytes

// M and V of R's shape, 2 r max(m, n) values, plus the limiter's norm: no P.
TEST(ApolloStateBytes, MomentsOfTheSketchAndOneNorm) {
  torch::manual_seed(1);
  const int64_t m = 64, n = 256, r = 16;
  for (const bool tall : {false, true}) {
    for (const bool limiter : {true, false}) {
      auto w = (tall ? torch::randn({n, m}) : torch::randn({m, n})).requires_grad_(true);
      Apollo optimizer(std::vector<torch::Tensor>{w}, ApolloOptions().rank(r).limiter(limiter));
      EXPECT_EQ(optimizer_state_bytes(optimizer), 0);  // lazy
      w.mutable_grad() = torch::randn_like(w);
      optimizer.step();
      const int64_t want = 4 * (2 * r * n + (limiter ? 1 : 0));
      EXPECT_EQ(optimizer_state_bytes(optimizer), want) << (tall ? "tall" : "wide");
      EXPECT_EQ(apollo_state_of(optimizer, w).exp_avg().sizes(),
                tall ? (std::vector<int64_t>{n, r}) : (std::vector<int64_t>{r, n}));
    }
  }
  // APOLLO-Mini: 2 max(m, n) + 1 values, 2,052 bytes where AdamW holds 131,072.
  auto w = torch::randn({m, n}).requires_grad_(true);
  auto mini = make_optimizer(
      "apollo-mini", {w}, std::vector<std::string>{"layers.3.mlp.gate_proj.weight"}, 1e-2, 0, {});
  w.mutable_grad() = torch::randn_like(w);
  mini->step();
  EXPECT_EQ(optimizer_state_bytes(*mini), 4 * (2 * n + 1));
}

// The registry's apollo and apollo-mini on the tiny Llama: the blocks' matrices hold
// 2 r max(m, n) + 1 values (r = min(m, n) / 4, or 1), every other parameter AdamW's 2x.
TEST(ApolloStateBytes, TinyLlamaMatchesTheFormula) {
  const auto& family = model_registry().get("llama");
  auto arch = family.preset("tiny");
  if (family.finalize != nullptr) family.finalize(arch);
  auto model = family.build(arch, 0);
  const auto named = model->named_parameters();
  for (const std::string name : {"apollo", "apollo-mini"}) {
    torch::manual_seed(3);
    for (auto& p : named.values()) p.mutable_grad() = torch::randn_like(p);
    auto optimizer = make_optimizer(name, named.values(), named.keys(), 1e-3, 0, {});
    optimizer->step();
    int64_t want = 0, projected = 0;
    for (const auto& item : named) {
      const auto& p = item.value();
      if (p.dim() == 2 && galore_projects(item.key(), galore_default_targets())) {
        const int64_t lo = std::min(p.size(0), p.size(1)), hi = std::max(p.size(0), p.size(1));
        const int64_t r = name == "apollo-mini" ? 1 : std::max<int64_t>(1, lo / 4);
        want += 4 * (2 * r * hi + 1);
        ++projected;
      } else {
        want += 4 * 2 * p.numel();
      }
    }
    EXPECT_EQ(projected, 14);
    EXPECT_EQ(optimizer_state_bytes(*optimizer), want) << name;
    std::cout << name << " on the tiny Llama: state " << want << " B for "
              << tensors_bytes(named.values()) << " B of parameters\n";
  }
}

// ----------------------------------------------------------------------------- save and load

// Saves after three steps, loads into a fresh optimizer over copies of the parameters, then
// steps both three times (across the draw at step 5): equal bit for bit, since the loaded
// optimizer draws P again from the same seed, position and count; different from one that
// lost its state.
TEST(ApolloOptim, SerializationRoundTripContinuesExactly) {
  for (const auto type :
       {ApolloScaleType::kChannel, ApolloScaleType::kTensor}) {
    torch::manual_seed(8);
    std::vector<torch::Tensor> a = {torch::randn({6, 10}).requires_grad_(true),
                                    torch::randn({9, 4}).requires_grad_(true),
                                    torch::randn({5}).requires_grad_(true)};
    const auto options =
        ApolloOptions(0.01).rank(2).update_proj_gap(4).weight_decay(0.01).seed(3).scale_type(type);
    std::vector<std::vector<torch::Tensor>> grads(6);
    for (auto& g : grads)
      for (const auto& p : a) g.push_back(torch::randn_like(p));
    auto step = [&](torch::optim::Optimizer& optimizer, std::vector<torch::Tensor>& params, int i) {
      for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = grads[i][k].clone();
      optimizer.step();
    };
    Apollo original(a, options);
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
    Apollo loaded(b, options);
    torch::load(loaded, buffer);
    Apollo forgetful(c, options);
    EXPECT_EQ(optimizer_state_bytes(loaded), optimizer_state_bytes(original));
    EXPECT_EQ(apollo_state_of(loaded, b[0]).step(), 3);
    EXPECT_TRUE(torch::equal(apollo_state_of(loaded, b[0]).update_norm(),
                             apollo_state_of(original, a[0]).update_norm()));
    for (int i = 3; i < 6; ++i) {
      step(original, a, i);
      step(loaded, b, i);
      step(forgetful, c, i);
    }
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_TRUE(torch::equal(a[k], b[k])) << "parameter " << k << " after loading";
      EXPECT_FALSE(torch::equal(a[k], c[k])) << "parameter " << k << ": losing the state "
                                             << "changed nothing, so the test proves nothing";
    }
  }
}

// Another seed draws other projections, so the run differs.
TEST(ApolloOptim, SeedChoosesTheProjections) {
  auto run = [](const std::string& seed) {
    torch::manual_seed(4);
    auto w = torch::randn({6, 10}).requires_grad_(true);
    auto optimizer =
        make_optimizer("apollo", {w}, std::vector<std::string>{"layers.0.mlp.fc1.weight"}, 1e-2, 0,
                       {{"seed", seed}});
    for (int i = 0; i < 3; ++i) {
      w.mutable_grad() = torch::randn_like(w);
      optimizer->step();
    }
    return w.detach().clone();
  };
  EXPECT_TRUE(torch::equal(run("1"), run("1")));
  EXPECT_FALSE(torch::equal(run("1"), run("2")));
}

// ------------------------------------------------------------------------------- settings

std::vector<torch::Tensor> apollo_registry_params() {
  return {torch::zeros({8, 12}, torch::requires_grad()), torch::zeros({5}, torch::requires_grad())};
}
const std::vector<std::string> kApolloRegistryNames = {"layers.0.mlp.up_proj.weight",
                                                       "layers.0.mlp.up_proj.bias"};

std::string apollo_refusal(const std::string& name, const OptSettings& opt) {
  const Error e = testing::expect_usage_error(
      [&] { make_optimizer(name, apollo_registry_params(), kApolloRegistryNames, 1e-2, 0, opt); });
  return std::string(e.what()) + " | " + e.hint();
}

TEST(ApolloSettings, RegistryRefusesBadValuesNamingThem) {
  const std::vector<std::tuple<std::string, OptSettings, std::string>> cases = {
      {"apollo", {{"rank", "0"}}, "rank=0"},
      {"apollo", {{"rank", "1.5"}}, "rank=1.5"},
      {"apollo", {{"rank", "-2"}}, "rank=-2"},
      {"apollo", {{"rank", "9"}}, "(8, 12)"},  // larger than min(8, 12): the constructor's
      {"apollo", {{"update_proj_gap", "0"}}, "update_proj_gap=0"},
      {"apollo", {{"update_proj_gap", "2.5"}}, "update_proj_gap=2.5"},
      {"apollo", {{"scale", "0"}}, "scale=0"},
      {"apollo", {{"scale", "-4"}}, "scale=-4"},
      {"apollo", {{"scale_type", "row"}}, "scale_type 'row'"},
      {"apollo", {{"seed", "-1"}}, "seed=-1"},
      {"apollo", {{"seed", "0.5"}}, "seed=0.5"},
      {"apollo", {{"limiter", "maybe"}}, "limiter=maybe"},
      {"apollo", {{"betas", "0.9,1"}}, "betas=0.9,1"},
      {"apollo", {{"eps", "-1"}}, "eps=-1"},
      {"apollo", {{"targets", "lm_head"}}, "targets=lm_head name no matrix"},
      {"apollo",
       {{"update_gap", "10"}},
       "rank, update_proj_gap, scale, scale_type, seed, limiter, betas, eps, targets"},
      {"apollo-mini", {{"rank", "2"}}, "update_proj_gap, scale, seed, limiter, betas, eps"},
      {"apollo-mini", {{"scale_type", "channel"}}, "has no setting 'scale_type'"},
      {"apollo-mini", {{"scale", "0"}}, "apollo-mini scale=0"},
  };
  for (const auto& [name, opt, named] : cases) {
    const auto msg = apollo_refusal(name, opt);
    EXPECT_TRUE(testing::contains(msg, named))
        << name << ": '" << msg << "' does not name '" << named << "'";
  }
}

std::string apollo_constructor_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "expected a c10::Error";
  return "";
}

TEST(ApolloSettings, ConstructorRefusesBadValuesNamingThem) {
  auto p = [] { return std::vector<torch::Tensor>{torch::zeros({4, 6}, torch::requires_grad())}; };
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] { Apollo(p(), ApolloOptions(-0.5)); }, "-0.5"},
      {[&] { Apollo(p(), ApolloOptions().betas(std::make_tuple(1.0, 0.999))); }, "index 0: 1"},
      {[&] { Apollo(p(), ApolloOptions().eps(-1e-3)); }, "epsilon value: -0.001"},
      {[&] { Apollo(p(), ApolloOptions().weight_decay(-0.75)); }, "-0.75"},
      {[&] { Apollo(p(), ApolloOptions().update_proj_gap(0)); }, "update_proj_gap value: 0"},
      {[&] { Apollo(p(), ApolloOptions().scale(0)); }, "scale value: 0"},
      {[&] { Apollo(p(), ApolloOptions().seed(-2)); }, "seed value: -2"},
      {[&] { Apollo(p(), ApolloOptions().rank(0)); }, "rank value: 0"},
      {[&] { Apollo(p(), ApolloOptions().rank(5)); }, "(4, 6)"},
  };
  for (const auto& [make, named] : cases) {
    const auto msg = apollo_constructor_error(make);
    EXPECT_TRUE(testing::contains(msg, named)) << "'" << msg << "' does not name '" << named << "'";
  }
  Apollo(p(), ApolloOptions().rank(4));  // the largest valid rank
}

TEST(ApolloSettings, SettingsReachTheOptimizer) {
  auto optimizer =
      make_optimizer("apollo", apollo_registry_params(), kApolloRegistryNames, 2e-3, 0.05,
                     {{"rank", "3"},
                      {"update_proj_gap", "50"},
                      {"scale", "2"},
                      {"scale_type", "tensor"},
                      {"seed", "9"},
                      {"limiter", "false"},
                      {"betas", "0.8,0.95"},
                      {"eps", "1e-8"}});
  ASSERT_EQ(optimizer->param_groups().size(), 2u);
  const auto& o = static_cast<const ApolloOptions&>(optimizer->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.lr(), 2e-3);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.05);
  EXPECT_EQ(o.rank(), c10::optional<int64_t>(3));
  EXPECT_EQ(o.update_proj_gap(), 50);
  EXPECT_DOUBLE_EQ(o.scale(), 2);
  EXPECT_EQ(o.scale_type(), ApolloScaleType::kTensor);
  EXPECT_EQ(o.seed(), 9);
  EXPECT_FALSE(o.limiter());
  EXPECT_DOUBLE_EQ(std::get<0>(o.betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.95);
  EXPECT_DOUBLE_EQ(o.eps(), 1e-8);
  EXPECT_TRUE(o.project());
  EXPECT_FALSE(static_cast<const ApolloOptions&>(optimizer->param_groups()[1].options()).project());

  auto apollo = make_optimizer("apollo", apollo_registry_params(), kApolloRegistryNames, 1, 0, {});
  const auto& d = static_cast<const ApolloOptions&>(apollo->param_groups()[0].options());
  EXPECT_FALSE(d.rank().has_value());
  EXPECT_EQ(d.update_proj_gap(), 200);
  EXPECT_DOUBLE_EQ(d.scale(), 1);
  EXPECT_EQ(d.scale_type(), ApolloScaleType::kChannel);
  EXPECT_TRUE(d.limiter());
  EXPECT_DOUBLE_EQ(d.eps(), 1e-6);
  auto mini =
      make_optimizer("apollo-mini", apollo_registry_params(), kApolloRegistryNames, 1, 0, {});
  const auto& dm = static_cast<const ApolloOptions&>(mini->param_groups()[0].options());
  EXPECT_EQ(dm.rank(), c10::optional<int64_t>(1));
  EXPECT_DOUBLE_EQ(dm.scale(), 128);
  EXPECT_EQ(dm.scale_type(), ApolloScaleType::kTensor);
  for (const std::string name : {"apollo", "apollo-mini"}) {
    EXPECT_DOUBLE_EQ(optimizer_registry().get(name).default_lr, 1e-2);
    EXPECT_DOUBLE_EQ(default_lr(name, "quadratic"), 1e-1);
  }
}

TEST(ApolloSettings, RefusesParametersWithoutNames) {
  try {
    make_optimizer("apollo-mini", apollo_registry_params(), 1e-2, 0, {});
    ADD_FAILURE() << "expected a gradscope::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_TRUE(testing::contains(e.what(), "names")) << e.what();
  }
}

}  // namespace
}  // namespace gradscope
