#include "gradscope/models/common/layers.h"

#include "gradscope/models/common/lora.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

namespace gradscope {

namespace F = torch::nn::functional;

// ---------------------------------------------------------------------------------------
// RMSNorm

RMSNormImpl::RMSNormImpl(const RMSNormOptions& options_) : options(options_) { reset(); }

void RMSNormImpl::reset() {
  TORCH_CHECK(options.dim() > 0, "RMSNorm dim must be positive, got ", options.dim());
  TORCH_CHECK(options.eps() >= 0, "RMSNorm eps must be >= 0, got ", options.eps());
  weight = register_parameter("weight", torch::empty({options.dim()}));
  reset_parameters();
}

void RMSNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.fill_(1.0);
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // float32 statistics: bf16 has too few mantissa bits for a mean of squares over C.
  auto x32 = x.to(torch::kFloat);                              // (..., C)
  auto variance = x32.pow(2).mean(-1, /*keepdim=*/true);       // (..., 1)
  auto normed = x32 * torch::rsqrt(variance + options.eps());  // (..., C)
  return weight * normed.to(x.scalar_type());
}

// ---------------------------------------------------------------------------------------
// LayerNorm

LayerNormImpl::LayerNormImpl(const LayerNormOptions& options_) : options(options_) { reset(); }

void LayerNormImpl::reset() {
  TORCH_CHECK(options.dim() > 0, "LayerNorm dim must be positive, got ", options.dim());
  TORCH_CHECK(options.eps() >= 0, "LayerNorm eps must be >= 0, got ", options.eps());
  weight = register_parameter("weight", torch::empty({options.dim()}));
  if (options.bias()) bias = register_parameter("bias", torch::empty({options.dim()}));
  reset_parameters();
}

void LayerNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.fill_(1.0);
  if (bias.defined()) bias.zero_();
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  // A norm runs in its weight's precision, as CUDA's autocast runs it in float32: a bfloat16
  // input (a linear layer's output under autocast) is widened first, whatever autocast's
  // lists say of layer_norm on this device and version: the kernel refuses mixed dtypes.
  const bool widen = weight.defined() && x.scalar_type() != weight.scalar_type();
  return torch::layer_norm(widen ? x.to(weight.scalar_type()) : x, {options.dim()}, weight, bias,
                           options.eps());
}

// ---------------------------------------------------------------------------------------
// Rotary embeddings

