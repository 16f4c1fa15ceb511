#include "gradscope/models/llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/models/common/arch.h"
#include "gradscope/models/common/lm_loss.h"

namespace gradscope {

namespace F = torch::nn::functional;
using nlohmann::json;

// ---------------------------------------------------------------------------------------
// Configuration

LlamaConfig llama_config(const json& arch) {
  const ArchReader r(arch, "llama");
  LlamaConfig c;
  c.vocab_size = r.positive("vocab_size");
  c.hidden_size = r.positive("hidden_size");
  c.num_hidden_layers = r.positive("num_hidden_layers");
  c.num_attention_heads = r.positive("num_attention_heads");
  c.intermediate_size = r.positive("intermediate_size");
  c.num_key_value_heads = r.positive("num_key_value_heads", c.num_attention_heads);
  r.check(c.num_attention_heads % c.num_key_value_heads == 0,
          fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}",
                      c.num_attention_heads, c.num_key_value_heads));
  if (!r.find("head_dim")) {
    r.check(c.hidden_size % c.num_attention_heads == 0,
            fmt::format("hidden_size {} is not a multiple of num_attention_heads {} (set "
                        "head_dim, or pick hidden_size = heads x head size)",
                        c.hidden_size, c.num_attention_heads));
  }
  c.head_dim = r.positive("head_dim", c.hidden_size / c.num_attention_heads);
  r.check(c.head_dim % 2 == 0,
          fmt::format("head size {} must be even for rotary embeddings", c.head_dim));

  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  r.check(c.rms_norm_eps > 0, fmt::format("rms_norm_eps must be positive, got {}", c.rms_norm_eps));
  c.rope_theta = r.number("rope_theta", 10000.0);
  r.check(c.rope_theta > 0, fmt::format("rope_theta must be positive, got {}", c.rope_theta));

  if (const json* rs = r.find("rope_scaling")) {
    r.check(rs->is_object(), "rope_scaling must be an object or null");
    const ArchReader s(*rs, "llama rope_scaling");
    // Older Hugging Face configs call it "type".
    const std::string type = s.text("rope_type", s.find("type") ? s.text("type") : "missing");
    s.check(type == "llama3", fmt::format("type '{}' is not supported (use rope_type \"llama3\" "
                                          "or rope_scaling null)",
                                          type));
    Llama3RopeScaling scaling;
    scaling.factor = s.number("factor");
    scaling.low_freq_factor = s.number("low_freq_factor");
    scaling.high_freq_factor = s.number("high_freq_factor");
    scaling.original_max_position_embeddings = s.number("original_max_position_embeddings");
    s.check(scaling.factor > 0 && scaling.low_freq_factor > 0 &&
                scaling.original_max_position_embeddings > 0,
            "factor, low_freq_factor and original_max_position_embeddings must be positive");
    s.check(scaling.high_freq_factor > scaling.low_freq_factor,
            fmt::format("high_freq_factor {} must exceed low_freq_factor {}",
                        scaling.high_freq_factor, scaling.low_freq_factor));
    c.rope_scaling = scaling;
  }

  c.tie_word_embeddings = r.flag("tie_word_embeddings", false);
  c.attention_bias = r.flag("attention_bias", false);
  c.mlp_bias = r.flag("mlp_bias", false);
  c.attention_dropout = r.dropout("attention_dropout");
  c.hidden_dropout = r.dropout("hidden_dropout");
  c.initializer_range = r.number("initializer_range", 0.02);
  r.check(c.initializer_range >= 0,
          fmt::format("initializer_range must be >= 0, got {}", c.initializer_range));
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
    return dropout(t, p);
  };
  SubLayerFn attention_sublayer = [this, ctx, drop](const torch::Tensor& in) {
    return in + drop(self_attn(input_layernorm(in), ctx.rope_cos, ctx.rope_sin, ctx.mask,
                               /*is_causal=*/!ctx.mask_includes_causal));  // (B, T, C)
  };
  SubLayerFn mlp_sublayer = [this, drop](const torch::Tensor& in) {
    return in + drop(mlp(post_attention_layernorm(in)));  // (B, T, C)
  };
  auto h = run_sublayer(SubLayer::kAttention, attention_sublayer, x);  // (B, T, C)
  return run_sublayer(SubLayer::kMlp, mlp_sublayer, h);                // (B, T, C)
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
  at::Generator gen = at::detail::createCPUGenerator(seed);
  init_weights_normal(*this, config_.initializer_range, gen);
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
  const BlockContext ctx = context(inputs_embeds.size(1), inputs_embeds.device());
  torch::Tensor x = inputs_embeds;  // (B, T, C)
  for (const auto& block : blocks_) x = run_block(*block, x, ctx);
  return norm(x);  // (B, T, C)
}

