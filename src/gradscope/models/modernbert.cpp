#include "gradscope/models/modernbert.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/models/common/arch.h"
#include "gradscope/models/common/lm_loss.h"

namespace gradscope {

namespace F = torch::nn::functional;
using nlohmann::json;

ModernBertConfig modernbert_config(const json& arch) {
  const ArchReader r(arch, "modernbert");
  ModernBertConfig c;
  c.vocab_size = r.positive("vocab_size");
  c.hidden_size = r.positive("hidden_size");
  c.num_hidden_layers = r.positive("num_hidden_layers");
  c.num_attention_heads = r.positive("num_attention_heads");
  c.intermediate_size = r.positive("intermediate_size");
  c.global_attn_every_n_layers = r.positive("global_attn_every_n_layers", 3);
  c.local_attention = r.positive("local_attention", 128);
  r.check(
      c.local_attention % 2 == 0,
      fmt::format("local_attention {} must be even (half of it on each side)", c.local_attention));
  c.global_rope_theta = r.number("global_rope_theta", 160000.0);
  c.local_rope_theta = r.number("local_rope_theta", 10000.0);
  r.check(c.global_rope_theta > 0 && c.local_rope_theta > 0, "rope thetas must be positive");
  c.norm_eps = r.number("norm_eps", 1e-5);
  r.check(c.norm_eps > 0, "norm_eps must be positive");
  c.norm_bias = r.flag("norm_bias", false);
  c.attention_bias = r.flag("attention_bias", false);
  c.mlp_bias = r.flag("mlp_bias", false);
  c.decoder_bias = r.flag("decoder_bias", true);
  c.hidden_dropout = r.dropout("hidden_dropout");
  c.attention_dropout = r.dropout("attention_dropout");
  c.initializer_range = r.number("initializer_range", 0.02);
  r.check(c.hidden_size % c.num_attention_heads == 0,
          fmt::format("hidden_size {} is not a multiple of num_attention_heads {}", c.hidden_size,
                      c.num_attention_heads));
  r.check(c.head_dim() % 2 == 0,
          fmt::format("head size {} must be even for rotary embeddings", c.head_dim()));
  const double p = r.number("mlm_probability", 0.3);
  r.check(p > 0 && p < 1, fmt::format("mlm_probability must lie in (0, 1), got {}", p));
  return c;
}

// ---------------------------------------------------------------------------------------
// Modules

ModernBertBlock::ModernBertBlock(const ModernBertConfig& config, int64_t layer)
    : global_(config.is_global(layer)), hidden_dropout_(config.hidden_dropout) {
  const int64_t C = config.hidden_size;
  const LayerNormOptions norm = LayerNormOptions(C).eps(config.norm_eps).bias(config.norm_bias);
  // The embedding norm right before layer 0 makes a second one redundant.
  if (layer > 0) attn_norm = register_module("attn_norm", LayerNorm(norm));
  attn = register_module("attn", SelfAttention(SelfAttentionOptions(C, config.num_attention_heads)
                                                   .bias(config.attention_bias)
                                                   .dropout(config.attention_dropout)));
  mlp_norm = register_module("mlp_norm", LayerNorm(norm));
  mlp = register_module("mlp", GeGLU(GeluMLPOptions(C, config.intermediate_size)
                                         .bias(config.mlp_bias)
                                         .dropout(config.hidden_dropout)));
}

torch::Tensor ModernBertBlock::forward(const torch::Tensor& x, const BlockContext& ctx) {
  const double p = is_training() ? hidden_dropout_ : 0.0;
  auto drop = [p](const torch::Tensor& t) {
    return dropout(t, p);
  };
  const torch::Tensor& cos = global_ ? ctx.rope_cos : ctx.rope_cos_local;
  const torch::Tensor& sin = global_ ? ctx.rope_sin : ctx.rope_sin_local;
  const torch::Tensor& mask = global_ ? ctx.mask : ctx.mask_local;
  SubLayerFn attention_sublayer = [this, drop, cos, sin, mask](const torch::Tensor& in) {
    auto normed = attn_norm ? attn_norm(in) : in;
    return in + drop(attn(normed, cos, sin, mask, /*is_causal=*/false));  // (B, T, C)
  };
  SubLayerFn mlp_sublayer = [this](const torch::Tensor& in) {
    return in + mlp(mlp_norm(in));  // (B, T, C); the MLP drops inside, as Hugging Face's
  };
  auto h = run_sublayer(SubLayer::kAttention, attention_sublayer, x);  // (B, T, C)
  return run_sublayer(SubLayer::kMlp, mlp_sublayer, h);                // (B, T, C)
}

static RotaryOptions rope_options(const ModernBertConfig& c, double theta) {
  RotaryOptions o(c.head_dim());
  o.theta(theta);
  return o;
}

ModernBertModel::ModernBertModel(const ModernBertConfig& config)
    : config_(config),
      global_rope_(rope_options(config, config.global_rope_theta)),
      local_rope_(rope_options(config, config.local_rope_theta)) {
  const int64_t C = config.hidden_size;
  const LayerNormOptions norm = LayerNormOptions(C).eps(config.norm_eps).bias(config.norm_bias);
  tok_embeddings = register_module("tok_embeddings", torch::nn::Embedding(config.vocab_size, C));
  embedding_norm = register_module("embedding_norm", LayerNorm(norm));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto block = std::make_shared<ModernBertBlock>(config, i);
    layers->push_back(block);
    blocks_.push_back(block);
  }
  final_norm = register_module("final_norm", LayerNorm(norm));
  head_dense =
      register_module("head_dense", torch::nn::Linear(torch::nn::LinearOptions(C, C).bias(false)));
  head_norm = register_module("head_norm", LayerNorm(norm));
  if (config.decoder_bias)
    decoder_bias = register_parameter("decoder_bias", torch::zeros({config.vocab_size}));
}

