#include "gradscope/optim/state_bytes.h"

#include <algorithm>
#include <typeinfo>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"

namespace gradscope {

namespace {

// Appends the tensors of one of LibTorch's built-in param states; false if the type is not
// one of them.
bool append_builtin_state(const torch::optim::OptimizerParamState& state,
                          std::vector<torch::Tensor>& out) {
  namespace optim = torch::optim;
  if (const auto* s = dynamic_cast<const optim::SGDParamState*>(&state)) {
    out.push_back(s->momentum_buffer());
  } else if (const auto* s = dynamic_cast<const optim::AdamParamState*>(&state)) {
    out.insert(out.end(), {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()});
  } else if (const auto* s = dynamic_cast<const optim::AdamWParamState*>(&state)) {
    out.insert(out.end(), {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()});
  } else if (const auto* s = dynamic_cast<const optim::AdagradParamState*>(&state)) {
    out.push_back(s->sum());
  } else if (const auto* s = dynamic_cast<const optim::RMSpropParamState*>(&state)) {
    out.insert(out.end(), {s->square_avg(), s->momentum_buffer(), s->grad_avg()});
  } else if (const auto* s = dynamic_cast<const optim::LBFGSParamState*>(&state)) {
    out.insert(out.end(), {s->d(), s->H_diag(), s->prev_flat_grad()});
    out.insert(out.end(), s->old_dirs().begin(), s->old_dirs().end());
    out.insert(out.end(), s->old_stps().begin(), s->old_stps().end());
    out.insert(out.end(), s->ro().begin(), s->ro().end());
    if (s->al()) out.insert(out.end(), s->al()->begin(), s->al()->end());
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::vector<torch::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> tensors;
  if (const auto* own = dynamic_cast<const StateBytes*>(&optimizer)) {
    tensors = own->state_tensors();
  } else {
    for (const auto& entry : optimizer.state()) {
      const torch::optim::OptimizerParamState* state = entry.second.get();
      if (state == nullptr) continue;
      if (const auto* custom = dynamic_cast<const StateBytes*>(state)) {
        const auto more = custom->state_tensors();
        tensors.insert(tensors.end(), more.begin(), more.end());
      } else if (!append_builtin_state(*state, tensors)) {
        fail_runtime(
            fmt::format("cannot count the optimizer state of type {}", typeid(*state).name()),
            "make the optimizer's param state implement gradscope::StateBytes "
            "(optim/state_bytes.h)");
      }
    }
  }
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [](const torch::Tensor& t) { return !t.defined(); }),
                tensors.end());
  return tensors;
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  return tensors_bytes(optimizer_state_tensors(optimizer));
}

}  // namespace gradscope