torch::Tensor rope_inv_freq(const RotaryOptions& options) {
  const int64_t hs = options.head_size();
  TORCH_CHECK(hs > 0 && hs % 2 == 0, "rotary head size must be positive and even, got ", hs);
  TORCH_CHECK(options.theta() > 0, "rope theta must be positive, got ", options.theta());
  // Each line mirrors one Python expression of transformers' modeling_rope_utils; where
  // Python writes `scalar / tensor` PyTorch computes tensor.reciprocal() * scalar, and so
  // do we, so that the float32 roundings are the same.
  // inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
  auto exponent = torch::arange(0, hs, 2, torch::kLong).to(torch::kFloat) / hs;  // (HS/2)
  auto inv_freq = torch::pow(options.theta(), exponent).reciprocal();            // (HS/2)
  if (!options.llama3_scaling()) return inv_freq;

  const Llama3RopeScaling& s = *options.llama3_scaling();
  TORCH_CHECK(s.factor > 0, "llama3 rope scaling factor must be positive, got ", s.factor);
  TORCH_CHECK(s.high_freq_factor > s.low_freq_factor,
              "llama3 rope scaling needs high_freq_factor > low_freq_factor, got ",
              s.high_freq_factor, " and ", s.low_freq_factor);
  const double old_context_len = s.original_max_position_embeddings;
  const double low_freq_wavelen = old_context_len / s.low_freq_factor;
  const double high_freq_wavelen = old_context_len / s.high_freq_factor;

  // wavelen = 2 * math.pi / inv_freq
  constexpr double kPi = 3.141592653589793;  // Python's math.pi
  auto wavelen = inv_freq.reciprocal() * (2 * kPi);
  // wavelen > low_freq_wavelen: divide by factor; wavelen < high_freq_wavelen: keep
  auto inv_freq_llama = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  // smooth_factor = (old_context_len / wavelen - low_freq_factor)
  //                 / (high_freq_factor - low_freq_factor)
  auto smooth_factor = (wavelen.reciprocal() * old_context_len - s.low_freq_factor) /
                       (s.high_freq_factor - s.low_freq_factor);
  // smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
  auto smoothed = (1 - smooth_factor) * inv_freq_llama / s.factor + smooth_factor * inv_freq_llama;
  auto is_medium =
      (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return torch::where(is_medium, smoothed, inv_freq_llama);
}

RopeTables rope_tables(const RotaryOptions& options, int64_t seq_len, const torch::Device& device) {
  TORCH_CHECK(seq_len > 0, "rotary tables need a positive sequence length, got ", seq_len);
  auto inv_freq = rope_inv_freq(options);                                   // (HS/2)
  auto positions = torch::arange(seq_len, torch::kLong).to(torch::kFloat);  // (T)
  auto freqs = torch::outer(positions, inv_freq);                           // (T, HS/2)
  auto emb = torch::cat({freqs, freqs}, -1);                                // (T, HS)
  // Llama 3 scaling has attention_factor 1, so the tables are not rescaled.
  return {emb.cos().to(device), emb.sin().to(device)};
}

static torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, x.size(-1) - half);
  return torch::cat({-x2, x1}, -1);
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes(),
              "rotary tables must be (T, HS) and alike, got ", cos.sizes(), " and ", sin.sizes());
  TORCH_CHECK(x.size(-1) == cos.size(-1) && x.size(-2) == cos.size(0), "apply_rotary: input ",
              x.sizes(), " does not match tables ", cos.sizes());
  auto c = cos.to(x.scalar_type());  // (T, HS), broadcast over (B, NH)
  auto s = sin.to(x.scalar_type());
  return x * c + rotate_half(x) * s;  // (B, NH, T, HS)
}

const RopeTables& RotaryCache::get(int64_t seq_len, const torch::Device& device) {
  if (seq_len != seq_len_ || !device_ || *device_ != device) {
    tables_ = rope_tables(options_, seq_len, device);
    seq_len_ = seq_len;
    device_ = device;
  }
  return tables_;
}

// ---------------------------------------------------------------------------------------
// Dropout

