#include "gradscope/optim/factory.h"

#include <cmath>
#include <set>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

// Reads typed values out of --opt settings, refusing unknown names and bad values.
class OptReader {
 public:
  OptReader(const std::string& optimizer, const OptSettings& opt,
            const std::vector<std::string>& keys)
      : optimizer_(optimizer), opt_(opt) {
    std::set<std::string> valid(keys.begin(), keys.end());
    for (const auto& [name, value] : opt_) {
      if (!valid.count(name)) {
        std::string list;
        for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
        fail_usage("optimizer '" + optimizer_ + "' has no setting '" + name + "'",
                   "settings of " + optimizer_ + ": " + (list.empty() ? "none" : list));
      }
    }
  }

  double number(const std::string& name, double fallback) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return fallback;
    return parse(name, it->second);
  }

  bool flag(const std::string& name, bool fallback) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return fallback;
    const std::string& v = it->second;
    if (v == "true" || v == "1" || v == "yes") return true;
    if (v == "false" || v == "0" || v == "no") return false;
    fail_usage(optimizer_ + " setting " + name + "=" + v + " is not a boolean",
               "write " + name + "=true or " + name + "=false");
  }

  std::pair<double, double> pair(const std::string& name,
                                 std::pair<double, double> fallback) const {
    auto it = opt_.find(name);
    if (it == opt_.end()) return fallback;
    auto comma = it->second.find(',');
    if (comma == std::string::npos)
      fail_usage(optimizer_ + " setting " + name + "=" + it->second + " needs two values",
                 "write " + name + "=0.9,0.999");
    return {parse(name, it->second.substr(0, comma)), parse(name, it->second.substr(comma + 1))};
  }

 private:
  double parse(const std::string& name, const std::string& text) const {
    size_t pos = 0;
    double v = 0;
    try {
      v = std::stod(text, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos != text.size() || !std::isfinite(v))
      fail_usage(optimizer_ + " setting " + name + "=" + text + " is not a number",
                 "write a number, e.g. " + name + "=0.9");
    return v;
  }

  std::string optimizer_;
  const OptSettings& opt_;
};

void check_range(bool ok, const std::string& what) {
  check_usage(ok, "invalid optimizer setting: " + what,
              "see `gradscope list` for each optimizer's settings");
}

const std::vector<std::string> kSgdKeys = {"momentum", "dampening", "nesterov"};
const std::vector<std::string> kAdamKeys = {"betas", "eps", "amsgrad"};
const std::vector<std::string> kAdagradKeys = {"lr_decay", "eps", "initial_accumulator_value"};

std::unique_ptr<torch::optim::Optimizer> make_sgd(std::vector<torch::Tensor> params, double lr,
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
  return std::make_unique<torch::optim::SGD>(std::move(params), options);
}

std::unique_ptr<torch::optim::Optimizer> make_adam(std::vector<torch::Tensor> params, double lr,
                                                   double weight_decay, const OptSettings& opt) {
  OptReader r("adam", opt, kAdamKeys);
  const auto betas = r.pair("betas", {0.9, 0.999});
  const double eps = r.number("eps", 1e-8);
  check_range(betas.first >= 0 && betas.first < 1 && betas.second >= 0 && betas.second < 1,
              fmt::format("adam betas={},{} must lie in [0, 1)", betas.first, betas.second));
  check_range(eps >= 0, fmt::format("adam eps={} must be >= 0", eps));
  auto options = torch::optim::AdamOptions(lr)
                     .betas(std::make_tuple(betas.first, betas.second))
                     .eps(eps)
                     .amsgrad(r.flag("amsgrad", false))
                     .weight_decay(weight_decay);
  return std::make_unique<torch::optim::Adam>(std::move(params), options);
}

std::unique_ptr<torch::optim::Optimizer> make_adagrad(std::vector<torch::Tensor> params, double lr,
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
  return std::make_unique<torch::optim::Adagrad>(std::move(params), options);
}

}  // namespace

const Registry<OptimizerEntry>& optimizer_registry() {
  static const Registry<OptimizerEntry> registry = [] {
    Registry<OptimizerEntry> r("optimizer");
    r.add("sgd", "stochastic gradient descent (momentum, nesterov)", {make_sgd, 1e-2, kSgdKeys});
    r.add("adam", "Adam (Kingma & Ba 2015)", {make_adam, 1e-3, kAdamKeys});
    r.add("adagrad", "Adagrad (Duchi et al. 2011)", {make_adagrad, 1e-2, kAdagradKeys});
    return r;
  }();
  return registry;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt) {
  const auto& entry = optimizer_registry().get(name);
  check_usage(std::isfinite(lr) && lr > 0, fmt::format("learning rate {} must be > 0", lr),
              "pass --lr with a positive value, e.g. --lr 1e-3");
  check_usage(std::isfinite(weight_decay) && weight_decay >= 0,
              fmt::format("weight decay {} must be >= 0", weight_decay),
              "pass --weight-decay 0 for none");
  return entry.make(std::move(params), lr, weight_decay, opt);
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