BlockContext LlamaModel::context(int64_t seq_len, const torch::Device& device) {
  const RopeTables& rope = rope_.get(seq_len, device);
  BlockContext ctx;
  ctx.rope_cos = rope.cos;  // (T, HS)
  ctx.rope_sin = rope.sin;  // (T, HS)
  return ctx;
}

torch::Tensor LlamaModel::lm_logits(const torch::Tensor& hidden) {
  return head_logits(hidden, lm_head ? lm_head->weight : embed_tokens->weight);  // (B, T, V)
}

torch::Tensor LlamaModel::chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& targets,
                                          int64_t chunk_rows) {
  const torch::Tensor& weight = lm_head ? lm_head->weight : embed_tokens->weight;  // (V, C)
  return chunked_cross_entropy(hidden.reshape({-1, hidden.size(-1)}), weight, {},
                               targets.reshape({-1}), chunk_rows, kIgnoreIndex);  // ()
}

torch::Tensor LlamaModel::logits(const torch::Tensor& input_ids) {
  return lm_logits(decode(embed(input_ids)));  // (B, T, V)
}

LossOutput LlamaModel::loss(const Batch& batch) {
  TORCH_CHECK(batch.input_ids.defined() && batch.targets.defined(),
              "llama: a batch needs input_ids and targets");
  TORCH_CHECK(batch.targets.sizes() == batch.input_ids.sizes(), "llama: targets ",
              batch.targets.sizes(), " do not match input_ids ", batch.input_ids.sizes());
  auto hidden = decode(embed(batch.input_ids));  // (B, T, C)
  const LossOptions& options = loss_options();
  LossOutput out;
  {
    const LossHeadScope head(options, is_training());
    if (options.chunked) {
      out.loss_sum = chunked_lm_loss(hidden, batch.targets, options.chunk_rows);  // ()
    } else {
      auto lg = lm_logits(hidden);  // (B, T, V)
      if (options.keep_logits) out.logits = lg.detach().clone();  // the loss overwrites lg
      out.loss_sum = cross_entropy_sum(lg.reshape({-1, lg.size(-1)}), batch.targets.reshape({-1}),
                                       kIgnoreIndex);  // ()
    }  // the logits are gone unless backward keeps them
  }
  // The batch counted its targets on the CPU; counting them here would wait for the device.
  out.target_count = batch.targets_count > 0 ? batch.targets_count
                                             : batch.targets.ne(kIgnoreIndex).sum().item<int64_t>();
  return out;
}

std::shared_ptr<Model> make_llama(const json& arch, uint64_t seed) {
  auto model = std::make_shared<LlamaModel>(llama_config(arch));
  model->init_weights(seed);
  return model;
}

}  // namespace gradscope

// ---------------------------------------------------------------------------------------
// Memory trace (models/common/memory_trace.h), mirroring the forward above.

