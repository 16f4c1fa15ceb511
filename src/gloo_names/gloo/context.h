// Stands in for Gloo's header of this name (README.md beside gloo/): the name
// ProcessGroupGloo.hpp holds through std::shared_ptr, and the one member its inline
// setTimeout names. Never defined or called here.
#pragma once
#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
