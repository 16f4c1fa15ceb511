#include "gradscope/models/common/memory_trace.h"

#include <algorithm>
#include <array>
#include <map>
#include <stdexcept>

namespace gradscope {

using Id = MemoryTrace::Id;

Id MemoryTrace::persistent(int64_t bytes) {
  tensors_.push_back({bytes, true, bytes});
  return static_cast<Id>(tensors_.size() - 1);
}

Id MemoryTrace::view(int64_t grad_bytes) {
  tensors_.push_back({0, false, grad_bytes});
  return static_cast<Id>(tensors_.size() - 1);
}

Id MemoryTrace::alloc(int64_t bytes) {
  tensors_.push_back({bytes, false, bytes});
  const Id id = static_cast<Id>(tensors_.size() - 1);
  events_.push_back({Kind::kAlloc, id});
  return id;
}

void MemoryTrace::release(Id id) { events_.push_back({Kind::kRelease, id}); }

int MemoryTrace::param(int64_t bytes, int64_t rows, int64_t cols) {
  params_.push_back(bytes);
  param_frozen_.push_back(frozen_);
  param_shapes_.push_back({bytes, rows, cols, cols > 0 && block_depth_ > 0, open_block_});
  return static_cast<int>(params_.size() - 1);
}

void MemoryTrace::node(std::vector<Id> saved, std::vector<Id> grad_inputs, std::vector<Id> outputs,
                       std::vector<int> params, int64_t scratch) {
  // Persistent tensors (the batch, tables) never require grad.
  grad_inputs.erase(std::remove_if(grad_inputs.begin(), grad_inputs.end(),
                                   [this](Id id) { return tensors_[id].persistent; }),
                    grad_inputs.end());
  // Frozen parameters get no gradient.
  params.erase(std::remove_if(params.begin(), params.end(),
                              [this](int p) { return param_frozen_[static_cast<size_t>(p)]; }),
               params.end());
  nodes_.push_back({std::move(saved), std::move(grad_inputs), std::move(outputs), std::move(params),
                    scratch, open_block_});
  events_.push_back({Kind::kNode, -1, static_cast<int>(nodes_.size() - 1)});
}

void MemoryTrace::begin(Unit unit, Id in) {
  if (unit == Unit::kBlock) {
    ++block_depth_;
    open_block_ = blocks_begun_++;
  }
  events_.push_back({Kind::kBegin, in, -1, unit});
}
void MemoryTrace::end(Unit unit, Id out) {
  if (unit == Unit::kBlock) {
    --block_depth_;
    open_block_ = -1;
  }
  events_.push_back({Kind::kEnd, out, -1, unit});
}

int64_t MemoryTrace::persistent_bytes() const {
  int64_t total = 0;
  for (const auto& t : tensors_)
    if (t.persistent) total += t.bytes;
  return total;
}

int64_t MemoryTrace::params_bytes() const {
  int64_t total = 0;
  for (int64_t b : params_) total += b;
  return total;
}

int64_t MemoryTrace::frozen_params_bytes() const {
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (param_frozen_[i]) total += params_[i];
  return total;
}

std::vector<MemoryTrace::ParamShape> MemoryTrace::trainable_param_shapes() const {
  std::vector<ParamShape> out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!param_frozen_[i]) out.push_back(param_shapes_[i]);
  return out;
}

std::vector<int64_t> MemoryTrace::trainable_param_sizes() const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!param_frozen_[i]) out.push_back(params_[i]);
  return out;
}

void MemoryTrace::set_lora(Lora lora) {
  lora_ = std::move(lora);
  frozen_ = !lora_.targets.empty();
}

