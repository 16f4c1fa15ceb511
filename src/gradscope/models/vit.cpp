#include "gradscope/models/vit.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/models/common/arch.h"

namespace gradscope {

namespace F = torch::nn::functional;
using nlohmann::json;

// ---------------------------------------------------------------------------------------
// Configuration

VisionConfig vision_config(const json& arch, const std::string& model, const std::string& prefix) {
  const ArchReader r(arch, model);
  auto key = [&](const char* name) { return prefix + name; };
  VisionConfig c;
  c.hidden_size = r.positive(key("hidden_size").c_str());
  c.num_hidden_layers = r.positive(key("num_hidden_layers").c_str());
  c.num_attention_heads = r.positive(key("num_attention_heads").c_str());
  c.intermediate_size = r.positive(key("intermediate_size").c_str());
  c.image_size = r.positive("image_size");
  c.patch_size = r.positive("patch_size");
  c.num_channels = r.positive("num_channels", 3);
  c.layer_norm_eps = r.number(key("layer_norm_eps").c_str(), 1e-12);
  c.qkv_bias = r.flag("qkv_bias", true);
  const std::string act = r.text(key("hidden_act").c_str(), "gelu");
  r.check(
      act == "gelu" || act == "gelu_pytorch_tanh",
      fmt::format("{} '{}' is not supported (gelu or gelu_pytorch_tanh)", key("hidden_act"), act));
  c.gelu_tanh = act == "gelu_pytorch_tanh";
  c.hidden_dropout = r.dropout("hidden_dropout");
  c.attention_dropout = r.dropout("attention_dropout");
  c.initializer_range = r.number("initializer_range", 0.02);
  r.check(c.layer_norm_eps > 0, "layer_norm_eps must be positive");
  r.check(c.hidden_size % c.num_attention_heads == 0,
          fmt::format("{} {} is not a multiple of {} {}", key("hidden_size"), c.hidden_size,
                      key("num_attention_heads"), c.num_attention_heads));
  r.check(
      c.image_size % c.patch_size == 0,
      fmt::format("image_size {} is not a multiple of patch_size {}", c.image_size, c.patch_size));
  return c;
}

int64_t vision_count_params(const VisionConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size, P = c.patch_size;
  const int64_t patch = c.num_channels * P * P * C + C;  // convolution weight and bias
  const int64_t cls = c.class_token ? C : 0;
  const int64_t positions = c.num_tokens() * C;
  const int64_t attn = 4 * C * C + (c.qkv_bias ? 4 * C : 0);  // q, k, v, o
  const int64_t mlp = 2 * C * I + I + C;                      // fc1, fc2 with biases
  const int64_t norms = 2 * 2 * C;                            // two LayerNorms with bias
  return patch + cls + positions + c.num_hidden_layers * (attn + mlp + norms) + 2 * C;
}

double vision_forward_flops_per_image(const VisionConfig& c) {
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double N = static_cast<double>(c.num_patches()), T = static_cast<double>(c.num_tokens());
  const double P = static_cast<double>(c.patch_size);
  const double patch = 2.0 * N * c.num_channels * P * P * C;
  const double layer = 2.0 * T * (4 * C * C + 2 * C * I)  // q, k, v, o, fc1, fc2
                       + 2.0 * 2.0 * T * T * C;           // scores and weighted sum
  return patch + c.num_hidden_layers * layer;
}

// ---------------------------------------------------------------------------------------
// Modules

EncoderBlock::EncoderBlock(const VisionConfig& config) : hidden_dropout_(config.hidden_dropout) {
  const int64_t C = config.hidden_size;
  layernorm_before = register_module("layernorm_before",
                                     LayerNorm(LayerNormOptions(C).eps(config.layer_norm_eps)));
  attention =
      register_module("attention", SelfAttention(SelfAttentionOptions(C, config.num_attention_heads)
                                                     .bias(config.qkv_bias)
                                                     .dropout(config.attention_dropout)));
  layernorm_after =
      register_module("layernorm_after", LayerNorm(LayerNormOptions(C).eps(config.layer_norm_eps)));
  mlp = register_module("mlp", GeluMLP(GeluMLPOptions(C, config.intermediate_size)
                                           .tanh_approximation(config.gelu_tanh)));
}

torch::Tensor EncoderBlock::forward(const torch::Tensor& x, const BlockContext& ctx) {
  // As in LlamaBlock: each residual sub-layer, dropout and sum included, is one function, so
  // a recompute draws the same dropout masks and sums gradients in plain backward's order.
  const double p = is_training() ? hidden_dropout_ : 0.0;
  auto drop = [p](const torch::Tensor& t) {
    return dropout(t, p);
  };
  SubLayerFn attention_sublayer = [this, drop](const torch::Tensor& in) {
    return in + drop(attention(layernorm_before(in)));  // (B, T, C)
  };
  SubLayerFn mlp_sublayer = [this, drop](const torch::Tensor& in) {
    return in + drop(mlp(layernorm_after(in)));  // (B, T, C)
  };
  auto h = run_sublayer(SubLayer::kAttention, attention_sublayer, x);  // (B, T, C)
  return run_sublayer(SubLayer::kMlp, mlp_sublayer, h);                // (B, T, C)
}

VisionEncoderImpl::VisionEncoderImpl(const VisionConfig& config) : config_(config) {
  const int64_t C = config.hidden_size;
  patch_embeddings = register_module("patch_embeddings",
                                     PatchEmbedding(config.num_channels, C, config.patch_size));
  if (config.class_token) cls_token = register_parameter("cls_token", torch::zeros({1, 1, C}));
  position_embeddings =
      register_parameter("position_embeddings", torch::zeros({1, config.num_tokens(), C}));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto block = std::make_shared<EncoderBlock>(config);
    layers->push_back(block);
    blocks_.push_back(block);
  }
  layernorm =
      register_module("layernorm", LayerNorm(LayerNormOptions(C).eps(config.layer_norm_eps)));
}

