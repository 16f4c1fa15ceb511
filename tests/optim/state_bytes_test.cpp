#include "gradscope/optim/state_bytes.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

// A small model's parameters and one optimizer step on a fixed problem.
struct Problem {
  torch::nn::Linear linear{torch::nn::LinearOptions(8, 3)};
  std::vector<torch::Tensor> params() { return linear->parameters(); }
  int64_t params_bytes() { return tensors_bytes(params()); }
  void step(torch::optim::Optimizer& optimizer) {
    optimizer.zero_grad();
    linear(torch::ones({4, 8})).pow(2).sum().backward();
    optimizer.step();
  }
};

TEST(OptimizerStateBytes, BuiltinOptimizers) {
  {
    Problem p;
    torch::optim::Adam adam(p.params(), torch::optim::AdamOptions(1e-3));
    EXPECT_EQ(optimizer_state_bytes(adam), 0);  // state is created lazily
    p.step(adam);
    EXPECT_EQ(optimizer_state_bytes(adam), 2 * p.params_bytes());
  }
  {
    Problem p;
    torch::optim::Adam amsgrad(p.params(), torch::optim::AdamOptions(1e-3).amsgrad(true));
    p.step(amsgrad);
    EXPECT_EQ(optimizer_state_bytes(amsgrad), 3 * p.params_bytes());
  }
  {
    Problem p;
    torch::optim::AdamW adamw(p.params(), torch::optim::AdamWOptions(1e-3));
    p.step(adamw);
    EXPECT_EQ(optimizer_state_bytes(adamw), 2 * p.params_bytes());
  }
  {
    Problem p;
    // Adagrad creates its `sum` state in the constructor.
    torch::optim::Adagrad adagrad(p.params(), torch::optim::AdagradOptions(1e-2));
    p.step(adagrad);
    EXPECT_EQ(optimizer_state_bytes(adagrad), p.params_bytes());
  }
  {
    Problem p;
    torch::optim::SGD plain(p.params(), torch::optim::SGDOptions(0.1));
    p.step(plain);
    EXPECT_EQ(optimizer_state_bytes(plain), 0);
  }
  {
    Problem p;
    torch::optim::SGD momentum(p.params(), torch::optim::SGDOptions(0.1).momentum(0.9));
    p.step(momentum);
    EXPECT_EQ(optimizer_state_bytes(momentum), p.params_bytes());
  }
  {
    Problem p;
    torch::optim::RMSprop centered(p.params(),
                                   torch::optim::RMSpropOptions(1e-2).centered(true).momentum(0.9));
    p.step(centered);
    EXPECT_EQ(optimizer_state_bytes(centered), 3 * p.params_bytes());
  }
}

// An optimizer of the kind gradscope adds: its param state reports its own tensors.
struct CountedState : public torch::optim::OptimizerCloneableParamState<CountedState>,
                      public StateBytes {
  torch::Tensor buffer;
  std::vector<torch::Tensor> state_tensors() const override { return {buffer}; }
};
struct UncountedState : public torch::optim::OptimizerCloneableParamState<UncountedState> {
  torch::Tensor buffer;
};


class StatefulOptimizer : public torch::optim::Optimizer {
 public:
  StatefulOptimizer(std::vector<torch::Tensor> params, bool counted)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<torch::optim::SGDOptions>(0.1)) {
    for (const auto& p : param_groups_[0].params()) {
      const auto key = param_state_key(p);
      if (counted) {
        auto s = std::make_unique<CountedState>();
        s->buffer = torch::zeros_like(p);
        state_[key] = std::move(s);
      } else {
        auto s = std::make_unique<UncountedState>();
        s->buffer = torch::zeros_like(p);
        state_[key] = std::move(s);
      }
    }
  }
  torch::Tensor step(LossClosure closure = nullptr) override { return {}; }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
};

TEST(OptimizerStateBytes, CustomStatesImplementStateBytes) {
  Problem p;
  StatefulOptimizer counted(p.params(), /*counted=*/true);
  EXPECT_EQ(optimizer_state_bytes(counted), p.params_bytes());
  StatefulOptimizer uncounted(p.params(), /*counted=*/false);
  try {
    optimizer_state_bytes(uncounted);
    FAIL() << "an unknown state type must not count as 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(e.hint().find("StateBytes"), std::string::npos);
  }
}

}  // namespace
}  // namespace gradscope