Id MemoryTrace::adapt(Id x, Id y, int64_t n, int64_t in, int64_t out, const std::string& target) {
  const auto& t = lora_.targets;
  auto named = [&t](const char* name) { return std::find(t.begin(), t.end(), name) != t.end(); };
  const bool adapted = target == "gate_up" ? named("gate") || named("up") : named(target.c_str());
  if (!adapting_ || lora_.rank <= 0 || !adapted) return y;
  // LoraAdapterImpl::forward: linear(linear(dropout(x), A), B) * scaling, then y + that.
  const Id h = lora_.dropout > 0 ? dropout(x, lora_.dropout) : x;
  // The adapters train, and are not among the blocks' matrices that optimizers treat apart.
  const bool was_frozen = frozen_;
  const int depth = block_depth_;
  frozen_ = false;
  block_depth_ = 0;
  const Id a = linear(h, n, in, lora_.rank, false);
  if (h != x) release(h);
  const Id b = linear(a, n, lora_.rank, out, false);
  release(a);
  frozen_ = was_frozen;
  block_depth_ = depth;
  const Id scaled = alloc(n * out * kFloat);
  node({}, {b}, {scaled});
  release(b);
  const Id sum = add(y, scaled);
  release(y);
  release(scaled);
  return sum;
}

int64_t MemoryTrace::block_count() const {
  int64_t n = 0;
  for (const auto& e : events_)
    if (e.kind == Kind::kBegin && e.unit == Unit::kBlock) ++n;
  return n;
}

// ---------------------------------------------------------------------------------------
// Layers

Id MemoryTrace::linear(Id x, int64_t n, int64_t in, int64_t out, bool bias, int weight, Id keep) {
  const int w = weight >= 0 ? weight : param(in * out * kFloat, out, in);
  std::vector<int> params = {w};
  if (bias) params.push_back(param(out * kFloat, out));
  // Bias is added in place (or by addmm): the output is the only new tensor.
  const Id y = alloc(n * out * kFloat);
  node({keep >= 0 ? keep : x}, {x}, {y}, params);
  return y;
}

Id MemoryTrace::rms_norm(Id x, int64_t n, int64_t c) {
  // RMSNormImpl::forward: x.pow(2).mean(-1) -> rsqrt(var + eps) -> x * r -> weight * normed.
  const int64_t full = n * c * kFloat, row = n * kFloat;
  const Id squared = alloc(full);
  node({x}, {x}, {squared}, {}, /*pow backward: x^1 and 2 x^1*/ 2 * full);
  const Id variance = alloc(row);
  node({}, {squared}, {variance});  // mean saves sizes only; its backward expands to (n, c)
  release(squared);
  const Id shifted = alloc(row);
  node({}, {variance}, {shifted});
  const Id r = alloc(row);
  node({r}, {shifted}, {r});  // rsqrt saves its result
  release(shifted);
  const Id normed = alloc(full);
  node({x, r}, {x, r}, {normed}, {}, /*grad of r before its sum*/ full);
  release(r);
  const int w = param(c * kFloat);
  const Id y = alloc(full);
  node({normed}, {normed}, {y}, {w}, /*grad of weight before its sum*/ full);
  release(normed);
  release(variance);
  return y;
}

Id MemoryTrace::layer_norm(Id x, int64_t n, int64_t c, bool bias) {
  // native_layer_norm saves its input and the per-row mean and 1/std it returns.
  const Id y = alloc(n * c * kFloat);
  const Id mean = alloc(n * kFloat);
  const Id rstd = alloc(n * kFloat);
  std::vector<int> params = {param(c * kFloat)};
  if (bias) params.push_back(param(c * kFloat));
  node({x, mean, rstd}, {x}, {y}, params);
  release(mean);
  release(rstd);
  return y;
}

Id MemoryTrace::embedding(int64_t n, int64_t vocab, int64_t c, int* weight) {
  const int w = param(vocab * c * kFloat, vocab);
  if (weight) *weight = w;
  const Id y = alloc(n * c * kFloat);
  // The dense backward allocates the whole (vocab, c) gradient, and sorts the indices.
  node({}, {}, {y}, {w}, 2 * n * kLong);
  return y;
}

Id MemoryTrace::dropout(Id x, double p) {
  if (p <= 0) return x;
  // dropout() in layers.cpp: a bool mask, which backward keeps, and the output.
  const Id mask = alloc(bytes(x) / kFloat);
  const Id y = alloc(bytes(x));
  node({mask}, {x}, {y});
  release(mask);
  return y;
}

