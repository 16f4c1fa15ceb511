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
  double default_lr;              // used when --lr is not given
  std::vector<std::string> keys;  // the --opt names it accepts
};

const Registry<OptimizerEntry>& optimizer_registry();

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt);

// The learning rate of every parameter group (for schedules).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// Parses "NAME=VALUE" into settings; a usage error when it is malformed.
void parse_opt_setting(const std::string& text, OptSettings& into);

}  // namespace gradscope
