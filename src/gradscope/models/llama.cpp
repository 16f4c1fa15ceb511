#include "gradscope/models/llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {

namespace F = torch::nn::functional;
using nlohmann::json;

// ---------------------------------------------------------------------------------------
// Configuration

namespace {

const char* const kArchHint =
    "the architecture uses Hugging Face LlamaConfig names; start from a preset "
    "(--preset tiny|small|paper)";

const json* find_key(const json& arch, const char* key) {
  auto it = arch.find(key);
  if (it == arch.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t get_int(const json& arch, const char* key, std::optional<int64_t> fallback = {}) {
  const json* v = find_key(arch, key);
  if (!v) {
    if (fallback) return *fallback;
    fail_usage(fmt::format("llama architecture lacks '{}'", key), kArchHint);
  }
  // Integral floats (64.0) are accepted; 64.5 is not silently truncated.
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
  }
  fail_usage(fmt::format("llama architecture: '{}' must be an integer, got {}", key, v->dump()),
             kArchHint);
}

double get_double(const json& arch, const char* key, std::optional<double> fallback = {}) {
  const json* v = find_key(arch, key);
  if (!v) {
    if (fallback) return *fallback;
    fail_usage(fmt::format("llama architecture lacks '{}'", key), kArchHint);
  }
  if (!v->is_number()) {
    fail_usage(fmt::format("llama architecture: '{}' must be a number, got {}", key, v->dump()),
               kArchHint);
  }
  return v->get<double>();
}

bool get_bool(const json& arch, const char* key, bool fallback) {
  const json* v = find_key(arch, key);
  if (!v) return fallback;
  if (!v->is_boolean()) {
    fail_usage(
        fmt::format("llama architecture: '{}' must be true or false, got {}", key, v->dump()),
        kArchHint);
  }
  return v->get<bool>();
}

void check_positive(int64_t value, const char* key) {
  check_usage(value > 0,
              fmt::format("llama architecture: '{}' must be positive, got {}", key, value),
              kArchHint);
}

void check_dropout(double p, const char* key) {
  check_usage(p >= 0 && p < 1,
              fmt::format("llama architecture: '{}' must lie in [0, 1), got {}", key, p),
              kArchHint);
}

}  // namespace

LlamaConfig llama_config(const json& arch) {
  check_usage(arch.is_object(), "llama architecture must be a JSON object, got " + arch.dump(),
              kArchHint);
  LlamaConfig c;
  c.vocab_size = get_int(arch, "vocab_size");
  c.hidden_size = get_int(arch, "hidden_size");
  c.num_hidden_layers = get_int(arch, "num_hidden_layers");
  c.num_attention_heads = get_int(arch, "num_attention_heads");
  c.intermediate_size = get_int(arch, "intermediate_size");
  check_positive(c.vocab_size, "vocab_size");
  check_positive(c.hidden_size, "hidden_size");
  check_positive(c.num_hidden_layers, "num_hidden_layers");
  check_positive(c.num_attention_heads, "num_attention_heads");
  check_positive(c.intermediate_size, "intermediate_size");

  c.num_key_value_heads = get_int(arch, "num_key_value_heads", c.num_attention_heads);
  check_positive(c.num_key_value_heads, "num_key_value_heads");
  check_usage(c.num_attention_heads % c.num_key_value_heads == 0,
              fmt::format("llama architecture: num_attention_heads {} is not a multiple of "
                          "num_key_value_heads {}",
                          c.num_attention_heads, c.num_key_value_heads),
              kArchHint);
  if (!find_key(arch, "head_dim")) {
    check_usage(c.hidden_size % c.num_attention_heads == 0,
                fmt::format("llama architecture: hidden_size {} is not a multiple of "
                            "num_attention_heads {}",
                            c.hidden_size, c.num_attention_heads),
                "set head_dim, or pick hidden_size = heads x head size");
  }
  c.head_dim = get_int(arch, "head_dim", c.hidden_size / c.num_attention_heads);
  check_positive(c.head_dim, "head_dim");
  check_usage(c.head_dim % 2 == 0,
              fmt::format("llama architecture: head size {} must be even for rotary embeddings",
                          c.head_dim),
              kArchHint);

  c.rms_norm_eps = get_double(arch, "rms_norm_eps", 1e-6);
  check_usage(
      c.rms_norm_eps > 0,
      fmt::format("llama architecture: rms_norm_eps must be positive, got {}", c.rms_norm_eps),
      kArchHint);
  c.rope_theta = get_double(arch, "rope_theta", 10000.0);
  check_usage(c.rope_theta > 0,
              fmt::format("llama architecture: rope_theta must be positive, got {}", c.rope_theta),
              kArchHint);

  if (const json* rs = find_key(arch, "rope_scaling")) {
    check_usage(rs->is_object(), "llama architecture: rope_scaling must be an object or null",
                kArchHint);
    // Older Hugging Face configs call it "type".
    const json* type = find_key(*rs, "rope_type");
    if (!type) type = find_key(*rs, "type");
    const std::string type_name = type && type->is_string() ? type->get<std::string>() : "";
    check_usage(type_name == "llama3",
                fmt::format("llama architecture: rope_scaling type '{}' is not supported",
                            type ? type->dump() : "missing"),
                "use rope_type \"llama3\" or rope_scaling null");
    Llama3RopeScaling s;
    s.factor = get_double(*rs, "factor");
    s.low_freq_factor = get_double(*rs, "low_freq_factor");
    s.high_freq_factor = get_double(*rs, "high_freq_factor");
    s.original_max_position_embeddings = get_double(*rs, "original_max_position_embeddings");
    check_usage(s.factor > 0 && s.low_freq_factor > 0 && s.original_max_position_embeddings > 0,
                "llama architecture: rope_scaling factor, low_freq_factor and "
                "original_max_position_embeddings must be positive",
                kArchHint);
    check_usage(s.high_freq_factor > s.low_freq_factor,
                fmt::format("llama architecture: rope_scaling high_freq_factor {} must exceed "
                            "low_freq_factor {}",
                            s.high_freq_factor, s.low_freq_factor),
                kArchHint);
    c.rope_scaling = s;
  }

  c.tie_word_embeddings = get_bool(arch, "tie_word_embeddings", false);
  c.attention_bias = get_bool(arch, "attention_bias", false);
  c.mlp_bias = get_bool(arch, "mlp_bias", false);
  c.attention_dropout = get_double(arch, "attention_dropout", 0.0);
  c.hidden_dropout = get_double(arch, "hidden_dropout", 0.0);
  check_dropout(c.attention_dropout, "attention_dropout");
  check_dropout(c.hidden_dropout, "hidden_dropout");
  c.initializer_range = get_double(arch, "initializer_range", 0.02);
  check_usage(c.initializer_range >= 0,
              fmt::format("llama architecture: initializer_range must be >= 0, got {}",
                          c.initializer_range),
              kArchHint);
  return c;
}

json llama_preset(const std::string& preset) {
  // Shared by every preset: Llama 3's norm epsilon, RoPE base and long-context scaling
  // (harmless at short sequence lengths: only wavelengths beyond 2048 positions change),
  // tied embeddings and no dropout, as published.
  json arch = {
      {"model_type", "llama"},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 500000.0},
      {"rope_scaling",
       {{"rope_type", "llama3"},
        {"factor", 32.0},
        {"low_freq_factor", 1.0},
        {"high_freq_factor", 4.0},
        {"original_max_position_embeddings", 8192}}},
      {"tie_word_embeddings", true},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attention_dropout", 0.0},
      {"hidden_dropout", 0.0},
      {"initializer_range", 0.02},
      {"dataset", "sotu"},
  };
  if (preset == "tiny") {
    // bytes tokenizer: 256 bytes + 4 specials = 260, padded to 320.
    arch.update({{"tokenizer", "bytes"},
                 {"vocab_size", 320},
                 {"hidden_size", 64},
                 {"num_hidden_layers", 2},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 2},
                 {"intermediate_size", 192},
                 {"seq_len", 64}});
  } else if (preset == "small") {
    // GPT-2's 50257 tokens padded to 50304.
    arch.update({{"tokenizer", "gpt2"},
                 {"vocab_size", 50304},
                 {"hidden_size", 256},
                 {"num_hidden_layers", 6},
                 {"num_attention_heads", 8},
                 {"num_key_value_heads", 4},
                 {"intermediate_size", 768},
                 {"seq_len", 128}});
  } else if (preset == "paper") {
    // Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json).
    arch.update({{"tokenizer", "llama3"},
                 {"vocab_size", 128256},
                 {"hidden_size", 2048},
                 {"num_hidden_layers", 16},
                 {"num_attention_heads", 32},
                 {"num_key_value_heads", 8},
                 {"intermediate_size", 8192},
                 {"seq_len", 2048}});
  } else {
    fail_usage(fmt::format("unknown llama preset '{}'", preset),
               "valid presets: tiny, small, paper");
  }
  return arch;
}

