// The optimizer registry. Each entry builds a torch::optim::Optimizer from the parameters
// (with their names in the model, where known), the learning rate, weight decay and
// `--opt NAME=VALUE` settings under PyTorch's names.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/registry.h"
#include "gradscope/optim/opt_reader.h"

namespace gradscope {

// What an optimizer may know of its parameters besides the tensors, for those that treat
// parameters by their role (galore and muon pick the blocks' matrices by name; adam-mini
// partitions attention projections by head). Each vector is empty when unknown, or holds one
// entry per parameter.
struct ParamInfo {
  // names[i]: the name of params[i] in the model, as torch::nn::Module::named_parameters()
  // gives it (e.g. "layers.0.self_attn.q_proj.weight").
  std::vector<std::string> names;
  // head_sizes[i]: for the weight or bias of an attention's query, key or value projection,
  // the rows per head (HS), so that its rows split into heads of HS rows each; 0 for others.
  std::vector<int64_t> head_sizes;
};

struct OptimizerEntry {
  // Builds the optimizer; throws a usage error naming a bad or unknown setting.
  std::unique_ptr<torch::optim::Optimizer> (*make)(std::vector<torch::Tensor> params,
                                                   const ParamInfo& info, double lr,
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

// An optimizer over parameters without names. galore, which picks the matrices it projects
// by name, refuses them (a runtime error): use the overload below.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt);

// An optimizer over named parameters: names[i] is the name of params[i] in the model, as
// torch::nn::Module::named_parameters() gives it (e.g. "layers.0.self_attn.q_proj.weight"),
// or `names` is empty when they are unknown. Optimizers that treat parameters by their role
// read them: galore projects the blocks' attention and MLP matrices only (galore.h).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        const std::vector<std::string>& names,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt);

// An optimizer over parameters with their names and attention head sizes (ParamInfo).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        const ParamInfo& info, double lr,
                                                        double weight_decay,
                                                        const OptSettings& opt);

// The learning rate of every parameter group (for schedules).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// Parses "NAME=VALUE" into settings; a usage error when it is malformed.
void parse_opt_setting(const std::string& text, OptSettings& into);

}  // namespace gradscope
