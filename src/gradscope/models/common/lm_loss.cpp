#include "gradscope/models/common/lm_loss.h"

#include <algorithm>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/version.h>

namespace gradscope {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---------------------------------------------------------------------------------------
// Autocast
//
// Autocast is a thread-local dispatch key, and a custom Function does not leave it (probed on
// the CPU under the trainer's bf16 scope): Function::apply runs forward with grad mode off and
// autocast on, so an mm there returns bfloat16, and the
// engine runs backward with the same thread-local state, autocast on again. Rather than rely
// on which ops autocast would cast there (its lists differ by device and version), the
// Function reads autocast's state once in forward, casts its inputs itself, and runs every
// inner op with the autocast keys excluded.

bool lm_loss_autocast_on(c10::DeviceType t) { return at::autocast::is_autocast_enabled(t); }
at::ScalarType lm_loss_autocast_dtype(c10::DeviceType t) {
  return at::autocast::get_autocast_dtype(t);
}

// The dtype of the head's matmuls: what autocast makes of F::linear on a float32 input (it
// leaves float64 alone), else the input's own.
at::ScalarType lm_loss_matmul_dtype(const torch::Tensor& hidden) {
  const auto type = hidden.device().type();
  if (hidden.scalar_type() == at::kFloat && lm_loss_autocast_on(type))
    return lm_loss_autocast_dtype(type);
  return hidden.scalar_type();
}

// ---------------------------------------------------------------------------------------
// The Function

// Positions of forward's arguments (hidden, weight, bias, targets, chunk_rows, ignore_index,
// has_bias, with_grad), for backward's result.
constexpr size_t kLmLossArgHidden = 0, kLmLossArgWeight = 1, kLmLossArgBias = 2, kLmLossArgs = 8;

// The keys under which forward leaves the gradients it computed for backward.
constexpr const char* kLmLossGradKeys[] = {"grad_hidden", "grad_weight", "grad_bias"};

class ChunkedCrossEntropyFunction : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
 public:
  // hidden (N, C), weight (V, C), bias (V) (an empty tensor when has_bias is false),
  // targets (N) -> () summed loss. Autograd is off here (Function::apply); with_grad says
  // whether it was on at the call, when the gradients of the inputs that require one are
  // computed here, per chunk, while the chunk's logits exist, and kept for backward.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& targets, int64_t chunk_rows,
                               int64_t ignore_index, bool has_bias, bool with_grad) {
    const at::ScalarType mm = lm_loss_matmul_dtype(hidden);
    const at::ScalarType sm = mm == at::kDouble ? at::kDouble : at::kFloat;  // softmax dtype
    const bool need_hidden = with_grad && hidden.requires_grad();
    const bool need_weight = with_grad && weight.requires_grad();
    const bool need_bias = with_grad && has_bias && bias.requires_grad();
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t N = hidden.size(0);
    const torch::Tensor w = weight.to(mm);                             // (V, C)
    const torch::Tensor b = has_bias ? bias.to(mm) : torch::Tensor();  // (V)
    const auto options = hidden.options().dtype(sm);
    torch::Tensor loss = torch::zeros({}, options);
    torch::Tensor grad_hidden = need_hidden
                                    ? torch::empty_like(hidden, at::MemoryFormat::Contiguous)
                                    : torch::Tensor();  // (N, C)
    // grad_weight is summed as (V, C), grad_logits^T hidden, the product the full path's
    // matmul backward takes for a weight read transposed.
    torch::Tensor grad_weight = need_weight ? torch::zeros_like(weight) : torch::Tensor();
    torch::Tensor grad_bias = need_bias ? torch::zeros_like(bias) : torch::Tensor();  // (V)
    for (int64_t start = 0; start < N; start += chunk_rows) {
      const int64_t n = std::min(chunk_rows, N - start);
      const torch::Tensor t = targets.narrow(0, start, n);                            // (n)
      const torch::Tensor valid = t.ne(ignore_index);                                 // (n)
      const torch::Tensor safe = t.masked_fill(valid.logical_not(), 0).unsqueeze(1);  // (n, 1)
      const torch::Tensor h = hidden.narrow(0, start, n).to(mm);                      // (n, C)
      // The logits in the matmul dtype, then in the softmax dtype, as autocast runs F::linear
      // and then cross_entropy. log_softmax's own arithmetic: x - max, then minus the log of
      // the sum of exponentials.
      torch::Tensor x = at::linear(h, w, b).to(sm);                     // (n, V)
      const torch::Tensor m = std::get<0>(x.max(1, /*keepdim=*/true));  // (n, 1)
      x.sub_(m);
      const torch::Tensor target_shifted = x.gather(1, safe).squeeze(1);  // (n)
      const torch::Tensor sum = x.exp_().sum(1);                          // (n)
      const torch::Tensor logsum = sum.log();                             // (n)
      // -log_softmax at the target: logsum - (x_t - max); 0 where the target is ignored.
      loss.add_((logsum - target_shifted).masked_fill_(valid.logical_not(), 0).sum());
      if (!need_hidden && !need_weight && !need_bias) continue;
      // log_softmax's backward after nll_loss's, for an incoming gradient of 1: softmax
      // everywhere, softmax - 1 at the target, 0 on a row whose target is ignored.
      const torch::Tensor keep = valid.to(sm);           // (n)
      x.mul_((keep / sum).unsqueeze(1));                 // (n, V)
      x.scatter_add_(1, safe, keep.neg().unsqueeze(1));  // (n, V)
      const torch::Tensor grad_logits = x.to(mm);        // (n, V)
      x = torch::Tensor();
      if (need_hidden) grad_hidden.narrow(0, start, n).copy_(grad_logits.mm(w));  // (n, C)
      if (need_weight) {
        if (mm == grad_weight.scalar_type())
          grad_weight.addmm_(grad_logits.t(), h);  // (V, C)
        else  // each chunk's product rounded to the matmul dtype, then summed
          grad_weight.add_(grad_logits.t().mm(h));
      }
      if (need_bias) grad_bias.add_(grad_logits.sum(0));
    }
    // Kept as plain values rather than saved variables: backward takes them out, so that the
    // engine hands them on without a copy and nothing of them stays with the graph. A graph
    // whose backward never reaches this node frees them when it is destroyed.
    ctx->saved_data[kLmLossGradKeys[0]] = grad_hidden;
    ctx->saved_data[kLmLossGradKeys[1]] = grad_weight;
    ctx->saved_data[kLmLossGradKeys[2]] = grad_bias;
    return loss;
  }

  // The gradients forward computed for an incoming gradient of 1, scaled by the incoming g.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK(ctx->saved_data.count(kLmLossGradKeys[0]) == 1,
                "chunked_cross_entropy: backward ran twice through one loss (retain_graph); its "
                "gradients were computed in forward and handed on the first time");
    // Scaling precomputed gradients has no graph through hidden and W: refused rather than a
    // silently wrong second derivative.
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "chunked_cross_entropy: a backward that builds a graph (create_graph) is not "
                "supported");
    const torch::Tensor& g = grad_outputs[0];  // ()
    variable_list grads(kLmLossArgs);
    const size_t args[] = {kLmLossArgHidden, kLmLossArgWeight, kLmLossArgBias};
    for (size_t i = 0; i < 3; ++i) {
      torch::Tensor grad;
      if (ctx->saved_data[kLmLossGradKeys[i]].isTensor())
        grad = ctx->saved_data[kLmLossGradKeys[i]].toTensor();
      ctx->saved_data.erase(kLmLossGradKeys[i]);
      if (grad.defined() && ctx->needs_input_grad(args[i])) grads[args[i]] = grad.mul_(g);
    }
    return grads;
  }
};