void VisionEncoderImpl::init_weights(at::Generator& gen) {
  init_weights_normal(*this, config_.initializer_range, gen);
  if (cls_token.defined()) normal_init(cls_token, config_.initializer_range, gen);
  normal_init(position_embeddings, config_.initializer_range, gen);
}

torch::Tensor VisionEncoderImpl::forward(const torch::Tensor& images, const BlockRunner& run) {
  TORCH_CHECK(images.dim() == 4 && images.size(2) == config_.image_size &&
                  images.size(3) == config_.image_size,
              "vision encoder expects (B, ", config_.num_channels, ", ", config_.image_size, ", ",
              config_.image_size, ") images, got ", images.sizes());
  auto x = patch_embeddings(images);  // (B, N, C)
  if (cls_token.defined()) {
    x = torch::cat({cls_token.expand({x.size(0), 1, x.size(2)}).to(x.scalar_type()), x}, 1);
  }  // (B, T, C)
  x = x + position_embeddings;
  if (is_training() && config_.hidden_dropout > 0) {
    x = dropout(x, config_.hidden_dropout);
  }
  const BlockContext ctx;  // no rotary tables, no mask
  for (const auto& block : blocks_) x = run(*block, x, ctx);
  return layernorm(x);  // (B, T, C)
}

ViTModel::ViTModel(const VisionConfig& config, int64_t num_labels) {
  TORCH_CHECK(config.class_token, "ViT classifies from its class token");
  encoder = register_module("encoder", VisionEncoder(config));
  classifier = register_module("classifier", torch::nn::Linear(config.hidden_size, num_labels));
}

void ViTModel::init_weights(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  encoder->init_weights(gen);
  init_weights_normal(*classifier, encoder->config().initializer_range, gen);
}

torch::Tensor ViTModel::logits(const torch::Tensor& images) {
  auto hidden =
      encoder->forward(images, [this](Block& b, const torch::Tensor& x, const BlockContext& c) {
        return run_block(b, x, c);
      });
  return classifier(hidden.select(1, 0));  // class token (B, C) -> (B, K)
}