void ModernBertModel::init_weights(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  init_weights_normal(*this, config_.initializer_range, gen);
  if (decoder_bias.defined()) {
    torch::NoGradGuard no_grad;
    decoder_bias.zero_();
  }
}

BlockContext ModernBertModel::context(int64_t seq_len, const torch::Device& device,
                                      const torch::Tensor& real) {
  BlockContext ctx;
  const RopeTables& global = global_rope_.get(seq_len, device);
  const RopeTables& local = local_rope_.get(seq_len, device);
  ctx.rope_cos = global.cos;  // (T, HS)
  ctx.rope_sin = global.sin;
  ctx.rope_cos_local = local.cos;
  ctx.rope_sin_local = local.sin;
  if (!window_mask_.defined() || window_mask_.size(0) != seq_len || window_mask_.device() != device)
    window_mask_ = sliding_window_mask(seq_len, config_.local_attention / 2, device);  // (T, T)
  ctx.mask_local = window_mask_;
  if (real.defined()) {
    ctx.mask = key_padding_mask(real);                    // (B, 1, 1, T)
    ctx.mask_local = ctx.mask.logical_and(window_mask_);  // (B, 1, T, T)
  }
  return ctx;
}

torch::Tensor ModernBertModel::encode(const torch::Tensor& input_ids, const torch::Tensor& real) {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kLong,
              "modernbert: input_ids must be (B, T) int64, got ", input_ids.sizes(), " ",
              input_ids.scalar_type());
  auto x = embedding_norm(tok_embeddings(input_ids));  // (B, T, C)
  if (is_training() && config_.hidden_dropout > 0)
    x = dropout(x, config_.hidden_dropout);
  const BlockContext ctx = context(input_ids.size(1), input_ids.device(), real);
  for (const auto& block : blocks_) x = run_block(*block, x, ctx);
  return final_norm(x);  // (B, T, C)
}

torch::Tensor ModernBertModel::mlm_hidden(const torch::Tensor& hidden) {
  return head_norm(F::gelu(head_dense(hidden)));  // (M, C)
}

torch::Tensor ModernBertModel::mlm_logits(const torch::Tensor& hidden) {
  auto h = mlm_hidden(hidden);                                // (M, C)
  return head_logits(h, tok_embeddings->weight, decoder_bias);  // (M, V), tied decoder
}

LossOutput ModernBertModel::loss(const Batch& batch) {
  TORCH_CHECK(batch.input_ids.defined() && batch.targets.defined(),
              "modernbert: a batch needs input_ids and targets");
  TORCH_CHECK(batch.targets.sizes() == batch.input_ids.sizes(), "modernbert: targets ",
              batch.targets.sizes(), " do not match input_ids ", batch.input_ids.sizes());
  auto hidden = encode(batch.input_ids, batch.text_mask);                     // (B, T, C)
  auto selected = batch.targets.ne(kIgnoreIndex).reshape({-1});               // (B*T)
  auto positions = selected.nonzero().squeeze(1);                             // (M)
  auto h = hidden.reshape({-1, hidden.size(-1)}).index_select(0, positions);  // (M, C)
  auto targets = batch.targets.reshape({-1}).index_select(0, positions);      // (M)
  const LossOptions& options = loss_options();
  LossOutput out;
  {
    const LossHeadScope head(options, is_training());
    if (options.chunked) {
      // Only the decoder holds (M, V) tensors: the dense layer and norm before it run whole.
      out.loss_sum = chunked_cross_entropy(mlm_hidden(h), tok_embeddings->weight, decoder_bias,
                                           targets, options.chunk_rows, kIgnoreIndex);  // ()
    } else {
      auto lg = mlm_logits(h);                                     // (M, V)
      if (options.keep_logits) out.logits = lg.detach().clone();  // the loss overwrites lg
      out.loss_sum = cross_entropy_sum(lg, targets, kIgnoreIndex);  // ()
    }
  }
  out.target_count = positions.size(0);
  return out;
}