int64_t llama_count_params(const json& arch) {
  const LlamaConfig c = llama_config(arch);
  const int64_t C = c.hidden_size, q_out = c.num_attention_heads * c.head_dim,
                kv_out = c.num_key_value_heads * c.head_dim, I = c.intermediate_size;
  int64_t attn = C * q_out + 2 * C * kv_out + q_out * C;  // q, k, v, o
  if (c.attention_bias) attn += q_out + 2 * kv_out + C;
  int64_t mlp = 3 * C * I;  // gate, up, down
  if (c.mlp_bias) mlp += 2 * I + C;
  const int64_t norms = 2 * C;  // input_layernorm, post_attention_layernorm
  const int64_t embed = c.vocab_size * C;
  const int64_t head = c.tie_word_embeddings ? 0 : c.vocab_size * C;
  return embed + c.num_hidden_layers * (attn + mlp + norms) + C + head;
}

double llama_forward_flops_per_token(const json& arch, int64_t seq_len) {
  check_usage(seq_len > 0, fmt::format("sequence length must be positive, got {}", seq_len),
              "pass --seq with a positive length");
  const LlamaConfig c = llama_config(arch);
  const double C = static_cast<double>(c.hidden_size);
  const double q_out = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv_out = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double I = static_cast<double>(c.intermediate_size);
  const double L = static_cast<double>(c.num_hidden_layers);
  const double layer_matmul = C * q_out + 2 * C * kv_out + q_out * C + 3 * C * I;
  const double head_matmul = static_cast<double>(c.vocab_size) * C;
  const double attention = 2.0 * 2.0 * static_cast<double>(seq_len) * q_out;  // QK^T and AV
  return 2.0 * (L * layer_matmul + head_matmul) + L * attention;
}