LossOutput ViTModel::loss(const Batch& batch) {
  TORCH_CHECK(batch.images.defined() && batch.labels.defined(),
              "vit: a batch needs images and labels");
  auto lg = logits(batch.images);  // (B, K)
  LossOutput out;
  out.loss_sum = F::cross_entropy(lg.to(torch::kFloat), batch.labels,
                                  F::CrossEntropyFuncOptions().reduction(torch::kSum));  // ()
  if (loss_options().keep_logits) out.logits = lg.detach();
  out.target_count = batch.labels.size(0);
  // Counted in evaluation only: .item() synchronizes the device, which the training step
  // must not pay for a number it does not use.
  if (!is_training()) out.correct = lg.argmax(-1).eq(batch.labels).sum().item<int64_t>();
  return out;
}

// ---------------------------------------------------------------------------------------
// Presets and counts

json vit_preset(const std::string& preset) {
  // Shared: ViT's LayerNorm epsilon, biases, Fashion-MNIST, and dropout 0.1 on the embeddings
  // and sub-layer outputs, as the ViT paper trained ViT-B/16 from scratch (its Table 3; the
  // published google/vit-base-patch16-224 config, a fine-tuned checkpoint, says 0.0).
  json arch = {{"model_type", "vit"},       {"num_channels", 3},         {"layer_norm_eps", 1e-12},
               {"qkv_bias", true},          {"hidden_act", "gelu"},      {"hidden_dropout", 0.1},
               {"attention_dropout", 0.0},  {"initializer_range", 0.02}, {"num_labels", 10},
               {"dataset", "fashion-mnist"}};
  if (preset == "tiny") {
    arch.update({{"image_size", 28},
                 {"patch_size", 7},
                 {"hidden_size", 64},
                 {"num_hidden_layers", 2},
                 {"num_attention_heads", 4},
                 {"intermediate_size", 128}});
  } else if (preset == "small") {
    arch.update({{"image_size", 32},
                 {"patch_size", 4},
                 {"hidden_size", 192},
                 {"num_hidden_layers", 6},
                 {"num_attention_heads", 3},
                 {"intermediate_size", 768}});
  } else if (preset == "paper") {
    // ViT-B/16 (google/vit-base-patch16-224), trained here with a 10-class head.
    arch.update({{"image_size", 224},
                 {"patch_size", 16},
                 {"hidden_size", 768},
                 {"num_hidden_layers", 12},
                 {"num_attention_heads", 12},
                 {"intermediate_size", 3072}});
  } else {
    fail_usage(fmt::format("unknown vit preset '{}'", preset), "valid presets: tiny, small, paper");
  }
  vit_finalize_arch(arch);
  return arch;
}

void vit_finalize_arch(json& arch) {
  const VisionConfig c = vision_config(arch, "vit");
  arch["seq_len"] = c.num_tokens();
}

static int64_t num_labels(const json& arch) {
  return ArchReader(arch, "vit").positive("num_labels");
}

int64_t vit_count_params(const json& arch) {
  const VisionConfig c = vision_config(arch, "vit");
  return vision_count_params(c) + (c.hidden_size + 1) * num_labels(arch);
}

double vit_forward_flops_per_token(const json& arch, int64_t seq_len) {
  const VisionConfig c = vision_config(arch, "vit");
  check_usage(seq_len == c.num_tokens(),
              fmt::format("vit sees {} tokens per image, not {}", c.num_tokens(), seq_len),
              "the token count follows image_size and patch_size");
  const double head = 2.0 * c.hidden_size * num_labels(arch);
  return (vision_forward_flops_per_image(c) + head) / static_cast<double>(c.num_tokens());
}

std::shared_ptr<Model> make_vit(const json& arch, uint64_t seed) {
  auto model = std::make_shared<ViTModel>(vision_config(arch, "vit"), num_labels(arch));
  model->init_weights(seed);
  return model;
}

}  // namespace gradscope

// ---------------------------------------------------------------------------------------
// Memory trace (models/common/memory_trace.h), mirroring the forward above.

