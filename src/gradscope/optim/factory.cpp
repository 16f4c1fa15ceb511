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
#include "gradscope/optim/torch_optimizers.h"

namespace gradscope {

std::map<std::string, double> toy_learning_rates(double lr) {
  return {{"quadratic", lr}, {"rosenbrock", lr}};
}

// One line per optimizer: its name, its description and its entry, from its own file.
const Registry<OptimizerEntry>& optimizer_registry() {
  static const Registry<OptimizerEntry> registry = [] {
    Registry<OptimizerEntry> r("optimizer");
    r.add("sgd", "stochastic gradient descent (momentum, nesterov)", sgd_entry());
    r.add("adam", "Adam (Kingma & Ba 2015)", adam_entry());
    r.add("adagrad", "Adagrad (Duchi et al. 2011)", adagrad_entry());
    r.add("adamw", "AdamW, decoupled weight decay (Loshchilov & Hutter 2019)", adamw_entry());
    r.add("adadelta", "Adadelta (Zeiler 2012)", adadelta_entry());
    r.add("cg", "nonlinear conjugate gradient (fr, pr+, hs, dy; Armijo or strong-Wolfe search)",
          cg_entry());
    r.add("lion", "Lion, sign momentum (Chen et al. 2023)", lion_entry());
    r.add("adafactor", "Adafactor, factored second moment (Shazeer & Stern 2018)",
          adafactor_entry());
    r.add("adam8bit", "8-bit block-wise Adam (Dettmers et al. 2022)", adam8bit_entry());
    r.add("galore", "GaLore, low-rank gradient projection with Adam (Zhao et al. 2024)",
          galore_entry());
    r.add("adam-mini", "Adam-mini, one second moment per block (Zhang et al. 2024)",
          adam_mini_entry());
    r.add("muon", "Muon, Newton-Schulz orthogonalized momentum, AdamW elsewhere (Jordan 2024)",
          muon_entry());
    r.add("apollo", "APOLLO, channel-wise scaling from a random low-rank sketch (Zhu et al. 2024)",
          apollo_entry());
    r.add("apollo-mini", "APOLLO-Mini, rank-1 tensor-wise APOLLO (Zhu et al. 2024)",
          apollo_mini_entry());
    return r;
  }();
  return registry;
}

std::vector<std::string> optimizers_where(bool (*capability)(const OptimizerEntry&)) {
  std::vector<std::string> names;
  for (const auto& item : optimizer_registry().items())
    if (capability(item.entry)) names.push_back(item.name);
  return names;
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