// The gradient cross_entropy_sum's forward leaves in the logits, and the rows' weights in
// backward (1, or 0 where the target is ignored).
constexpr const char* kLogitsGradKey = "grad_logits";
constexpr const char* kLogitsKeepKey = "keep";

class CrossEntropySumFunction : public torch::autograd::Function<CrossEntropySumFunction> {
 public:
  // logits (N, V) float32, contiguous (overwritten), targets (N) -> () summed loss.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t ignore_index,
                               bool with_grad) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t N = logits.size(0), V = logits.size(1);
    const torch::Tensor valid = targets.ne(ignore_index);                                 // (N)
    const torch::Tensor safe = targets.masked_fill(valid.logical_not(), 0).unsqueeze(1);  // (N, 1)
    const torch::Tensor target_logit = logits.gather(1, safe);                            // (N, 1)
    torch::Tensor max = torch::empty({N, 1}, logits.options());                           // (N, 1)
    torch::Tensor sum = torch::empty({N, 1}, logits.options());                           // (N, 1)
    // log_softmax's arithmetic per row (x - max, exponentials, their sum), then the softmax,
    // on blocks of rows small enough to stay in cache between those passes.
    const int64_t row_bytes = std::max<int64_t>(V, 1) * static_cast<int64_t>(sizeof(float));
    const int64_t rows = logits.is_cpu() ? std::max<int64_t>(1, kLogitsBlockBytes / row_bytes)
                                         : std::max<int64_t>(N, 1);
    for (int64_t start = 0; start < N; start += rows) {
      const int64_t n = std::min(rows, N - start);
      torch::Tensor x = logits.narrow(0, start, n);  // (n, V), a view
      torch::Tensor m = max.narrow(0, start, n);     // (n, 1)
      torch::Tensor s = sum.narrow(0, start, n);     // (n, 1)
      at::amax_out(m, x, {1}, /*keepdim=*/true);
      x.sub_(m).exp_();
      at::sum_out(s, x, {1}, /*keepdim=*/true);
      if (with_grad) x.div_(s);  // softmax
    }
    // -log_softmax at the target: log(sum) - (x_t - max); 0 where the target is ignored.
    torch::Tensor loss = (sum.log_() - (target_logit - max)).squeeze(1);  // (N)
    loss = loss.masked_fill_(valid.logical_not(), 0).sum();               // ()
    if (with_grad) {
      // log_softmax's backward after nll_loss's for an incoming gradient of 1: softmax - 1 at
      // the target (ignored rows are zeroed in backward).
      logits.scatter_add_(1, safe, torch::full({N, 1}, -1.0, logits.options()));
      // Plain values rather than saved variables: backward takes them out, so that the
      // engine hands the gradient on without a copy.
      ctx->saved_data[kLogitsGradKey] = logits;
      ctx->saved_data[kLogitsKeepKey] = valid.to(logits.scalar_type()).unsqueeze(1);  // (N, 1)
    }
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK(ctx->saved_data.count(kLogitsGradKey) == 1,
                "cross_entropy_sum: backward ran twice through one loss (retain_graph); its "
                "gradient was made in forward and handed on the first time");
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "cross_entropy_sum: a backward that builds a graph (create_graph) is not "
                "supported");
    torch::Tensor grad = ctx->saved_data[kLogitsGradKey].toTensor();  // (N, V)
    const torch::Tensor keep = ctx->saved_data[kLogitsKeepKey].toTensor();
    ctx->saved_data.erase(kLogitsGradKey);
    ctx->saved_data.erase(kLogitsKeepKey);
    grad.mul_(keep * grad_outputs[0]);
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The head's product with its weight's gradient made as (V, C) (head_logits).
class HeadLogitsFunction : public torch::autograd::Function<HeadLogitsFunction> {
 public:
  // hidden (N, C), weight (V, C), bias (V) or an empty tensor -> (N, V). Backward makes the
  // weight's gradient as the (V, C) product, held by nothing else (head_logits).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               bool has_bias) {
    // As autograd's linear: the input for the weight's gradient, the weight for the input's.
    ctx->save_for_backward({weight.requires_grad() ? hidden : torch::Tensor(),
                            hidden.requires_grad() ? weight : torch::Tensor()});
    ctx->saved_data["has_bias"] = has_bias;
    return has_bias ? at::addmm(bias, hidden, weight.t()) : at::mm(hidden, weight.t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& hidden = saved[0];  // (N, C)
    const torch::Tensor& weight = saved[1];  // (V, C)
    const torch::Tensor g = grad_outputs[0].contiguous();  // (N, V)
    variable_list grads(4);
    if (ctx->needs_input_grad(0)) grads[0] = g.mm(weight);  // (N, C)
    if (ctx->needs_input_grad(1)) grads[1] = g.t().mm(hidden);  // (V, C)
    if (ctx->needs_input_grad(2) && ctx->saved_data["has_bias"].toBool())
      grads[2] = g.sum(0);  // (V)
    return grads;
  }
};

}  // namespace