// ---------------------------------------------------------------------------------------
// Modules

LlamaBlock::LlamaBlock(const LlamaConfig& config) : hidden_dropout_(config.hidden_dropout) {
  input_layernorm = register_module(
      "input_layernorm", RMSNorm(RMSNormOptions(config.hidden_size).eps(config.rms_norm_eps)));
  self_attn = register_module(
      "self_attn",
      SelfAttention(SelfAttentionOptions(config.hidden_size, config.num_attention_heads)
                        .num_kv_heads(config.num_key_value_heads)
                        .head_size(config.head_dim)
                        .bias(config.attention_bias)
                        .dropout(config.attention_dropout)));
  post_attention_layernorm =
      register_module("post_attention_layernorm",
                      RMSNorm(RMSNormOptions(config.hidden_size).eps(config.rms_norm_eps)));
  mlp = register_module(
      "mlp",
      SwiGLU(SwiGLUOptions(config.hidden_size, config.intermediate_size).bias(config.mlp_bias)));
}

torch::Tensor LlamaBlock::forward(const torch::Tensor& x, const BlockContext& ctx) {
  // Each residual sub-layer, dropout and the residual sum included, is one function: a
  // recompute of it draws its dropout masks again under the generator state the checkpoint
  // restores, and sums its input's gradient in the order plain backward does.
  const double p = is_training() ? hidden_dropout_ : 0.0;
  auto drop = [p](const torch::Tensor& t) {
    return p > 0 ? F::dropout(t, F::DropoutFuncOptions().p(p).training(true)) : t;
  };
  SubLayerFn attention_sublayer = [this, ctx, drop](const torch::Tensor& in) {
    return in + drop(self_attn(input_layernorm(in), ctx.rope_cos, ctx.rope_sin, ctx.mask,
                               /*is_causal=*/true));  // (B, T, C)
  };
  SubLayerFn mlp_sublayer = [this, drop](const torch::Tensor& in) {
    return in + drop(mlp(post_attention_layernorm(in)));  // (B, T, C)
  };
  auto h = run_sublayer(SubLayer::kSubLayerAttention, attention_sublayer, x);  // (B, T, C)
  return run_sublayer(SubLayer::kSubLayerMlp, mlp_sublayer, h);                // (B, T, C)
}