namespace gradscope {

MemoryTrace::Id trace_llama_blocks(const LlamaConfig& c, int64_t batch, int64_t tokens,
                                   MemoryTrace::Id x, int64_t mask_bytes, MemoryTrace& trace) {
  using Unit = MemoryTrace::Unit;
  const int64_t n = batch * tokens, C = c.hidden_size;
  MemoryTrace::AttentionShape shape{
      batch, tokens, C, c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  shape.bias = c.attention_bias;
  shape.rotary = true;
  shape.dropout = c.attention_dropout;
  // Without a mask of the batch's, the math path builds the causal one on each call.
  shape.mask_bytes = mask_bytes > 0 ? mask_bytes : tokens * tokens;
  shape.batch_mask = mask_bytes > 0;
  shape.causal = true;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    trace.begin(Unit::kBlock, x);
    trace.begin(Unit::kAttention, x);
    const auto normed = trace.rms_norm(x, n, C);
    const auto a = trace.self_attention(normed, shape);
    trace.release(normed);
    const auto h = trace.residual(x, a, c.hidden_dropout);
    trace.end(Unit::kAttention, h);
    trace.begin(Unit::kMlp, h);
    const auto normed2 = trace.rms_norm(h, n, C);
    // SwiGLU: down(silu(gate(x)) * up(x))
    MemoryTrace::Id product;
    if (trace.packed_projections()) {
      // gate and up are views of one (n, 2I) output, which silu and the product save.
      const int64_t I = c.intermediate_size;
      const auto parts = trace.packed_linear(normed2, n, C, {I, I}, c.mlp_bias);
      // An adapted part is a tensor of its own, saved in place of the packed output.
      const auto gate = trace.adapt(normed2, parts[1], n, C, I, "gate");
      const auto up = trace.adapt(normed2, parts[2], n, C, I, "up");
      const auto act = trace.alloc(n * I * MemoryTrace::kFloat);
      trace.node({gate == parts[1] ? parts[0] : gate}, {gate}, {act});
      product = trace.alloc(n * I * MemoryTrace::kFloat);
      trace.node({act, up == parts[2] ? parts[0] : up}, {act, up}, {product});
      trace.release(act);
      trace.release(parts[0]);
      if (gate != parts[1]) trace.release(gate);
      if (up != parts[2]) trace.release(up);
    } else {
      const int64_t I = c.intermediate_size;
      const auto gate =
          trace.adapt(normed2, trace.linear(normed2, n, C, I, c.mlp_bias), n, C, I, "gate");
      const auto act = trace.activation(gate);
      const auto up =
          trace.adapt(normed2, trace.linear(normed2, n, C, I, c.mlp_bias), n, C, I, "up");
      product = trace.mul(act, up);
      trace.release(gate);
      trace.release(act);
      trace.release(up);
    }
    const auto m =
        trace.adapt(product, trace.linear(product, n, c.intermediate_size, C, c.mlp_bias), n,
                    c.intermediate_size, C, "down");
    trace.release(product);
    trace.release(normed2);
    const auto out = trace.residual(h, m, c.hidden_dropout);
    trace.end(Unit::kMlp, out);
    trace.end(Unit::kBlock, out);
    trace.release(x);
    trace.release(h);
    x = out;
  }
  return x;
}

void trace_llama_head(const LlamaConfig& c, MemoryTrace::Id x, int64_t rows, int embedding,
                      MemoryTrace& trace) {
  const auto hidden = trace.rms_norm(x, rows, c.hidden_size);
  trace.release(x);
  trace.begin_head();
  trace.lm_loss(hidden, rows, c.hidden_size, c.vocab_size, false,
                c.tie_word_embeddings ? embedding : -1);
  trace.release(hidden);
}

void llama_trace_step(const json& arch, int64_t batch, MemoryTrace& trace) {
  const LlamaConfig c = llama_config(arch);
  const int64_t T = arch.at("seq_len").get<int64_t>(), n = batch * T, C = c.hidden_size;
  trace.persistent(2 * n * MemoryTrace::kLong);                // input_ids, targets
  trace.persistent(2 * T * c.head_dim * MemoryTrace::kFloat);  // rotary cos, sin
  int embedding = -1;
  auto x = trace.embedding(n, c.vocab_size, C, &embedding);
  x = trace_llama_blocks(c, batch, T, x, 0, trace);
  trace_llama_head(c, x, n, embedding, trace);
}

}  // namespace gradscope