namespace {

// Keeps an element when its 32 random bits are below (1 - p) * 2^32, rounded down and clamped
// below 2^32: p is drawn to within 2^-32 (a p below 2^-32 drops with probability 2^-32, and
// one within 2^-32 of 1 drops every element).
uint32_t keep_threshold(double p) {
  constexpr double kRange = 4294967296.0;  // 2^32
  return static_cast<uint32_t>(std::min((1.0 - p) * kRange, kRange - 1.0));
}

// The seed of one dropout call: a 64-bit draw from the default CPU generator, so that the
// generator's state decides the mask and a restored state redraws it.
uint64_t dropout_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();  // a handle on the one generator
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

// SplitMix64 (Steele, Lea and Flood 2014) as a counter-based generator: the 64 random bits of
// elements 2j and 2j + 1 (low and high half) are the mix of seed + (j + 1) * golden gamma,
// whatever thread computes them.
inline uint64_t splitmix64(uint64_t seed, int64_t pair) {
  uint64_t z = seed + (static_cast<uint64_t>(pair) + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The least number of elements per task of the parallel loops.
constexpr int64_t kDropoutGrain = 16384;

// y[i] = keep[i] * scale * x[i], over contiguous tensors of one dtype; without a branch, which
// the random mask would mispredict.
template <typename scalar_t>
void scale_kept(const scalar_t* x, const bool* keep, double scale, scalar_t* y, int64_t begin,
                int64_t end) {
  using opmath_t = at::opmath_type<scalar_t>;
  const auto s = static_cast<opmath_t>(scale);
  for (int64_t i = begin; i < end; ++i) {
    const opmath_t factor = static_cast<opmath_t>(keep[i]) * s;  // 0 or 1 / (1 - p)
    y[i] = static_cast<scalar_t>(static_cast<opmath_t>(x[i]) * factor);
  }
}

}  // namespace

void dropout_keep_mask(uint64_t seed, uint32_t threshold, bool* keep, int64_t begin,
                       int64_t end) {
  // A range may start and end inside a pair (a parallel backend splits the elements evenly
  // among its threads): such an element takes its half of its pair's bits alone.
  auto keep_alone = [&](int64_t i) {
    const uint64_t bits = splitmix64(seed, i / 2);
    keep[i] = static_cast<uint32_t>(i % 2 == 0 ? bits : bits >> 32) < threshold;
  };
  int64_t i = begin;
  if (i < end && i % 2 == 1) keep_alone(i++);
  for (; i + 1 < end; i += 2) {
    const uint64_t bits = splitmix64(seed, i / 2);
    keep[i] = static_cast<uint32_t>(bits) < threshold;
    keep[i + 1] = static_cast<uint32_t>(bits >> 32) < threshold;
  }
  if (i < end) keep_alone(i);
}

namespace {

// Autograd saves the bool mask; backward scales the kept elements of the gradient.
struct CpuDropout : public torch::autograd::Function<CpuDropout> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               double p) {
    const auto input = x.contiguous();
    const uint64_t seed = dropout_seed();
    const uint32_t threshold = keep_threshold(p);
    const double scale = 1.0 / (1.0 - p);
    auto keep = torch::empty(input.sizes(), input.options().dtype(torch::kBool));
    auto y = torch::empty_like(input);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "dropout", [&] {
      const scalar_t* in = input.const_data_ptr<scalar_t>();
      bool* k = keep.mutable_data_ptr<bool>();
      scalar_t* out = y.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, input.numel(), kDropoutGrain, [&](int64_t begin, int64_t end) {
        dropout_keep_mask(seed, threshold, k, begin, end);
        scale_kept(in, k, scale, out, begin, end);
      });
    });
    ctx->save_for_backward({keep});
    ctx->saved_data["scale"] = scale;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto keep = ctx->get_saved_variables()[0];
    const auto grad = grads[0].contiguous();
    const double scale = ctx->saved_data["scale"].toDouble();
    auto out = torch::empty_like(grad);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "dropout", [&] {
      const scalar_t* g = grad.const_data_ptr<scalar_t>();
      const bool* k = keep.const_data_ptr<bool>();
      scalar_t* o = out.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, grad.numel(), kDropoutGrain, [&](int64_t begin, int64_t end) {
        scale_kept(g, k, scale, o, begin, end);
      });
    });
    return {out, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor dropout(const torch::Tensor& x, double p) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability must be in [0, 1], got ", p);
  if (p == 0) return x;
  if (p == 1) return x * 0;  // every element dropped; the gradient is zero too
  if (!x.device().is_cpu()) return std::get<0>(at::native_dropout(x, p, /*train=*/true));
  return CpuDropout::apply(x, p);
}

// ---------------------------------------------------------------------------------------
// Attention

namespace {
std::atomic<Attention> g_attention_path{Attention::kAuto};
}  // namespace

void set_attention_path(Attention path) { g_attention_path.store(path); }

Attention attention_path() { return g_attention_path.load(); }

Attention resolved_attention(Attention path, const torch::Device& device, double dropout_p) {
  if (path != Attention::kAuto) return path;
  // On the CPU, SDPA with dropout leaves its fused kernel for a math composition of its own
  // (with masks of its own); gradscope's math path is then the one the trace models.
  return device.is_cpu() && dropout_p > 0 ? Attention::kMath : Attention::kSdpa;
}

torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), nkv = x.size(1), s = x.size(2), hs = x.size(3);
  // (B, NKV, S, HS) -> (B, NKV, n_rep, S, HS) -> (B, NKV * n_rep, S, HS)
  return x.unsqueeze(2).expand({b, nkv, n_rep, s, hs}).reshape({b, nkv * n_rep, s, hs});
}

// The causal constraint as a bool mask, true where query t may attend key s (s <= t),
// top-left aligned like SDPA's is_causal.
static torch::Tensor causal_keep_mask(int64_t t, int64_t s, const torch::Device& device) {
  return torch::ones({t, s}, torch::TensorOptions().dtype(torch::kBool).device(device)).tril();
}