Id MemoryTrace::drop(Id x, double p) {
  const Id y = dropout(x, p);
  if (y != x) release(x);
  return y;
}

Id MemoryTrace::residual(Id x, Id branch, double p) {
  const Id dropped = drop(branch, p);
  const Id y = add(x, dropped);
  release(dropped);
  return y;
}

Id MemoryTrace::activation(Id x) {
  const Id y = alloc(bytes(x));
  node({x}, {x}, {y});
  return y;
}

Id MemoryTrace::add(Id a, Id b, int param) {
  const Id y = alloc(bytes(a));
  // The sum's gradient goes to both inputs as it is: the first holds it, the second
  // shares it (zero new bytes). A broadcast parameter gets the gradient summed to its shape.
  if (param >= 0)
    node({}, {a}, {y}, {param}, /*marks a pass-through*/ -1);
  else
    node({}, {a, b}, {y}, {}, -1);
  return y;
}

Id MemoryTrace::mul(Id a, Id b) {
  const Id y = alloc(bytes(a));
  node({a, b}, {a, b}, {y});
  return y;
}

Id MemoryTrace::copy(Id x, int64_t bytes) {
  const Id y = alloc(bytes);
  node({}, {x}, {y}, {}, -1);
  return y;
}

std::vector<Id> MemoryTrace::packed_linear(Id x, int64_t n, int64_t in,
                                           const std::vector<int64_t>& outs, bool bias) {
  int64_t total = 0;
  std::vector<int> params;
  for (int64_t out : outs) {
    total += out;
    params.push_back(param(in * out * kFloat, out, in));
    if (bias) params.push_back(param(out * kFloat, out));
  }
  // cat(weights) (and cat(biases), a bias-sized copy the addmm does not save): the product
  // saves the stacked weight for x's gradient. Its backward computes the stacked weight's
  // gradient, whose rows cat's backward hands to the parameters as they are.
  const Id weight = alloc(total * in * kFloat);
  const Id stacked_bias = bias ? alloc(total * kFloat) : -1;
  const Id y = alloc(n * total * kFloat);
  node({x, weight}, {x}, {y}, params);
  release(weight);
  if (stacked_bias >= 0) release(stacked_bias);
  std::vector<Id> parts = {y};
  for (int64_t out : outs) parts.push_back(view(n * out * kFloat));
  // split_with_sizes: its backward concatenates the parts' gradients into one of y's size.
  node({}, {y}, {parts.begin() + 1, parts.end()});
  return parts;
}

Id MemoryTrace::rotary(Id x, int64_t elements) {
  // apply_rotary: x * cos + rotate_half(x) * sin, with rotate_half = cat(-x2, x1).
  const int64_t full = elements * kFloat;
  const Id xc = alloc(full);
  const Id neg = alloc(full / 2);
  const Id rotated = alloc(full);
  release(neg);
  const Id rs = alloc(full);
  const Id y = alloc(full);
  release(xc);
  release(rotated);
  release(rs);
  // One node for the whole expression: the gradient of x, and the halves the narrow and
  // negation gradients allocate on the way.
  node({}, {x}, {y}, {}, 2 * full);
  return y;
}

