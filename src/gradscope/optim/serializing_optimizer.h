// The base of gradscope's own optimizers: a torch::optim::Optimizer whose save and load write
// and read its options and per-parameter states. LibTorch's base Optimizer::save and load do
// nothing, so without this torch::save would write none of the state and torch::load would
// silently restore nothing.
#pragma once

#include <torch/optim/serialize.h>
#include <torch/torch.h>

namespace gradscope {

template <typename ParamState, typename Options>
class SerializingOptimizer : public torch::optim::Optimizer {
 public:
  // LibTorch 2.x starts each group's options from the optimizer's defaults and merges the
  // group's own in only when they are of one of torch's option types (SGDOptions, ...): a
  // group of any other type gets the defaults. Here a group keeps its own options whole
  // (Adam-mini's partition, Muon's use_muon, GaLore's projection, a per-group rate).
  SerializingOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                       std::unique_ptr<torch::optim::OptimizerOptions> defaults)
      : torch::optim::Optimizer(groups, std::move(defaults)) {
    for (size_t i = 0; i < groups.size() && i < param_groups_.size(); ++i)
      if (groups[i].has_options()) param_groups_[i].set_options(groups[i].options().clone());
  }
  SerializingOptimizer(std::vector<torch::Tensor> params,
                       std::unique_ptr<torch::optim::OptimizerOptions> defaults)
      : torch::optim::Optimizer(std::move(params), std::move(defaults)) {}

  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<ParamState, Options>(archive, *this);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<ParamState, Options>(archive, *this);
  }
};

}  // namespace gradscope