// ---------------------------------------------------------------------------------------
// Presets and counts

json modernbert_preset(const std::string& preset) {
  json arch = {{"model_type", "modernbert"},
               {"global_attn_every_n_layers", 3},
               {"global_rope_theta", 160000.0},
               {"local_rope_theta", 10000.0},
               {"norm_eps", 1e-5},
               {"norm_bias", false},
               {"attention_bias", false},
               {"mlp_bias", false},
               {"decoder_bias", true},
               // No dropout, as ModernBERT-base's config (embedding, attention, MLP: 0.0).
               {"hidden_dropout", 0.0},
               {"attention_dropout", 0.0},
               {"initializer_range", 0.02},
               {"mlm_probability", 0.3},
               {"dataset", "sotu"}};
  if (preset == "tiny") {
    arch.update({{"tokenizer", "bytes"},
                 {"vocab_size", 320},
                 {"hidden_size", 64},
                 {"num_hidden_layers", 3},
                 {"num_attention_heads", 4},
                 {"intermediate_size", 96},
                 {"local_attention", 16},
                 {"seq_len", 64}});
  } else if (preset == "small") {
    arch.update({{"tokenizer", "gpt2"},
                 {"vocab_size", 50304},
                 {"hidden_size", 256},
                 {"num_hidden_layers", 6},
                 {"num_attention_heads", 4},
                 {"intermediate_size", 384},
                 {"local_attention", 64},
                 {"seq_len", 128}});
  } else if (preset == "paper") {
    // answerdotai/ModernBERT-base; its vocabulary of 50368 holds GPT-2's 50257 ids.
    arch.update({{"tokenizer", "gpt2"},
                 {"vocab_size", 50368},
                 {"hidden_size", 768},
                 {"num_hidden_layers", 22},
                 {"num_attention_heads", 12},
                 {"intermediate_size", 1152},
                 {"local_attention", 128},
                 {"seq_len", 1024}});
  } else {
    fail_usage(fmt::format("unknown modernbert preset '{}'", preset),
               "valid presets: tiny, small, paper");
  }
  return arch;
}

int64_t modernbert_encoder_params(const json& arch) {
  const ModernBertConfig c = modernbert_config(arch);
  const int64_t C = c.hidden_size, I = c.intermediate_size, L = c.num_hidden_layers;
  const int64_t norm = c.norm_bias ? 2 * C : C;
  const int64_t attn = 4 * C * C + (c.attention_bias ? 4 * C : 0);
  const int64_t mlp = C * 2 * I + I * C + (c.mlp_bias ? 2 * I + C : 0);
  const int64_t layers = L * (attn + mlp + 2 * norm) - norm;  // no attention norm on layer 0
  return c.vocab_size * C + norm + layers + norm;             // embeddings, layers, final norm
}

int64_t modernbert_count_params(const json& arch) {
  const ModernBertConfig c = modernbert_config(arch);
  const int64_t C = c.hidden_size;
  const int64_t head = C * C + (c.norm_bias ? 2 * C : C) + (c.decoder_bias ? c.vocab_size : 0);
  return modernbert_encoder_params(arch) + head;
}

double modernbert_forward_flops_per_token(const json& arch, int64_t seq_len) {
  check_usage(seq_len > 0, fmt::format("sequence length must be positive, got {}", seq_len),
              "pass --seq with a positive length");
  const ModernBertConfig c = modernbert_config(arch);
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double L = static_cast<double>(c.num_hidden_layers);
  const double layer = 2.0 * (4 * C * C + 3 * C * I) + 2.0 * 2.0 * seq_len * C;
  const double p = ArchReader(arch, "modernbert").number("mlm_probability", 0.3);
  const double head = p * 2.0 * (C * C + static_cast<double>(c.vocab_size) * C);
  return L * layer + head;
}

