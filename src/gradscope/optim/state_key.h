// Helpers shared by gradscope's optimizers.
#pragma once

#include <sstream>
#include <string>
#include <type_traits>

#include <torch/torch.h>

namespace gradscope {

// The key under which torch::optim::Optimizer keeps a parameter's state: LibTorch 1.13 uses
// the TensorImpl address printed as a string, 2.x the address itself. Both forms must match
// what torch::optim::serialize writes and looks up, or a loaded state would not be found.
template <typename Optimizer = torch::optim::Optimizer>
auto param_state_key(const torch::Tensor& p) {
  using Key = typename std::decay_t<decltype(std::declval<Optimizer&>().state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;  // what c10::guts::to_string does
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace gradscope
