#include "gradscope/strategy/checkpoint.h"

#include <optional>
#include <utility>

#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>

#include "gradscope/core/error.h"
#include "gradscope/strategy/rng_state.h"

namespace gradscope {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---------------------------------------------------------------------------------------
// The autocast cache

// Turns autocast's cache of low-precision weight copies off for its lifetime and puts back
// what it found. Under autocast a weight's bfloat16 copy is cached for the life of the
// outermost autocast scope, and the checkpointed forward runs without a graph inside the very
// scope its recompute in backward runs in: a weight first cast there would be cached with no
// autograd history, the recompute would reuse that copy, and the weight would get no
// gradient. With the cache off the forward's casts are its own and the recompute casts (and
// caches) with the graph recorded. (The cache's rules differ by version and device, so nothing
// here rests on them.) A nested
// autocast scope would not do: only the outermost one clears the cache, and backward runs
// inside the trainer's.
class AutocastCacheOff {
 public:
  AutocastCacheOff() : found_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(found_); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool found_;
};

// ---------------------------------------------------------------------------------------
// The checkpoint function

// What the backward needs besides the saved input; kept in the autograd context.
struct CheckpointState : torch::CustomClassHolder {
  SubLayerFn fn;            // the wrapped function (a block with its context, or a branch)
  bool restore_rng = true;  // whether `rng` was captured and is set for the recompute
  bool input_grad = true;   // whether the caller's input requires grad
  bool input_bf16 = false;  // whether the input is kept rounded to bfloat16 (--saved-input)
  c10::ScalarType input_dtype = c10::ScalarType::Float;  // the input's dtype as computed
  RngState rng;             // generator states before the forward
  std::shared_ptr<CheckpointCounters> counters;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // Autograd is off here (Function::apply runs forward without recording).
  // x (B, T, C) -> (B, T, C)
  static torch::Tensor forward(AutogradContext* actx, const torch::Tensor& x,
                               c10::intrusive_ptr<CheckpointState> state) {
    if (state->restore_rng) state->rng = RngState::capture(x.device());
    torch::Tensor y;
    {
      torch::NoGradGuard no_grad;
      const AutocastCacheOff no_cache;  // the recompute must not see casts made without a graph
      y = state->fn(x);
    }
    // Rounded to bfloat16, the kept input is a new tensor that only the context holds. An
    // input that needs no gradient (a frozen embedding's output under LoRA) arrives as a leaf
    // made for this Function, which the graph holds until backward anyway: it is kept as is.
    state->input_dtype = x.scalar_type();
    const bool round = state->input_bf16 && state->input_grad && x.is_floating_point() &&
                       x.element_size() > 2;
    actx->save_for_backward({round ? x.detach().to(torch::kBFloat16) : x});
    actx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return y;
  }