torch::Tensor causal_mask(int64_t t, const torch::Device& device) {
  return causal_keep_mask(t, t, device);
}

torch::Tensor sliding_window_mask(int64_t t, int64_t half_window, const torch::Device& device) {
  TORCH_CHECK(t > 0 && half_window >= 0, "sliding window mask needs T > 0 and a window >= 0, got ",
              t, " and ", half_window);
  auto pos = torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(device));  // (T)
  auto distance = (pos.unsqueeze(1) - pos.unsqueeze(0)).abs();                             // (T, T)
  return distance.le(half_window);
}

torch::Tensor key_padding_mask(const torch::Tensor& real_positions) {
  TORCH_CHECK(real_positions.dim() == 2 && real_positions.scalar_type() == torch::kBool,
              "key_padding_mask expects (B, S) bool, got ", real_positions.sizes(), " ",
              real_positions.scalar_type());
  return real_positions.unsqueeze(1).unsqueeze(1);  // (B, 1, 1, S)
}

// One mask for SDPA (which rejects attn_mask together with is_causal) and the math path:
// bool stays bool, a floating mask is cast to the scores' dtype.
static torch::Tensor merged_mask(const torch::Tensor& mask, bool is_causal, int64_t t, int64_t s,
                                 const torch::TensorOptions& scores_options) {
  torch::Tensor out;
  if (mask.defined()) {
    out = mask.scalar_type() == torch::kBool ? mask : mask.to(scores_options.dtype());
  }
  if (!is_causal) return out;
  auto keep = causal_keep_mask(t, s, scores_options.device());  // (T, S)
  if (!out.defined()) return keep;
  if (out.scalar_type() == torch::kBool) return out.logical_and(keep);
  return out.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
}

static torch::Tensor math_attention(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const torch::Tensor& mask,
                                    double dropout_p) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;  // (B, NH, T, S)
  if (mask.defined()) {
    if (mask.scalar_type() == torch::kBool) {
      // Made additive, 0 where a query may attend and -inf where not, as transformers' eager
      // attention adds its mask: the sum's backward hands the gradient on as it is, where
      // masked_fill's would allocate one of the scores' size. The sum equals masked_fill's.
      const auto additive =
          torch::full(mask.sizes(), -std::numeric_limits<double>::infinity(), scores.options())
              .masked_fill_(mask, 0.0);
      scores = scores + additive;
    } else {
      scores = scores + mask;
    }
  }
  auto weights = torch::softmax(scores, -1);  // (B, NH, T, S)
  if (dropout_p > 0) weights = dropout(weights, dropout_p);
  return torch::matmul(weights, v);  // (B, NH, T, HS)
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, bool is_causal, double dropout_p,
                        bool training) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention expects (B, heads, T, HS) tensors, got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes(), "attention: k ", k.sizes(), " and v ", v.sizes(), " differ");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "attention: q ", q.sizes(),
              " and k ", k.sizes(), " differ in batch or head size");
  const int64_t nh = q.size(1), nkv = k.size(1);
  TORCH_CHECK(nkv > 0 && nh % nkv == 0, "attention: ", nh, " query heads are not a multiple of ",
              nkv, " key/value heads");
  TORCH_CHECK(dropout_p >= 0 && dropout_p < 1, "attention dropout must lie in [0, 1), got ",
              dropout_p);
  const double p = training ? dropout_p : 0.0;
  const int64_t t = q.size(2), s = k.size(2);

  const bool sdpa = resolved_attention(attention_path(), q.device(), p) == Attention::kSdpa;
  // SDPA on the CPU takes grouped keys and values as they are (enable_gqa): its fused kernel
  // shares each among its query heads without the (B, NH, S, HS) copies that repeating them
  // would keep for backward. CUDA's memory-efficient kernel takes no groups (SDPA would fall
  // back to its math), and the math path multiplies whole heads: there they are repeated.
  const bool gqa = sdpa && nh != nkv && q.device().is_cpu();
  const torch::Tensor key = gqa ? k : repeat_kv(k, nh / nkv);    // (B, NKV or NH, S, HS)
  const torch::Tensor value = gqa ? v : repeat_kv(v, nh / nkv);  // (B, NKV or NH, S, HS)
  if (!sdpa)
    return math_attention(q, key, value, merged_mask(mask, is_causal, t, s, q.options()), p);
  if (!mask.defined()) {
    // is_causal lets SDPA pick its fused causal kernels instead of reading a mask.
    return at::scaled_dot_product_attention(q, key, value, c10::nullopt, p, is_causal,
                                            c10::nullopt, gqa);
  }
  c10::optional<at::Tensor> m = merged_mask(mask, is_causal, t, s, q.options());
  return at::scaled_dot_product_attention(q, key, value, m, p, /*is_causal=*/false,
                                          c10::nullopt, gqa);
}