Id MemoryTrace::self_attention(Id x, const AttentionShape& s) {
  const int64_t n = s.batch * s.tokens;
  const int64_t q_elems = n * s.heads * s.head_size;
  const int64_t kv_elems = n * s.kv_heads * s.head_size;
  Id q, k, v, packed = -1;
  std::array<Id, 3> views = {-1, -1, -1};  // q, k, v as views of the packed output
  if (packed_projections_) {
    // One product; q, k and v are views of its output, which lives until the forward ends
    // (v, or un-rotated q and k, still point into it).
    const int64_t kv_width = s.kv_heads * s.head_size;
    const auto parts =
        packed_linear(x, n, s.hidden, {s.heads * s.head_size, kv_width, kv_width}, s.bias);
    packed = parts[0];
    q = parts[1];
    k = parts[2];
    v = parts[3];
    views = {q, k, v};
  } else {
    q = linear(x, n, s.hidden, s.heads * s.head_size, s.bias);
    k = linear(x, n, s.hidden, s.kv_heads * s.head_size, s.bias);
    v = linear(x, n, s.hidden, s.kv_heads * s.head_size, s.bias);
  }
  q = adapt(x, q, n, s.hidden, s.heads * s.head_size, "q");
  k = adapt(x, k, n, s.hidden, s.kv_heads * s.head_size, "k");
  v = adapt(x, v, n, s.hidden, s.kv_heads * s.head_size, "v");
  if (s.rotary) {
    const Id qr = rotary(q, q_elems);
    release(q);
    q = qr;
    const Id kr = rotary(k, kv_elems);
    release(k);
    k = kr;
  }
  const bool fused = fused_attention(s.dropout);
  // repeat_kv: grouped key/value heads are expanded into a contiguous copy, except for SDPA's
  // fused kernel on the CPU, which shares them among their query heads (enable_gqa).
  const bool repeated = s.heads != s.kv_heads && (cuda_ || !fused);
  Id k_full = k, v_full = v;
  if (repeated) {
    k_full = alloc(q_elems * kFloat);
    node({}, {k}, {k_full});
    v_full = alloc(q_elems * kFloat);
    node({}, {v}, {v_full});
  }
  Id y = -1;
  if (fused) {
    // SDPA's fused kernel reads q, k and v where they lie and saves them, its output and the
    // rows' logsumexp (B, heads, T); backward allocates the three inputs' gradients. Its output
    // takes q's layout, (B, T, heads, HS), so the reshape to (B, T, heads * HS) is a view.
    // A bool mask of the batch's (merged with the causal one when both apply: a new bool
    // tensor) is turned into an additive float mask on each call, which the kernel saves.
    Id float_mask = -1;
    if (s.batch_mask && s.mask_bytes > 0) {
      const Id merged = s.causal ? alloc(s.mask_bytes) : -1;
      float_mask = alloc(s.mask_bytes * kFloat);
      if (merged >= 0) release(merged);
    }
    const Id o = alloc(q_elems * kFloat);
    const Id lse = alloc(s.batch * s.heads * s.tokens * kFloat);
    std::vector<Id> saved = {q, k_full, v_full, o, lse};
    if (float_mask >= 0) saved.push_back(float_mask);
    // A view of the packed projections' output owns no bytes: saving it keeps the output.
    if (packed >= 0 && (q == views[0] || k_full == views[1] || v_full == views[2]))
      saved.push_back(packed);
    node(saved, {q, k_full, v_full}, {o});
    release(lse);
    if (float_mask >= 0) release(float_mask);
    if (repeated) {
      release(k_full);
      release(v_full);
    }
    y = o;
  } else {
    y = math_attention(q, k, v, k_full, v_full, s);
  }
  const Id out = adapt(y, linear(y, n, s.heads * s.head_size, s.hidden, s.bias), n,
                       s.heads * s.head_size, s.hidden, "o");
  release(y);
  release(q);
  release(k);
  release(v);
  if (packed >= 0) release(packed);
  return out;
}

bool MemoryTrace::fused_attention(double dropout) const {
  switch (attention_) {
    case Attention::kSdpa:
      // On the CPU with dropout SDPA runs a math composition of its own, estimated as
      // gradscope's math path (docs/strategies.md).
      return cuda_ || dropout <= 0;
    case Attention::kMath:
      return false;
    case Attention::kAuto:
      break;
  }
  return cuda_ || dropout <= 0;
}