  // Recomputes the block with the graph recorded, back-propagates grad_y through it (the
  // block's parameters accumulate their gradients there) and returns the input's gradient.
  static variable_list backward(AutogradContext* actx, variable_list grad_outputs) {
    auto state =
        c10::static_intrusive_pointer_cast<CheckpointState>(actx->saved_data["state"].toCapsule());
    const variable_list saved = actx->get_saved_variables();
    const bool input_grad = state->input_grad && actx->needs_input_grad(0);
    torch::Tensor x = saved[0].detach();  // a leaf sharing the saved input's storage
    // A rounded input is widened back: the recompute runs in the forward's dtypes.
    if (x.scalar_type() != state->input_dtype) x = x.to(state->input_dtype);
    x.requires_grad_(input_grad);
    // What the recompute and its backward allocate is labelled as such (core/memory_scope.h).
    const MemoryScope recompute(std::string("recompute"));
    torch::Tensor y;
    {
      std::optional<RngScope> rng;
      if (state->restore_rng) rng.emplace(state->rng, x.device());
      torch::AutoGradMode grad_mode(true);
      y = state->fn(x);
    }  // the generators are back where backward found them
    if (state->counters) ++state->counters->recomputed;
    if (y.requires_grad()) torch::autograd::backward({y}, {grad_outputs[0]});
    // One entry per forward argument: x, then the state (no gradient).
    // x.grad() keeps the layout of the first gradient that reached x (AccumulateGrad adds the
    // later ones in place), which can be transposed, while plain backward sums the same terms
    // into a fresh contiguous tensor. The values agree; the layout decides the summation order
    // of the reductions upstream (a bias gradient sums over batch and positions), so it is
    // made contiguous to keep checkpointing bitwise exact.
    return {input_grad ? x.grad().contiguous() : torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpoint_block(Block& block, const torch::Tensor& x, const BlockContext& ctx,
                               bool restore_rng,
                               const std::shared_ptr<CheckpointCounters>& counters,
                               Dtype saved_input) {
  Block* b = &block;
  return checkpoint_function([b, ctx](const torch::Tensor& in) { return b->forward(in, ctx); }, x,
                             restore_rng, counters, saved_input);
}

torch::Tensor checkpoint_function(const SubLayerFn& fn, const torch::Tensor& x, bool restore_rng,
                                  const std::shared_ptr<CheckpointCounters>& counters,
                                  Dtype saved_input) {
  if (!torch::GradMode::is_enabled()) {
    if (counters) ++counters->plain;
    return fn(x);
  }
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->restore_rng = restore_rng;
  state->input_grad = x.requires_grad();
  state->input_bf16 = saved_input == Dtype::kBf16;
  state->counters = counters;
  if (counters) ++counters->checkpointed;
  // Autograd records a Function only if one of its inputs requires grad; without that the
  // block's parameters would silently get no gradient.
  const torch::Tensor input = x.requires_grad() ? x : x.detach().requires_grad_(true);
  return CheckpointFunction::apply(input, std::move(state));
}

void check_checkpoint_options(const CheckpointOptions& options) {
  check_usage(options.every >= 1,
              "--checkpoint-every " + std::to_string(options.every) + " must be at least 1",
              "pass 1 to checkpoint every block, k to checkpoint every k-th block");
  check_usage(options.policy != Recompute::kNone,
              "a checkpoint runner needs a policy that recomputes something",
              "use --recompute full, attention or mlp");
}

CheckpointOptions checkpoint_options(const StepPlan& plan) {
  CheckpointOptions options;
  options.every = plan.recompute_every;
  options.policy = plan.recompute;
  options.saved_input = plan.saved_input;
  return options;
}

CheckpointRunner::CheckpointRunner(const std::vector<std::shared_ptr<Block>>& blocks,
                                   CheckpointOptions options)
    : options_(options), counters_(std::make_shared<CheckpointCounters>()) {
  check_checkpoint_options(options_);
  const bool selective = options_.policy != Recompute::kFull;
  const SubLayer target = options_.policy == Recompute::kAttention
                              ? SubLayer::kAttention
                              : SubLayer::kMlp;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!wraps(static_cast<int64_t>(i))) continue;
    wrapped_.insert(blocks[i].get());
    if (!selective) continue;
    check_usage(blocks[i]->exposes_sublayers(),
                std::string("checkpoint policy '") + recompute_name(options_.policy) +
                    "' needs blocks that expose their attention and MLP sub-layers; this "
                    "model's do not",
                "use --recompute full");
    // The sub-layer runner holds the counters, not the runner: it may outlive it.
    blocks[i]->set_sublayer_runner(
        [target, restore = options_.restore_rng, counters = counters_,
         saved = options_.saved_input](SubLayer which, const SubLayerFn& fn,
                                       const torch::Tensor& x) {
          if (which != target) return fn(x);
          return checkpoint_function(fn, x, restore, counters, saved);
        });
  }
}

torch::Tensor CheckpointRunner::operator()(Block& block, const torch::Tensor& x,
                                           const BlockContext& ctx, const BlockRunner& inner) {
  // A selective policy wraps sub-layers from inside the block (see the constructor).
  if (wrapped_.count(&block) == 0 || options_.policy != Recompute::kFull) {
    ++counters_->plain;
    return inner ? inner(block, x, ctx) : block.forward(x, ctx);
  }
  if (!inner)
    return checkpoint_block(block, x, ctx, options_.restore_rng, counters_, options_.saved_input);
  Block* b = &block;
  return checkpoint_function(
      [b, ctx, inner](const torch::Tensor& in) { return inner(*b, in, ctx); }, x,
      options_.restore_rng, counters_, options_.saved_input);
}

std::shared_ptr<CheckpointRunner> install_checkpointing(Model& model, CheckpointOptions options) {
  auto runner = std::make_shared<CheckpointRunner>(model.blocks(), options);
  // Inside sharding's layer: its gathers have made the block's parameters whole before the
  // forward and again before the recompute in backward.
  model.set_block_runner(RunnerLayer::kRecompute,
                         [runner](Block& block, const torch::Tensor& x, const BlockContext& ctx,
                                  const BlockRunner& inner) {
                           return (*runner)(block, x, ctx, inner);
                         });
  return runner;
}

}  // namespace gradscope