// ---------------------------------------------------------------------------------------
// Packed projections

std::vector<torch::Tensor> packed_linear(
    const torch::Tensor& x,
    std::initializer_list<std::reference_wrapper<torch::nn::LinearImpl>> layers) {
  std::vector<torch::Tensor> weights, biases;
  std::vector<int64_t> widths;
  for (torch::nn::LinearImpl& layer : layers) {
    weights.push_back(layer.weight);
    if (layer.bias.defined()) biases.push_back(layer.bias);
    widths.push_back(layer.weight.size(0));
  }
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(),
              "packed projections need biases on all of them or on none");
  // The stacked weight is a copy, made in the parameters' dtype (float32 under autocast too:
  // the product casts it as a separate layer casts its own weight), and linear saves it for
  // the input's gradient. cat's backward hands each parameter its rows of the stacked
  // weight's gradient.
  auto weight = torch::cat(weights, 0);                                  // (sum out, in)
  auto bias = biases.empty() ? torch::Tensor() : torch::cat(biases, 0);  // (sum out)
  // ATen's linear, as adapted_linear: the bias added inside the matrix product.
  auto parts = torch::linear(x, weight, bias).split_with_sizes(widths, -1);  // views
  // An adapted layer's part gets its adapter's update (a new tensor, no longer a view).
  size_t i = 0;
  for (torch::nn::LinearImpl& layer : layers) {
    if (auto* adapter = lora_adapter_of(layer)) parts[i] = parts[i] + adapter->forward(x);
    ++i;
  }
  return parts;
}

// ---------------------------------------------------------------------------------------
// SelfAttention

SelfAttentionImpl::SelfAttentionImpl(const SelfAttentionOptions& options_) : options(options_) {
  reset();
}

int64_t SelfAttentionImpl::num_kv_heads() const {
  return options.num_kv_heads() > 0 ? options.num_kv_heads() : options.num_heads();
}

std::map<std::string, int64_t> attention_head_sizes(const torch::nn::Module& root) {
  std::map<std::string, int64_t> out;
  for (const auto& item : root.named_modules()) {
    const auto* attention = dynamic_cast<const SelfAttentionImpl*>(item.value().get());
    if (attention == nullptr) continue;
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj"})
      for (const char* kind : {"weight", "bias"})
        out[prefix + proj + "." + kind] = attention->head_size();
  }
  return out;
}

int64_t SelfAttentionImpl::head_size() const {
  return options.head_size() > 0 ? options.head_size()
                                 : options.hidden_size() / options.num_heads();
}