std::shared_ptr<Model> make_modernbert(const json& arch, uint64_t seed) {
  auto model = std::make_shared<ModernBertModel>(modernbert_config(arch));
  model->init_weights(seed);
  return model;
}

}  // namespace gradscope

// ---------------------------------------------------------------------------------------
// Memory trace (models/common/memory_trace.h), mirroring the forward above.

namespace gradscope {

void modernbert_trace_step(const json& arch, int64_t batch, MemoryTrace& trace) {
  using Unit = MemoryTrace::Unit;
  constexpr int64_t F4 = MemoryTrace::kFloat;
  const ModernBertConfig c = modernbert_config(arch);
  const int64_t T = arch.at("seq_len").get<int64_t>(), n = batch * T, C = c.hidden_size;
  const int64_t hs = C / c.num_attention_heads, I = c.intermediate_size;
  // Masked positions: the expected count (each position is picked with mlm_probability).
  const auto M = static_cast<int64_t>(
      std::llround(arch.value("mlm_probability", 0.3) * static_cast<double>(n)));
  trace.persistent(2 * n * MemoryTrace::kLong);  // input_ids, targets
  trace.persistent(4 * T * hs * F4);             // global and local rotary tables
  trace.persistent(T * T);                       // the sliding-window mask (bool)
  int embedding = -1;
  const auto e = trace.embedding(n, c.vocab_size, C, &embedding);
  const auto normed_e = trace.layer_norm(e, n, C, c.norm_bias);
  trace.release(e);
  auto x = trace.drop(normed_e, c.hidden_dropout);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool global = l % c.global_attn_every_n_layers == 0;
    MemoryTrace::AttentionShape shape{batch, T, C, c.num_attention_heads, c.num_attention_heads,
                                      hs};
    shape.bias = c.attention_bias;
    shape.rotary = true;
    shape.dropout = c.attention_dropout;
    shape.mask_bytes = global ? 0 : T * T;  // unpadded windows: only local layers mask
    shape.batch_mask = !global;
    trace.begin(Unit::kBlock, x);
    trace.begin(Unit::kAttention, x);
    const auto normed = l > 0 ? trace.layer_norm(x, n, C, c.norm_bias) : x;
    const auto a = trace.self_attention(normed, shape);
    if (normed != x) trace.release(normed);
    const auto mid = trace.residual(x, a, c.hidden_dropout);
    trace.end(Unit::kAttention, mid);
    trace.begin(Unit::kMlp, mid);
    const auto normed2 = trace.layer_norm(mid, n, C, c.norm_bias);
    // GeGLU: Wo(dropout(gelu(a) * b)) with (a, b) = Wi(x).chunk(2): both halves are views
    // of Wi's output, which the GELU and the product keep.
    const auto wi = trace.adapt(normed2, trace.linear(normed2, n, C, 2 * I, c.mlp_bias), n, C,
                                2 * I, "gate_up");
    const auto half_a = trace.view(n * I * F4);
    const auto half_b = trace.view(n * I * F4);
    trace.node({}, {wi}, {half_a, half_b});  // chunk: its backward joins the halves' gradients
    const auto act = trace.alloc(n * I * F4);
    trace.node({wi}, {half_a}, {act});
    const auto product = trace.alloc(n * I * F4);
    trace.node({act, wi}, {act, half_b}, {product});
    trace.release(act);
    trace.release(wi);
    const auto p_dropped = trace.drop(product, c.hidden_dropout);
    const auto m =
        trace.adapt(p_dropped, trace.linear(p_dropped, n, I, C, c.mlp_bias), n, I, C, "down");
    trace.release(p_dropped);
    trace.release(normed2);
    const auto out = trace.residual(mid, m, 0.0);  // the MLP dropped inside
    trace.end(Unit::kMlp, out);
    trace.end(Unit::kBlock, out);
    trace.release(x);
    trace.release(mid);
    x = out;
  }
  const auto hidden = trace.layer_norm(x, n, C, c.norm_bias);
  trace.release(x);
  // The head runs on the masked positions only: index_select copies their rows.
  const auto rows = trace.alloc(M * C * F4);
  trace.node({}, {hidden}, {rows});
  trace.release(hidden);
  trace.begin_head();
  const auto dense = trace.linear(rows, M, C, C, false);
  trace.release(rows);
  const auto act = trace.activation(dense);
  trace.release(dense);
  const auto normed = trace.layer_norm(act, M, C, c.norm_bias);
  trace.release(act);
  trace.lm_loss(normed, M, C, c.vocab_size, c.decoder_bias, embedding);
  trace.release(normed);
}

}  // namespace gradscope