torch::Tensor head_logits(const torch::Tensor& hidden, const torch::Tensor& weight,
                          const torch::Tensor& bias) {
  TORCH_CHECK(hidden.dim() >= 1 && weight.dim() == 2 && hidden.size(-1) == weight.size(1),
              "head_logits: hidden (..., C) and weight (V, C) expected, got ", hidden.sizes(),
              " and ", weight.sizes());
  const auto type = hidden.device().type();
  const bool own = (hidden.scalar_type() == torch::kFloat ||
                    hidden.scalar_type() == torch::kDouble) &&
                   weight.scalar_type() == hidden.scalar_type() &&
                   (!bias.defined() || bias.scalar_type() == hidden.scalar_type()) &&
                   !lm_loss_autocast_on(type);
  if (!own) return torch::nn::functional::linear(hidden, weight, bias);
  const bool has_bias = bias.defined();
  auto sizes = hidden.sizes().vec();
  sizes.back() = weight.size(0);
  const torch::Tensor flat = hidden.reshape({-1, hidden.size(-1)});  // (N, C)
  // Function::apply takes only defined tensors: an absent bias travels as an empty one.
  const torch::Tensor b = has_bias ? bias : torch::empty({0}, weight.options());
  return HeadLogitsFunction::apply(flat, weight, b, has_bias).view(sizes);  // (..., V)
}

torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets,
                                int64_t ignore_index) {
  TORCH_CHECK(logits.dim() == 2, "cross_entropy_sum: logits (N, V) expected, got ",
              logits.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0) &&
                  targets.scalar_type() == torch::kLong,
              "cross_entropy_sum: targets must be (", logits.size(0), ") int64, got ",
              targets.sizes(), " ", targets.scalar_type());
  if (logits.scalar_type() != torch::kFloat || !logits.is_contiguous()) {
    // Lower precisions take the softmax in float32, as autocast runs cross_entropy; float64
    // stays float64.
    const torch::Tensor wide =
        logits.scalar_type() == torch::kDouble ? logits : logits.to(torch::kFloat);
    return torch::nn::functional::cross_entropy(
        wide, targets,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(
            ignore_index));
  }
  // A leaf's values would be overwritten under its owner's feet (its gradient would be right).
  TORCH_CHECK(!(logits.is_leaf() && logits.requires_grad()),
              "cross_entropy_sum: the logits are overwritten with their gradient; pass a product "
              "(the head's output), not a leaf that requires a gradient");
  const bool with_grad = torch::GradMode::is_enabled() && logits.requires_grad();
  return CrossEntropySumFunction::apply(logits, targets, ignore_index, with_grad);
}

torch::Tensor chunked_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& bias, const torch::Tensor& targets,
                                    int64_t chunk_rows, int64_t ignore_index) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "chunked_cross_entropy: hidden (N, C) and weight (V, C) expected, got ",
              hidden.sizes(), " and ", weight.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0) &&
                  targets.scalar_type() == torch::kLong,
              "chunked_cross_entropy: targets must be (", hidden.size(0), ") int64, got ",
              targets.sizes(), " ", targets.scalar_type());
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
              "chunked_cross_entropy: bias must be (", weight.size(0), "), got ", bias.sizes());
  TORCH_CHECK(chunk_rows >= 1, "chunked_cross_entropy: chunk_rows must be at least 1, got ",
              chunk_rows);
  const bool has_bias = bias.defined();
  // Function::apply takes only defined tensors: an absent bias travels as an empty one.
  const torch::Tensor b = has_bias ? bias : torch::empty({0}, weight.options());
  // Gradients are computed in forward only where autograd will ask for them.
  const bool with_grad = torch::GradMode::is_enabled() &&
                         (hidden.requires_grad() || weight.requires_grad() || b.requires_grad());
  return ChunkedCrossEntropyFunction::apply(hidden, weight, b, targets, chunk_rows, ignore_index,
                                            has_bias, with_grad);
}

}  // namespace gradscope