void SelfAttentionImpl::reset() {
  const int64_t c = options.hidden_size(), nh = options.num_heads();
  TORCH_CHECK(c > 0 && nh > 0, "self-attention needs positive hidden size and heads, got ", c,
              " and ", nh);
  TORCH_CHECK(options.head_size() > 0 || c % nh == 0, "hidden size ", c,
              " is not a multiple of the ", nh, " heads");
  TORCH_CHECK(nh % num_kv_heads() == 0, nh, " query heads are not a multiple of ", num_kv_heads(),
              " key/value heads");
  const int64_t hs = head_size(), nkv = num_kv_heads();
  const bool bias = options.bias();
  q_proj =
      register_module("q_proj", torch::nn::Linear(torch::nn::LinearOptions(c, nh * hs).bias(bias)));
  k_proj = register_module("k_proj",
                           torch::nn::Linear(torch::nn::LinearOptions(c, nkv * hs).bias(bias)));
  v_proj = register_module("v_proj",
                           torch::nn::Linear(torch::nn::LinearOptions(c, nkv * hs).bias(bias)));
  o_proj =
      register_module("o_proj", torch::nn::Linear(torch::nn::LinearOptions(nh * hs, c).bias(bias)));
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                         const torch::Tensor& sin, const torch::Tensor& mask,
                                         bool is_causal) {
  const int64_t b = x.size(0), t = x.size(1);
  const int64_t nh = options.num_heads(), nkv = num_kv_heads(), hs = head_size();
  torch::Tensor q, k, v;
  if (packed_) {
    // (B, T, (NH + 2 NKV) HS), split into views: q, k and v keep their strides into it.
    auto parts = packed_linear(x, {*q_proj, *k_proj, *v_proj});
    q = parts[0].view({b, t, nh, hs}).transpose(1, 2);   // (B, NH, T, HS)
    k = parts[1].view({b, t, nkv, hs}).transpose(1, 2);  // (B, NKV, T, HS)
    v = parts[2].view({b, t, nkv, hs}).transpose(1, 2);  // (B, NKV, T, HS)
  } else {
    q = adapted_linear(*q_proj, x).view({b, t, nh, hs}).transpose(1, 2);   // (B, NH, T, HS)
    k = adapted_linear(*k_proj, x).view({b, t, nkv, hs}).transpose(1, 2);  // (B, NKV, T, HS)
    v = adapted_linear(*v_proj, x).view({b, t, nkv, hs}).transpose(1, 2);  // (B, NKV, T, HS)
  }
  if (cos.defined()) {
    q = apply_rotary(q, cos, sin);
    k = apply_rotary(k, cos, sin);
  }
  auto y = attention(q, k, v, mask, is_causal, options.dropout(), is_training());  // (B, NH, T, HS)
  y = y.transpose(1, 2).reshape({b, t, nh * hs});  // (B, T, NH * HS)
  return adapted_linear(*o_proj, y);               // (B, T, C)
}

// ---------------------------------------------------------------------------------------
// SwiGLU

SwiGLUImpl::SwiGLUImpl(const SwiGLUOptions& options_) : options(options_) { reset(); }

void SwiGLUImpl::reset() {
  const int64_t c = options.hidden_size(), i = options.intermediate_size();
  TORCH_CHECK(c > 0 && i > 0, "SwiGLU needs positive sizes, got ", c, " and ", i);
  const bool bias = options.bias();
  gate_proj =
      register_module("gate_proj", torch::nn::Linear(torch::nn::LinearOptions(c, i).bias(bias)));
  up_proj =
      register_module("up_proj", torch::nn::Linear(torch::nn::LinearOptions(c, i).bias(bias)));
  down_proj =
      register_module("down_proj", torch::nn::Linear(torch::nn::LinearOptions(i, c).bias(bias)));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  if (packed_) {
    auto parts = packed_linear(x, {*gate_proj, *up_proj});  // 2 x (B, T, I), views of (B, T, 2I)
    return adapted_linear(*down_proj, F::silu(parts[0]) * parts[1]);  // (B, T, C)
  }
  auto h = F::silu(adapted_linear(*gate_proj, x)) * adapted_linear(*up_proj, x);  // (B, T, I)
  return adapted_linear(*down_proj, h);                                           // (B, T, C)
}

// ---------------------------------------------------------------------------------------
// GELU MLP and GeGLU

static torch::Tensor gelu(const torch::Tensor& x, bool tanh_approximation) {
  return F::gelu(x, F::GELUFuncOptions().approximate(tanh_approximation ? "tanh" : "none"));
}

static torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return training ? dropout(x, p) : x;
}

GeluMLPImpl::GeluMLPImpl(const GeluMLPOptions& options_) : options(options_) { reset(); }