MemoryTrace::Id MemoryTrace::math_attention(Id q, Id k, Id v, Id k_full, Id v_full,
                                            const AttentionShape& s) {
  const int64_t q_elems = s.batch * s.tokens * s.heads * s.head_size;
  const int64_t scores = s.batch * s.heads * s.tokens * s.tokens * kFloat;
  const bool grouped = s.heads != s.kv_heads;
  // matmul folds (B, heads) into one batch dimension with reshape: q (laid out as the
  // projection's (B, T, heads, HS)) is copied, and so are k and v unless repeat_kv already
  // made them contiguous; the batched products save the copies.
  // (A view of the packed projections' output owns no bytes: its copy is its elements' size.)
  auto contiguous_copy = [this](Id t) { return copy(t, grad_bytes(t)); };
  const Id qc = contiguous_copy(q);
  const Id kc = grouped ? k_full : contiguous_copy(k);
  const Id raw = alloc(scores);
  node({qc, kc}, {qc, kc}, {raw});
  release(qc);
  if (!grouped) release(kc);
  const Id scaled = alloc(scores);
  node({}, {raw}, {scaled});
  release(raw);
  Id masked = scaled;
  if (s.mask_bytes > 0) {
    // The bool mask made additive (a float per element), then added: the sum's gradient
    // passes through.
    const Id additive = alloc(s.mask_bytes * kFloat);
    masked = alloc(scores);
    node({}, {scaled}, {masked}, {}, -1);
    release(additive);
    release(scaled);
  }
  const Id weights = alloc(scores);
  node({weights}, {masked}, {weights});  // softmax saves its output
  const Id dropped = s.dropout > 0 ? dropout(weights, s.dropout) : weights;
  const Id vc = grouped ? v_full : contiguous_copy(v);
  const Id o = alloc(q_elems * kFloat);
  node({dropped, vc}, {dropped, vc}, {o});
  if (!grouped) release(vc);
  if (dropped != weights) release(dropped);
  release(weights);
  release(masked);
  if (grouped) {
    release(k_full);
    release(v_full);
  }
  // (B, heads, T, HS) -> (B, T, heads * HS): a transpose, then a copying reshape.
  const Id y = contiguous_copy(o);
  release(o);
  return y;
}

Id MemoryTrace::cross_entropy(Id logits, int64_t n, int64_t v) {
  const Id log_probs = alloc(n * v * kFloat);
  node({log_probs}, {logits}, {log_probs});  // log_softmax saves its output
  const Id loss = alloc(kFloat);
  node({log_probs}, {log_probs}, {loss});  // nll_loss's backward allocates (n, v)
  release(log_probs);
  set_loss(loss);
  return loss;
}

void MemoryTrace::lm_loss(Id x, int64_t n, int64_t in, int64_t vocab, bool bias, int weight) {
  if (loss_chunk_ <= 0) {
    // cross_entropy_sum (models/common/lm_loss.h): forward turns the logits into their
    // gradient in place and keeps them; backward scales them and hands them on, allocating
    // nothing of their size.
    const Id logits = linear(x, n, in, vocab, bias, weight);
    const Id loss = alloc(kFloat);
    node({}, {logits}, {loss});
    nodes_.back().handed = {logits};
    release(logits);
    set_loss(loss);
    return;
  }
  // Chunked (models/common/lm_loss.h): one chunk's logits exist at a time and become their
  // gradient in place; when the forward builds a graph it also computes the gradients of x,
  // of the weight and of the bias there, chunk by chunk (each chunk's rows of x's gradient a
  // product before they are copied in), and keeps them until backward hands them on, which
  // then allocates nothing more.
  const int64_t chunk = std::min(loss_chunk_, n);
  const int w = weight >= 0 ? weight : param(in * vocab * kFloat, vocab, in);
  std::vector<int> params = {w};
  if (bias) params.push_back(param(vocab * kFloat));
  int64_t grads_bytes = tensors_[static_cast<size_t>(x)].persistent ? 0 : grad_bytes(x);
  for (int p : params)
    if (!param_frozen_[static_cast<size_t>(p)]) grads_bytes += params_[static_cast<size_t>(p)];
  const Id grads = alloc(grads_bytes);
  tensors_[static_cast<size_t>(grads)].with_grad_only = true;
  const Id logits = alloc(chunk * vocab * kFloat);
  const Id rows = alloc(chunk * in * kFloat);
  tensors_[static_cast<size_t>(rows)].with_grad_only = true;
  release(rows);
  release(logits);
  const Id loss = alloc(kFloat);
  node({}, {x}, {loss}, params);
  nodes_.back().handed = {grads};
  release(grads);
  set_loss(loss);
}

}  // namespace gradscope
