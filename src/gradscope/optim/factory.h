// The optimizer registry. Each entry builds a torch::optim::Optimizer from the parameters,
// the learning rate, weight decay and `--opt NAME=VALUE` settings under PyTorch's names.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/registry.h"

namespace gradscope {

using OptSettings = std::map<std::string, std::string>;

struct OptimizerEntry {
  // Builds the optimizer; throws a usage error naming a bad or unknown setting.
  std::unique_ptr<torch::optim::Optimizer> (*make)(std::vector<torch::Tensor> params, double lr,
                                                   double weight_decay, const OptSettings& opt);
  double default_lr;              // used when --lr is not given and lr_by_model has no entry
  std::vector<std::string> keys;  // the --opt names it accepts
  // Whether step() evaluates the loss itself through a closure (a line search): the training
  // loop then hands it a closure that computes the step's gradients instead of computing them
  // first (as LBFGS is driven in PyTorch).
  bool steps_with_closure = false;
  // Default learning rates of model families (registry names) where default_lr is not right.
  std::map<std::string, double> lr_by_model = {};
};

const Registry<OptimizerEntry>& optimizer_registry();

// The learning rate `optimizer` uses on `model` when --lr is not given.
double default_lr(const std::string& optimizer, const std::string& model);

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt);

// The learning rate of every parameter group (for schedules).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// Parses "NAME=VALUE" into settings; a usage error when it is malformed.
void parse_opt_setting(const std::string& text, OptSettings& into);

}  // namespace gradscope
