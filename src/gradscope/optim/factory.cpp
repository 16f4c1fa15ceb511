#include "gradscope/optim/factory.h"

#include <cmath>

#include "gradscope/core/error.h"
#include "gradscope/optim/adadelta.h"
#include "gradscope/optim/adafactor.h"
#include "gradscope/optim/adam8bit.h"
#include "gradscope/optim/adam_mini.h"
#include "gradscope/optim/apollo.h"
#include "gradscope/optim/conjugate_gradient.h"
#include "gradscope/optim/galore.h"
#include "gradscope/optim/lion.h"
#include "gradscope/optim/muon.h"
#include "gradscope/optim/opt_reader.h"

namespace gradscope {
namespace {

const std::vector<std::string> kSgdKeys = {"momentum", "dampening", "nesterov"};
const std::vector<std::string> kAdamKeys = {"betas", "eps", "amsgrad"};
const std::vector<std::string> kAdagradKeys = {"lr_decay", "eps", "initial_accumulator_value"};
const std::vector<std::string> kAdadeltaKeys = {"rho", "eps", "maximize"};
const std::vector<std::string> kLionKeys = {"betas"};
const std::vector<std::string> kCgKeys = {"beta_rule", "line_search", "restart_every",   "c1", "c2",
                                          "backtrack", "max_evals",   "tolerance_change"};
const std::vector<std::string> kAdafactorKeys = {"beta1",      "decay_rate",    "clip_threshold",
                                                 "eps",        "relative_step", "scale_parameter",
                                                 "warmup_init"};
const std::vector<std::string> kAdam8bitKeys = {"betas", "eps", "block_size", "min_8bit_size"};
const std::vector<std::string> kGaloreKeys = {"rank",  "update_gap", "scale",
                                              "betas", "eps",        "targets"};

std::unique_ptr<torch::optim::Optimizer> make_sgd(std::vector<torch::Tensor> params,
                                                  const ParamInfo& /*info*/, double lr,
                                                  double weight_decay, const OptSettings& opt) {
  OptReader r("sgd", opt, kSgdKeys);
  const double momentum = r.number("momentum", 0.0);
  const double dampening = r.number("dampening", 0.0);
  const bool nesterov = r.flag("nesterov", false);
  check_range(momentum >= 0, fmt::format("sgd momentum={} must be >= 0", momentum));
  check_range(!nesterov || (momentum > 0 && dampening == 0),
              "sgd nesterov=true needs momentum > 0 and dampening = 0");
  auto options = torch::optim::SGDOptions(lr)
                     .momentum(momentum)
                     .dampening(dampening)
                     .nesterov(nesterov)
                     .weight_decay(weight_decay);
  return construct_optimizer<torch::optim::SGD>("sgd", std::move(params), options);
}

// Adam and AdamW read the same settings; they differ in how weight decay enters the update.
template <typename Opt, typename Options>
std::unique_ptr<torch::optim::Optimizer> make_adam_like(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt) {
  OptReader r(name, opt, kAdamKeys);
  const auto betas = r.pair("betas", {0.9, 0.999});
  const double eps = r.number("eps", 1e-8);
  check_betas(name, betas);
  check_range(eps >= 0, fmt::format("{} eps={} must be >= 0", name, eps));
  auto options = Options(lr)
                     .betas(std::make_tuple(betas.first, betas.second))
                     .eps(eps)
                     .amsgrad(r.flag("amsgrad", false))
                     .weight_decay(weight_decay);
  return construct_optimizer<Opt>(name, std::move(params), options);
}

std::unique_ptr<torch::optim::Optimizer> make_adam(std::vector<torch::Tensor> params,
                                                   const ParamInfo& /*info*/, double lr,
                                                   double weight_decay, const OptSettings& opt) {
  return make_adam_like<torch::optim::Adam, torch::optim::AdamOptions>("adam", std::move(params),
                                                                       lr, weight_decay, opt);
}

std::unique_ptr<torch::optim::Optimizer> make_adagrad(std::vector<torch::Tensor> params,
                                                      const ParamInfo& /*info*/, double lr,
                                                      double weight_decay, const OptSettings& opt) {
  OptReader r("adagrad", opt, kAdagradKeys);
  const double lr_decay = r.number("lr_decay", 0.0);
  const double eps = r.number("eps", 1e-10);
  const double init = r.number("initial_accumulator_value", 0.0);
  check_range(lr_decay >= 0, fmt::format("adagrad lr_decay={} must be >= 0", lr_decay));
  check_range(eps >= 0, fmt::format("adagrad eps={} must be >= 0", eps));
  check_range(init >= 0, fmt::format("adagrad initial_accumulator_value={} must be >= 0", init));
  auto options = torch::optim::AdagradOptions(lr)
                     .lr_decay(lr_decay)
                     .eps(eps)
                     .initial_accumulator_value(init)
                     .weight_decay(weight_decay);
  return construct_optimizer<torch::optim::Adagrad>("adagrad", std::move(params), options);
}

std::unique_ptr<torch::optim::Optimizer> make_adamw(std::vector<torch::Tensor> params,
                                                    const ParamInfo& /*info*/, double lr,
                                                    double weight_decay, const OptSettings& opt) {
  return make_adam_like<torch::optim::AdamW, torch::optim::AdamWOptions>("adamw", std::move(params),
                                                                         lr, weight_decay, opt);
}

std::unique_ptr<torch::optim::Optimizer> make_adadelta(std::vector<torch::Tensor> params,
                                                       const ParamInfo& /*info*/, double lr,
                                                       double weight_decay,
                                                       const OptSettings& opt) {
  OptReader r("adadelta", opt, kAdadeltaKeys);
  const double rho = r.number("rho", 0.9);
  const double eps = r.number("eps", 1e-6);
  check_range(rho >= 0 && rho <= 1, fmt::format("adadelta rho={} must lie in [0, 1]", rho));
  check_range(eps >= 0, fmt::format("adadelta eps={} must be >= 0", eps));
  auto options = AdadeltaOptions(lr)
                     .rho(rho)
                     .eps(eps)
                     .weight_decay(weight_decay)
                     .maximize(r.flag("maximize", false));
  return construct_optimizer<Adadelta>("adadelta", std::move(params), options);
}

std::unique_ptr<torch::optim::Optimizer> make_lion(std::vector<torch::Tensor> params,
                                                   const ParamInfo& /*info*/, double lr,
                                                   double weight_decay, const OptSettings& opt) {
  OptReader r("lion", opt, kLionKeys);
  const auto betas = r.pair("betas", {0.9, 0.99});
  check_betas("lion", betas);
  auto options =
      LionOptions(lr).betas(std::make_tuple(betas.first, betas.second)).weight_decay(weight_decay);
  return construct_optimizer<Lion>("lion", std::move(params), options);
}

std::unique_ptr<torch::optim::Optimizer> make_adafactor(std::vector<torch::Tensor> params,
                                                        const ParamInfo& /*info*/, double lr,
                                                        double weight_decay,
                                                        const OptSettings& opt) {
  OptReader r("adafactor", opt, kAdafactorKeys);
  const auto beta1 = r.maybe_number("beta1");
  const double decay_rate = r.number("decay_rate", -0.8);
  const double clip_threshold = r.number("clip_threshold", 1.0);
  const auto eps = r.pair("eps", {1e-30, 1e-3});
  const bool relative_step = r.flag("relative_step", true);
  const bool warmup_init = r.flag("warmup_init", false);
  check_range(!beta1 || (*beta1 >= 0 && *beta1 < 1),
              fmt::format("adafactor beta1={} must lie in [0, 1)", beta1.value_or(0)));
  check_range(decay_rate >= -1 && decay_rate < 0,
              fmt::format("adafactor decay_rate={} must lie in [-1, 0)", decay_rate));
  check_range(clip_threshold > 0,
              fmt::format("adafactor clip_threshold={} must be > 0", clip_threshold));
  check_range(eps.first >= 0 && eps.second >= 0,
              fmt::format("adafactor eps={},{} must be >= 0", eps.first, eps.second));
  check_range(!warmup_init || relative_step, "adafactor warmup_init=true needs relative_step=true");
  auto options = AdafactorOptions(lr)
                     .eps1(eps.first)
                     .eps2(eps.second)
                     .clip_threshold(clip_threshold)
                     .decay_rate(decay_rate)
                     .beta1(beta1 ? c10::optional<double>(*beta1) : c10::nullopt)
                     .weight_decay(weight_decay)
                     .scale_parameter(r.flag("scale_parameter", true))
                     .relative_step(relative_step)
                     .warmup_init(warmup_init);
  return construct_optimizer<Adafactor>("adafactor", std::move(params), options);
}

std::unique_ptr<torch::optim::Optimizer> make_adam8bit(std::vector<torch::Tensor> params,
                                                       const ParamInfo& /*info*/, double lr,
                                                       double weight_decay,
                                                       const OptSettings& opt) {
  OptReader r("adam8bit", opt, kAdam8bitKeys);
  const auto betas = r.pair("betas", {0.9, 0.999});
  const double eps = r.number("eps", 1e-8);
  const double block_size = r.number("block_size", 2048);
  const double min_8bit_size = r.number("min_8bit_size", 4096);
  check_betas("adam8bit", betas);
  check_range(eps >= 0, fmt::format("adam8bit eps={} must be >= 0", eps));
  // Whole numbers, and small enough to convert to int64_t exactly.
  check_range(block_size >= 1 && block_size == std::floor(block_size) && block_size < 9.0e15,
              fmt::format("adam8bit block_size={} must be a positive integer", block_size));
  check_range(
      min_8bit_size >= 0 && min_8bit_size == std::floor(min_8bit_size) && min_8bit_size < 9.0e15,
      fmt::format("adam8bit min_8bit_size={} must be an integer >= 0", min_8bit_size));
  auto options = Adam8bitOptions(lr)
                     .betas(std::make_tuple(betas.first, betas.second))
                     .eps(eps)
                     .weight_decay(weight_decay)
                     .block_size(static_cast<int64_t>(block_size))
                     .min_8bit_size(static_cast<int64_t>(min_8bit_size));
  return construct_optimizer<Adam8bit>("adam8bit", std::move(params), options);
}

// rank and update_gap are integers read as numbers, so that rank=1.5 is refused naming it.
// The matrices the paper projects (galore_projects, by name) form a projecting group, every
// other parameter a group with project=false (AdamW), as in GaLore's reference code.
std::unique_ptr<torch::optim::Optimizer> make_galore(std::vector<torch::Tensor> params,
                                                     const ParamInfo& info, double lr,
                                                     double weight_decay, const OptSettings& opt) {
  OptReader r("galore", opt, kGaloreKeys);
  const auto rank = r.maybe_number("rank");  // unset: max(1, min(m, n) / 4) per matrix
  const double update_gap = r.number("update_gap", 200);
  const double scale = r.number("scale", 0.25);
  const auto betas = r.pair("betas", {0.9, 0.999});
  const double eps = r.number("eps", 1e-8);
  const auto targets = r.names("targets", galore_default_targets());
  auto positive_integer = [](double v) { return v >= 1 && v <= 9.0e15 && v == std::floor(v); };
  check_range(!rank || positive_integer(*rank),
              fmt::format("galore rank={} must be a positive integer (leave it unset for "
                          "min(m, n) / 4 per matrix)",
                          rank.value_or(0)));
  check_range(positive_integer(update_gap),
              fmt::format("galore update_gap={} must be a positive integer", update_gap));
  check_range(scale > 0, fmt::format("galore scale={} must be > 0", scale));
  check_betas("galore", betas);
  check_range(eps >= 0, fmt::format("galore eps={} must be >= 0", eps));
  const auto& names = info.names;
  if (names.empty() && !params.empty())
    fail_runtime(
        "galore needs the parameters' names to tell the blocks' attention and MLP "
        "matrices from embeddings, heads and classifiers",
        "build it with make_optimizer(name, params, names, ...) "
        "(torch::nn::Module::named_parameters())");
  auto options = GaloreOptions(lr)
                     .betas(std::make_tuple(betas.first, betas.second))
                     .eps(eps)
                     .weight_decay(weight_decay)
                     .update_gap(static_cast<int64_t>(update_gap))
                     .scale(scale);
  if (rank) options.rank(static_cast<int64_t>(*rank));

  auto groups = projection_groups(std::string("galore"), params, names, targets, opt, options);
  // A rank above min(m, n) of some matrix is refused by the constructor: a usage error here.
  return construct_optimizer<Galore>("galore", std::move(groups), options);
}

std::unique_ptr<torch::optim::Optimizer> make_cg(std::vector<torch::Tensor> params,
                                                 const ParamInfo& /*info*/, double lr,
                                                 double weight_decay, const OptSettings& opt) {
  OptReader r("cg", opt, kCgKeys);
  const auto rule = r.choice("beta_rule", "pr+", {"fr", "pr+", "hs", "dy"});
  const auto search = r.choice("line_search", "strong_wolfe", {"none", "armijo", "strong_wolfe"});
  const int64_t restart_every = r.integer("restart_every", 0);
  const double c1 = r.number("c1", 1e-4);
  const double c2 = r.number("c2", 0.1);
  const double backtrack = r.number("backtrack", 0.5);
  const int64_t max_evals = r.integer("max_evals", 25);
  const double tolerance = r.number("tolerance_change", 1e-12);
  check_range(
      restart_every >= 0,
      fmt::format("cg restart_every={} must be >= 0 (0 = no scheduled restarts)", restart_every));
  check_range(c1 > 0 && c1 < c2 && c2 < 1,
              fmt::format("cg c1={}, c2={} must satisfy 0 < c1 < c2 < 1", c1, c2));
  check_range(backtrack > 0 && backtrack < 1,
              fmt::format("cg backtrack={} must lie in (0, 1)", backtrack));
  check_range(max_evals >= 1, fmt::format("cg max_evals={} must be >= 1", max_evals));
  check_range(tolerance >= 0, fmt::format("cg tolerance_change={} must be >= 0", tolerance));
  auto options = ConjugateGradientOptions(lr)
                     .beta_rule(rule)
                     .line_search(search)
                     .restart_every(restart_every)
                     .c1(c1)
                     .c2(c2)
                     .backtrack(backtrack)
                     .max_evals(max_evals)
                     .tolerance_change(tolerance)
                     .weight_decay(weight_decay);
  return construct_optimizer<ConjugateGradient>("cg", std::move(params), options);
}

}  // namespace

const Registry<OptimizerEntry>& optimizer_registry() {
  static const Registry<OptimizerEntry> registry = [] {
    Registry<OptimizerEntry> r("optimizer");
    // The toy problems (start about 1 from their minimum, curvature up to 1e3) want other
    // rates than the transformers: these were chosen from 500-step runs of each optimizer at
    // 1e-4 .. 1 on both toys and both presets (docs/optimizers.md), stable on all four.
    auto toys = [](double lr) {
      return std::map<std::string, double>{{"quadratic", lr}, {"rosenbrock", lr}};
    };
    r.add("sgd", "stochastic gradient descent (momentum, nesterov)",
          {make_sgd, 1e-2, kSgdKeys, false, toys(1e-3)});
    r.add("adam", "Adam (Kingma & Ba 2015)", {make_adam, 1e-3, kAdamKeys, false, toys(1e-1)});
    r.add("adagrad", "Adagrad (Duchi et al. 2011)",
          {make_adagrad, 1e-2, kAdagradKeys, false, toys(1.0)});
    r.add("adamw", "AdamW, decoupled weight decay (Loshchilov & Hutter 2019)",
          {make_adamw, 1e-3, kAdamKeys, false, toys(1e-1)});
    r.add("adadelta", "Adadelta (Zeiler 2012)", {make_adadelta, 1.0, kAdadeltaKeys});
    r.add("cg", "nonlinear conjugate gradient (fr, pr+, hs, dy; Armijo or strong-Wolfe search)",
          {make_cg, 1e-2, kCgKeys, /*steps_with_closure=*/true});
    r.add("lion", "Lion, sign momentum (Chen et al. 2023)",
          {make_lion, 1e-4, kLionKeys, false, toys(1e-2)});
    r.add("adafactor", "Adafactor, factored second moment (Shazeer & Stern 2018)",
          {make_adafactor, 1e-2, kAdafactorKeys, false, toys(1e-1)});
    r.add("adam8bit", "8-bit block-wise Adam (Dettmers et al. 2022)",
          {make_adam8bit, 1e-3, kAdam8bitKeys, false, toys(1e-1)});
    r.add("galore", "GaLore, low-rank gradient projection with Adam (Zhao et al. 2024)",
          {make_galore, 1e-2, kGaloreKeys, false, toys(1e-1)});
    r.add("adam-mini", "Adam-mini, one second moment per block (Zhang et al. 2024)",
          {make_adam_mini, 1e-3, adam_mini_keys(), false, toys(1e-1)});
    r.add("muon", "Muon, Newton-Schulz orthogonalized momentum, AdamW elsewhere (Jordan 2024)",
          {make_muon, 2e-2, muon_keys()});
    r.add("apollo", "APOLLO, channel-wise scaling from a random low-rank sketch (Zhu et al. 2024)",
          {make_apollo, 1e-2, apollo_keys(), false, toys(1e-1)});
    r.add("apollo-mini", "APOLLO-Mini, rank-1 tensor-wise APOLLO (Zhu et al. 2024)",
          {make_apollo_mini, 1e-2, apollo_mini_keys(), false, toys(1e-1)});
    return r;
  }();
  return registry;
}

double default_lr(const std::string& optimizer, const std::string& model) {
  const auto& entry = optimizer_registry().get(optimizer);
  auto it = entry.lr_by_model.find(model);
  return it == entry.lr_by_model.end() ? entry.default_lr : it->second;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt) {
  return make_optimizer(name, std::move(params), ParamInfo{}, lr, weight_decay, opt);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        const std::vector<std::string>& names,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt) {
  return make_optimizer(name, std::move(params), ParamInfo{names, {}}, lr, weight_decay, opt);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        const ParamInfo& info, double lr,
                                                        double weight_decay,
                                                        const OptSettings& opt) {
  TORCH_CHECK(info.names.empty() || info.names.size() == params.size(),
              "make_optimizer: ", info.names.size(), " names for ", params.size(), " parameters");
  TORCH_CHECK(info.head_sizes.empty() || info.head_sizes.size() == params.size(),
              "make_optimizer: ", info.head_sizes.size(), " head sizes for ", params.size(),
              " parameters");
  const auto& entry = optimizer_registry().get(name);
  check_usage(std::isfinite(lr) && lr > 0, fmt::format("learning rate {} must be > 0", lr),
              "pass --lr with a positive value, e.g. --lr 1e-3");
  check_usage(std::isfinite(weight_decay) && weight_decay >= 0,
              fmt::format("weight decay {} must be >= 0", weight_decay),
              "pass --weight-decay 0 for none");
  return entry.make(std::move(params), info, lr, weight_decay, opt);
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

void parse_opt_setting(const std::string& text, OptSettings& into) {
  auto eq = text.find('=');
  check_usage(eq != std::string::npos && eq > 0 && eq + 1 < text.size(),
              "cannot read optimizer setting '" + text + "'",
              "write --opt NAME=VALUE, e.g. --opt momentum=0.9 or --opt betas=0.9,0.95");
  into[text.substr(0, eq)] = text.substr(eq + 1);
}

}  // namespace gradscope
