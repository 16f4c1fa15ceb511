// bfloat16 autocast (--dtype bf16) over a scope.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace gradscope {

// bfloat16 autocast over a scope, as torch.autocast does it: ops on the autocast lists
// (matrix multiplications, linear layers) run in bfloat16, numerically sensitive ones
// (softmax, norms, losses) in float32; the parameters stay float32 and the bfloat16 copies of
// weights are cached within the outermost scope and dropped when it ends. A checkpointed
// block recomputed in backward runs inside the same scope, so it casts as its forward did.
class AutocastScope {
 public:
  AutocastScope(const torch::Device& device, bool enabled)
      : enabled_(enabled), type_(device.type()) {
    if (!enabled_) return;
    previous_enabled_ = is_enabled(type_);
    previous_dtype_ = dtype(type_);
    set(type_, true, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(type_, previous_enabled_, previous_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  static bool is_enabled(c10::DeviceType t) { return at::autocast::is_autocast_enabled(t); }
  static at::ScalarType dtype(c10::DeviceType t) { return at::autocast::get_autocast_dtype(t); }
  static void set(c10::DeviceType t, bool on, at::ScalarType type) {
    at::autocast::set_autocast_dtype(t, type);
    at::autocast::set_autocast_enabled(t, on);
  }
  bool enabled_;
  c10::DeviceType type_;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

}  // namespace gradscope