static RotaryOptions rotary_options(const LlamaConfig& c) {
  RotaryOptions o(c.head_dim);
  o.theta(c.rope_theta);
  o.llama3_scaling(c.rope_scaling);
  return o;
}

LlamaModel::LlamaModel(const LlamaConfig& config) : config_(config), rope_(rotary_options(config)) {
  embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto block = std::make_shared<LlamaBlock>(config);
    layers->push_back(block);
    blocks_.push_back(block);
  }
  norm =
      register_module("norm", RMSNorm(RMSNormOptions(config.hidden_size).eps(config.rms_norm_eps)));
  if (!config.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(
            torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
  }
}

void LlamaModel::init_weights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const double init_std = config_.initializer_range;
  // Drawn on the CPU in float32 whatever the parameter's device and dtype, so that a seed
  // means the same weights everywhere.
  auto normal = [&](torch::Tensor& w) {
    auto draw = torch::empty(w.sizes(), torch::TensorOptions().dtype(torch::kFloat));
    draw.normal_(0.0, init_std, gen);
    w.copy_(draw);
  };
  // modules() walks in registration order, so the draws come in a fixed order.
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::LinearImpl>()) {
      normal(linear->weight);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = module->as<torch::nn::EmbeddingImpl>()) {
      normal(embedding->weight);
    } else if (auto* rms = module->as<RMSNormImpl>()) {
      rms->reset_parameters();
    }
  }
}

std::vector<std::shared_ptr<Block>> LlamaModel::blocks() {
  return {blocks_.begin(), blocks_.end()};
}

torch::Tensor LlamaModel::embed(const torch::Tensor& input_ids) {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kLong,
              "llama: input_ids must be (B, T) int64, got ", input_ids.sizes(), " ",
              input_ids.scalar_type());
  return embed_tokens(input_ids);  // (B, T, C)
}

torch::Tensor LlamaModel::decode(const torch::Tensor& inputs_embeds) {
  TORCH_CHECK(inputs_embeds.dim() == 3 && inputs_embeds.size(2) == config_.hidden_size,
              "llama: embeddings must be (B, T, ", config_.hidden_size, "), got ",
              inputs_embeds.sizes());
  const RopeTables& rope = rope_.get(inputs_embeds.size(1), inputs_embeds.device());
  BlockContext ctx;
  ctx.rope_cos = rope.cos;          // (T, HS)
  ctx.rope_sin = rope.sin;          // (T, HS)
  torch::Tensor x = inputs_embeds;  // (B, T, C)
  for (const auto& block : blocks_) x = run_block(*block, x, ctx);
  return norm(x);  // (B, T, C)
}

torch::Tensor LlamaModel::lm_logits(const torch::Tensor& hidden) {
  if (lm_head) return lm_head(hidden);             // (B, T, V)
  return F::linear(hidden, embed_tokens->weight);  // (B, T, V)
}

torch::Tensor LlamaModel::logits(const torch::Tensor& input_ids) {
  return lm_logits(decode(embed(input_ids)));  // (B, T, V)
}

LossOutput LlamaModel::loss(const Batch& batch) {
  TORCH_CHECK(batch.input_ids.defined() && batch.targets.defined(),
              "llama: a batch needs input_ids and targets");
  TORCH_CHECK(batch.targets.sizes() == batch.input_ids.sizes(), "llama: targets ",
              batch.targets.sizes(), " do not match input_ids ", batch.input_ids.sizes());
  auto lg = logits(batch.input_ids);  // (B, T, V)
  LossOutput out;
  out.loss_sum = F::cross_entropy(
      lg.reshape({-1, lg.size(-1)}), batch.targets.reshape({-1}),
      F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kIgnoreIndex));  // ()
  out.target_count = batch.targets.ne(kIgnoreIndex).sum().item<int64_t>();
  return out;
}

std::shared_ptr<Model> make_llama(const json& arch, uint64_t seed) {
  auto model = std::make_shared<LlamaModel>(llama_config(arch));
  model->init_weights(seed);
  return model;
}

}  // namespace gradscope
