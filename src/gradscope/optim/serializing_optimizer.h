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
  using torch::optim::Optimizer::Optimizer;

  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<ParamState, Options>(archive, *this);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<ParamState, Options>(archive, *this);
  }
};

}  // namespace gradscope