namespace gradscope {

MemoryTrace::Id trace_vision_encoder(const VisionConfig& c, int64_t batch, MemoryTrace& trace) {
  using Unit = MemoryTrace::Unit;
  constexpr int64_t F4 = MemoryTrace::kFloat;
  const int64_t C = c.hidden_size, N = c.num_patches(), T = c.num_tokens(), n = batch * T;
  const int64_t image_bytes = batch * c.num_channels * c.image_size * c.image_size * F4;
  trace.persistent(image_bytes);
  // Patch convolution (kernel = stride): im2col columns the size of the images, in forward
  // and again for the weight's gradient.
  const int conv_w = trace.param(c.num_channels * c.patch_size * c.patch_size * C * F4);
  const int conv_b = trace.param(C * F4);
  const auto columns = trace.alloc(image_bytes);
  const auto grid = trace.alloc(batch * N * C * F4);
  trace.release(columns);
  trace.node({}, {}, {grid}, {conv_w, conv_b}, image_bytes);
  auto x = grid;
  if (c.class_token) {
    const int cls = trace.param(C * F4);
    x = trace.alloc(n * C * F4);  // cat(class token, patches)
    trace.node({}, {grid}, {x}, {cls});
    trace.release(grid);
  }
  const int positions = trace.param(T * C * F4);
  const auto h = trace.add(x, -1, positions);
  trace.release(x);
  x = trace.drop(h, c.hidden_dropout);
  MemoryTrace::AttentionShape shape{
      batch, T, C, c.num_attention_heads, c.num_attention_heads, C / c.num_attention_heads};
  shape.bias = c.qkv_bias;
  shape.dropout = c.attention_dropout;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    trace.begin(Unit::kBlock, x);
    trace.begin(Unit::kAttention, x);
    const auto normed = trace.layer_norm(x, n, C, true);
    const auto a = trace.self_attention(normed, shape);
    trace.release(normed);
    const auto mid = trace.residual(x, a, c.hidden_dropout);
    trace.end(Unit::kAttention, mid);
    trace.begin(Unit::kMlp, mid);
    const auto normed2 = trace.layer_norm(mid, n, C, true);
    // GELU MLP: fc2(gelu(fc1(x)))
    const auto up = trace.adapt(normed2, trace.linear(normed2, n, C, c.intermediate_size, true), n,
                                C, c.intermediate_size, "up");
    const auto act = trace.activation(up);
    trace.release(up);
    const auto m = trace.adapt(act, trace.linear(act, n, c.intermediate_size, C, true), n,
                               c.intermediate_size, C, "down");
    trace.release(act);
    trace.release(normed2);
    const auto out = trace.residual(mid, m, c.hidden_dropout);
    trace.end(Unit::kMlp, out);
    trace.end(Unit::kBlock, out);
    trace.release(x);
    trace.release(mid);
    x = out;
  }
  const auto hidden = trace.layer_norm(x, n, C, true);
  trace.release(x);
  return hidden;
}

void vit_trace_step(const json& arch, int64_t batch, MemoryTrace& trace) {
  const VisionConfig c = vision_config(arch, "vit");
  const int64_t K = num_labels(arch), C = c.hidden_size;
  trace.persistent(batch * MemoryTrace::kLong);  // labels
  const auto hidden = trace_vision_encoder(c, batch, trace);
  // The classifier reads the class token, a view of the last norm's output, which it keeps.
  const auto cls = trace.view(batch * C * MemoryTrace::kFloat);
  trace.node({}, {hidden}, {cls});  // select: its backward fills a (B, T, C) zero gradient
  // With LoRA the classifier trains beside the adapters (ViTModel::lora_trainable).
  const bool frozen = trace.frozen();
  trace.set_frozen(false);
  const auto logits = trace.linear(cls, batch, C, K, true, -1, hidden);
  trace.set_frozen(frozen);
  trace.release(hidden);
  trace.cross_entropy(logits, batch, K);
  trace.release(logits);
}

}  // namespace gradscope
