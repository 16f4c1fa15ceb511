#include "gradscope/models/nanovlm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>

#include "gradscope/core/error.h"
#include "gradscope/models/common/arch.h"
#include "gradscope/models/common/lm_loss.h"

namespace gradscope {

using nlohmann::json;

torch::Tensor pixel_shuffle_tokens(const torch::Tensor& x, int64_t factor) {
  TORCH_CHECK(x.dim() == 3, "pixel shuffle expects (B, N, C), got ", x.sizes());
  const int64_t b = x.size(0), n = x.size(1), c = x.size(2);
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  TORCH_CHECK(side * side == n && side % factor == 0, "pixel shuffle by ", factor,
              " needs a square grid whose side it divides, got ", n, " tokens");
  const int64_t cells = side / factor;
  // (B, side, side, C) -> (B, cells, s, cells, s, C) -> (B, cells, cells, s, s, C)
  auto grid = x.reshape({b, cells, factor, cells, factor, c}).permute({0, 1, 3, 2, 4, 5});
  return grid.reshape({b, cells * cells, factor * factor * c});  // (B, n, s^2 C)
}

NanoVlmConfig nanovlm_config(const json& arch) {
  NanoVlmConfig c;
  c.vision = vision_config(arch, "nanovlm", "vision_");
  c.vision.class_token = false;
  c.decoder = llama_config(arch);
  const ArchReader r(arch, "nanovlm");
  c.pixel_shuffle_factor = r.positive("pixel_shuffle_factor", 2);
  const int64_t side = c.vision.image_size / c.vision.patch_size;
  r.check(side % c.pixel_shuffle_factor == 0,
          fmt::format("pixel_shuffle_factor {} does not divide the {}x{} patch grid",
                      c.pixel_shuffle_factor, side, side));
  return c;
}

NanoVlmModel::NanoVlmModel(const NanoVlmConfig& config) : config_(config) {
  vision = register_module("vision", VisionEncoder(config.vision));
  const int64_t s2 = config.pixel_shuffle_factor * config.pixel_shuffle_factor;
  projector = register_module(
      "projector", torch::nn::Linear(torch::nn::LinearOptions(s2 * config.vision.hidden_size,
                                                              config.decoder.hidden_size)
                                         .bias(false)));
  decoder = register_module("decoder", std::make_shared<LlamaModel>(config.decoder));
}

void NanoVlmModel::init_weights(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  vision->init_weights(gen);
  init_weights_normal(*projector, config_.decoder.initializer_range, gen);
  init_weights_normal(*decoder, config_.decoder.initializer_range, gen);
}

std::vector<std::shared_ptr<Block>> NanoVlmModel::blocks() {
  auto out = vision->blocks();
  for (const auto& b : decoder->blocks()) out.push_back(b);
  return out;
}

torch::Tensor NanoVlmModel::image_tokens(const torch::Tensor& images) {
  auto patches =
      vision->forward(images, [this](Block& b, const torch::Tensor& x, const BlockContext& c) {
        return run_block(b, x, c);
      });
  return projector(pixel_shuffle_tokens(patches, config_.pixel_shuffle_factor));  // (B, n, C)
}

torch::Tensor NanoVlmModel::logits(const torch::Tensor& images, const torch::Tensor& input_ids,
                                   const torch::Tensor& text_mask) {
  return decoder->lm_logits(caption_hidden(images, input_ids, text_mask));  // (B, T, V)
}

torch::Tensor NanoVlmModel::caption_hidden(const torch::Tensor& images,
                                           const torch::Tensor& input_ids,
                                           const torch::Tensor& text_mask) {
  TORCH_CHECK(images.size(0) == input_ids.size(0), "nanovlm: ", images.size(0), " images for ",
              input_ids.size(0), " captions");
  auto img = image_tokens(images);                             // (B, n, C)
  auto text = decoder->embed(input_ids);                       // (B, T, C)
  auto x = torch::cat({img.to(text.scalar_type()), text}, 1);  // (B, n + T, C)
  const int64_t n = img.size(1), total = x.size(1);
  BlockContext ctx = decoder->context(total, x.device());
  if (text_mask.defined()) {
    // Built once for the batch: causal, and no query attends a padding position.
    auto real = torch::cat({torch::ones({x.size(0), n}, text_mask.options()), text_mask}, 1);
    ctx.mask = key_padding_mask(real).logical_and(causal_mask(total, x.device()));  // (B,1,S,S)
    ctx.mask_includes_causal = true;
  }
  for (const auto& block : decoder->blocks()) x = run_block(*block, x, ctx);
  return decoder->norm(x.narrow(1, n, total - n));  // caption positions (B, T, C)
}

int64_t nanovlm_image_tokens(const json& arch) { return nanovlm_config(arch).image_tokens(); }

LossOutput NanoVlmModel::loss(const Batch& batch) {
  TORCH_CHECK(batch.images.defined() && batch.input_ids.defined() && batch.targets.defined(),
              "nanovlm: a batch needs images, input_ids and targets");
  TORCH_CHECK(batch.targets.sizes() == batch.input_ids.sizes(), "nanovlm: targets ",
              batch.targets.sizes(), " do not match input_ids ", batch.input_ids.sizes());
  auto hidden = caption_hidden(batch.images, batch.input_ids, batch.text_mask);  // (B, T, C)
  const LossOptions& options = loss_options();
  LossOutput out;
  {
    const LossHeadScope head(options, is_training());
    if (options.chunked) {
      out.loss_sum = decoder->chunked_lm_loss(hidden, batch.targets, options.chunk_rows);  // ()
    } else {
      auto lg = decoder->lm_logits(hidden);  // (B, T, V)
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

json nanovlm_preset(const std::string& preset) {
  // SmolLM2's decoder settings and SigLIP's encoder settings, shared by every preset.
  json arch = {{"model_type", "nanovlm"},
               {"num_channels", 3},
               {"vision_layer_norm_eps", 1e-6},
               {"vision_hidden_act", "gelu_pytorch_tanh"},
               {"qkv_bias", true},
               {"pixel_shuffle_factor", 2},
               {"rms_norm_eps", 1e-5},
               {"rope_theta", 100000.0},
               {"tie_word_embeddings", true},
               {"attention_bias", false},
               {"mlp_bias", false},
               // No dropout, as SmolLM2's and SigLIP's configs.
               {"hidden_dropout", 0.0},
               {"attention_dropout", 0.0},
               {"initializer_range", 0.02}};
  if (preset == "tiny") {
    arch.update({{"image_size", 32},
                 {"patch_size", 8},
                 {"vision_hidden_size", 64},
                 {"vision_num_hidden_layers", 2},
                 {"vision_num_attention_heads", 4},
                 {"vision_intermediate_size", 256},
                 {"tokenizer", "bytes"},
                 {"vocab_size", 320},
                 {"hidden_size", 64},
                 {"num_hidden_layers", 2},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 2},
                 {"intermediate_size", 192},
                 {"seq_len", 32},
                 {"dataset", "fashion-mnist"}});
  } else if (preset == "small") {
    arch.update({{"image_size", 64},
                 {"patch_size", 8},
                 {"vision_hidden_size", 192},
                 {"vision_num_hidden_layers", 4},
                 {"vision_num_attention_heads", 3},
                 {"vision_intermediate_size", 768},
                 {"tokenizer", "gpt2"},
                 {"vocab_size", 50304},
                 {"hidden_size", 256},
                 {"num_hidden_layers", 4},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 2},
                 {"intermediate_size", 768},
                 {"seq_len", 24},
                 {"dataset", "emoji"}});
  } else if (preset == "paper") {
    // nanoVLM-222M: SigLIP-B/16-224 and SmolLM2-135M. Its published vocabulary is SmolLM2's
    // 49152; gradscope trains it with GPT-2's tokenizer (no SmolLM2 tokenizer is packaged),
    // so the resolved vocabulary is 50304 and the run record says so.
    arch.update({{"image_size", 224},
                 {"patch_size", 16},
                 {"vision_hidden_size", 768},
                 {"vision_num_hidden_layers", 12},
                 {"vision_num_attention_heads", 12},
                 {"vision_intermediate_size", 3072},
                 {"tokenizer", "gpt2"},
                 {"vocab_size", 49152},
                 {"published_vocab_size", 49152},  // kept in the record beside the resolved one
                 {"hidden_size", 576},
                 {"num_hidden_layers", 30},
                 {"num_attention_heads", 9},
                 {"num_key_value_heads", 3},
                 {"intermediate_size", 1536},
                 {"seq_len", 64},
                 {"dataset", "emoji"}});
  } else {
    fail_usage(fmt::format("unknown nanovlm preset '{}'", preset),
               "valid presets: tiny, small, paper");
  }
  return arch;
}

int64_t nanovlm_count_params(const json& arch) {
  const NanoVlmConfig c = nanovlm_config(arch);
  const int64_t s2 = c.pixel_shuffle_factor * c.pixel_shuffle_factor;
  return vision_count_params(c.vision) + s2 * c.vision.hidden_size * c.decoder.hidden_size +
         llama_count_params(arch);
}

double nanovlm_forward_flops_per_token(const json& arch, int64_t seq_len) {
  check_usage(seq_len > 0, fmt::format("caption length must be positive, got {}", seq_len),
              "pass --seq with a positive length");
  const NanoVlmConfig c = nanovlm_config(arch);
  const int64_t n = c.image_tokens();
  const double positions = static_cast<double>(n + seq_len);
  const int64_t s2 = c.pixel_shuffle_factor * c.pixel_shuffle_factor;
  const double projector = 2.0 * n * s2 * c.vision.hidden_size * c.decoder.hidden_size;
  // Llama's count has the head on every position; here it runs on the captions only.
  const double head = 2.0 * static_cast<double>(c.decoder.vocab_size) * c.decoder.hidden_size;
  const double decoder =
      (llama_forward_flops_per_token(arch, n + seq_len) - head) * positions + head * seq_len;
  return (vision_forward_flops_per_image(c.vision) + projector + decoder) / positions;
}

std::shared_ptr<Model> make_nanovlm(const json& arch, uint64_t seed) {
  auto model = std::make_shared<NanoVlmModel>(nanovlm_config(arch));
  model->init_weights(seed);
  return model;
}

}  // namespace gradscope

// ---------------------------------------------------------------------------------------
// Memory trace (models/common/memory_trace.h), mirroring the forward above.

namespace gradscope {

void nanovlm_trace_step(const json& arch, int64_t batch, MemoryTrace& trace) {
  constexpr int64_t F4 = MemoryTrace::kFloat;
  const NanoVlmConfig c = nanovlm_config(arch);
  const LlamaConfig& d = c.decoder;
  const int64_t T = arch.at("seq_len").get<int64_t>(), n_img = c.image_tokens();
  const int64_t S = n_img + T, C = d.hidden_size;
  const int64_t cv = c.vision.hidden_size * c.pixel_shuffle_factor * c.pixel_shuffle_factor;
  trace.persistent(2 * batch * T * MemoryTrace::kLong + batch * T);  // ids, targets, text mask
  trace.persistent(2 * S * d.head_dim * F4);                         // rotary cos, sin
  // LoRA adapts the decoder only (NanoVlmModel::lora_scope).
  trace.set_adapting(false);
  const auto patches = trace_vision_encoder(c.vision, batch, trace);
  trace.set_adapting(true);
  // Pixel shuffle: a permute, then a copying reshape.
  const auto shuffled = trace.copy(patches, trace.bytes(patches));
  trace.release(patches);
  const auto img = trace.linear(shuffled, batch * n_img, cv, C, false);
  trace.release(shuffled);
  int embedding = -1;
  const auto text = trace.embedding(batch * T, d.vocab_size, C, &embedding);
  const auto x = trace.alloc(batch * S * C * F4);  // cat(image tokens, text)
  trace.node({}, {img, text}, {x}, {}, -1);        // its backward narrows: views, no copies
  trace.release(img);
  trace.release(text);
  // Captions are padded: one (B, 1, S, S) bool mask, causal and padding, for every layer.
  const int64_t mask_bytes = batch * S * S;
  const auto mask = trace.alloc(mask_bytes);
  const auto y = trace_llama_blocks(d, batch, S, x, mask_bytes, trace);
  trace.release(mask);
  // The norm reads the caption positions (a narrow view of y, which it keeps).
  trace_llama_head(d, y, batch * T, embedding, trace);
}

}  // namespace gradscope