void GeluMLPImpl::reset() {
  const int64_t c = options.hidden_size(), i = options.intermediate_size();
  TORCH_CHECK(c > 0 && i > 0, "GELU MLP needs positive sizes, got ", c, " and ", i);
  TORCH_CHECK(options.dropout() == 0.0, "the GELU MLP has no dropout of its own");
  fc1 = register_module("fc1",
                        torch::nn::Linear(torch::nn::LinearOptions(c, i).bias(options.bias())));
  fc2 = register_module("fc2",
                        torch::nn::Linear(torch::nn::LinearOptions(i, c).bias(options.bias())));
}

torch::Tensor GeluMLPImpl::forward(const torch::Tensor& x) {
  auto h = gelu(adapted_linear(*fc1, x), options.tanh_approximation());  // (B, T, I)
  return adapted_linear(*fc2, h);                                         // (B, T, C)
}

GeGLUImpl::GeGLUImpl(const GeluMLPOptions& options_) : options(options_) { reset(); }

void GeGLUImpl::reset() {
  const int64_t c = options.hidden_size(), i = options.intermediate_size();
  TORCH_CHECK(c > 0 && i > 0, "GeGLU needs positive sizes, got ", c, " and ", i);
  Wi = register_module("Wi",
                       torch::nn::Linear(torch::nn::LinearOptions(c, 2 * i).bias(options.bias())));
  Wo =
      register_module("Wo", torch::nn::Linear(torch::nn::LinearOptions(i, c).bias(options.bias())));
}

torch::Tensor GeGLUImpl::forward(const torch::Tensor& x) {
  auto parts = adapted_linear(*Wi, x).chunk(2, -1);                                // 2 x (B, T, I)
  auto h = gelu(parts[0], options.tanh_approximation()) * parts[1];                // (B, T, I)
  return adapted_linear(*Wo, maybe_dropout(h, options.dropout(), is_training()));  // (B, T, C)
}

// ---------------------------------------------------------------------------------------
// Patch embedding

PatchEmbeddingImpl::PatchEmbeddingImpl(int64_t channels_, int64_t hidden_size_, int64_t patch_size_)
    : channels(channels_), hidden_size(hidden_size_), patch_size(patch_size_) {
  reset();
}

void PatchEmbeddingImpl::reset() {
  TORCH_CHECK(channels > 0 && hidden_size > 0 && patch_size > 0,
              "patch embedding needs positive sizes, got ", channels, ", ", hidden_size, ", ",
              patch_size);
  projection = register_module(
      "projection",
      torch::nn::Conv2d(
          torch::nn::Conv2dOptions(channels, hidden_size, patch_size).stride(patch_size)));
}

torch::Tensor PatchEmbeddingImpl::forward(const torch::Tensor& images) {
  TORCH_CHECK(images.dim() == 4 && images.size(1) == channels && images.size(2) % patch_size == 0 &&
                  images.size(3) % patch_size == 0,
              "patch embedding expects (B, ", channels, ", H, W) with H and W multiples of ",
              patch_size, ", got ", images.sizes());
  auto grid = projection(images);          // (B, C, H / P, W / P)
  return grid.flatten(2).transpose(1, 2);  // (B, N, C)
}

// ---------------------------------------------------------------------------------------
// Initialisation

void normal_init(torch::Tensor& weight, double std, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  auto draw = torch::empty(weight.sizes(), torch::TensorOptions().dtype(torch::kFloat));
  draw.normal_(0.0, std, gen);
  weight.copy_(draw);
}

void init_weights_normal(torch::nn::Module& root, double std, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  // modules() walks in registration order, so the draws come in a fixed order; the root
  // itself is included, so that a lone layer (a model's head) is initialised too.
  for (const auto& module : root.modules(/*include_self=*/true)) {
    if (auto* linear = module->as<torch::nn::LinearImpl>()) {
      normal_init(linear->weight, std, gen);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* conv = module->as<torch::nn::Conv2dImpl>()) {
      normal_init(conv->weight, std, gen);
      if (conv->bias.defined()) conv->bias.zero_();
    } else if (auto* embedding = module->as<torch::nn::EmbeddingImpl>()) {
      normal_init(embedding->weight, std, gen);
    } else if (auto* rms = module->as<RMSNormImpl>()) {
      rms->reset_parameters();
    } else if (auto* ln = module->as<LayerNormImpl>()) {
      ln->reset_parameters();
    }
  }
}

}  // namespace gradscope
