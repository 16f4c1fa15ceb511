#include "gradscope/models/hf_weights.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gradscope/core/error.h"
#include "gradscope/models/common/arch.h"
#include "gradscope/models/common/layers.h"
#include "gradscope/models/hf_weights_detail.h"
#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/registry.h"
#include "gradscope/models/vit.h"

namespace gradscope {
namespace hf_weights_detail {

using nlohmann::json;
// ---------------------------------------------------------------------------------------
// Tensor layouts (hf_weights_detail.h).

class LayoutBuilder {
 public:
  explicit LayoutBuilder(Layout& layout) : layout_(layout) {}
  // A tensor that is one gradscope parameter.
  HfTensor& add(std::string name, std::string part, Shape shape) {
    layout_.tensors.push_back({std::move(name), {std::move(part)}, std::move(shape), "", false});
    return layout_.tensors.back();
  }
  // A tensor that is several gradscope parameters stacked by rows (q, k, v).
  void stack(std::string name, std::vector<std::string> parts, Shape shape) {
    layout_.tensors.push_back({std::move(name), std::move(parts), std::move(shape), "", false});
  }
  // A linear layer's weight (out, in), and its bias (out) when it has one.
  void linear(const std::string& name, const std::string& part, int64_t out, int64_t in,
              bool bias) {
    add(name + ".weight", part + ".weight", {out, in});
    if (bias) add(name + ".bias", part + ".bias", {out});
  }
  // q, k and v stacked into one projection, weights and biases.
  void stacked_qkv(const std::string& name, const std::string& attention, int64_t out_q,
                   int64_t out_kv, int64_t in, bool bias) {
    const int64_t out = out_q + 2 * out_kv;
    stack(
        name + ".weight",
        {attention + ".q_proj.weight", attention + ".k_proj.weight", attention + ".v_proj.weight"},
        {out, in});
    if (bias)
      stack(name + ".bias",
            {attention + ".q_proj.bias", attention + ".k_proj.bias", attention + ".v_proj.bias"},
            {out});
  }
  void norm(const std::string& name, const std::string& part, int64_t dim, bool bias) {
    add(name + ".weight", part + ".weight", {dim});
    if (bias) add(name + ".bias", part + ".bias", {dim});
  }

 private:
  Layout& layout_;
};

// LlamaForCausalLM (transformers' modeling_llama.py): model.embed_tokens, model.layers.N
// (self_attn q, k, v, o; mlp gate, up, down; input_layernorm; post_attention_layernorm),
// model.norm, lm_head when not tied.
Layout llama_layout(const LlamaConfig& c) {
  Layout layout;
  layout.published_as = "LlamaForCausalLM";
  LayoutBuilder b(layout);
  const int64_t C = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const int64_t q_out = c.num_attention_heads * c.head_dim,
                kv_out = c.num_key_value_heads * c.head_dim;
  HfTensor& embed = b.add("model.embed_tokens.weight", "embed_tokens.weight", {V, C});
  if (c.tie_word_embeddings) embed.head_alias = "lm_head.weight";
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string hf = fmt::format("model.layers.{}.", l), gs = fmt::format("layers.{}.", l);
    b.linear(hf + "self_attn.q_proj", gs + "self_attn.q_proj", q_out, C, c.attention_bias);
    b.linear(hf + "self_attn.k_proj", gs + "self_attn.k_proj", kv_out, C, c.attention_bias);
    b.linear(hf + "self_attn.v_proj", gs + "self_attn.v_proj", kv_out, C, c.attention_bias);
    b.linear(hf + "self_attn.o_proj", gs + "self_attn.o_proj", C, q_out, c.attention_bias);
    b.linear(hf + "mlp.gate_proj", gs + "mlp.gate_proj", I, C, c.mlp_bias);
    b.linear(hf + "mlp.up_proj", gs + "mlp.up_proj", I, C, c.mlp_bias);
    b.linear(hf + "mlp.down_proj", gs + "mlp.down_proj", C, I, c.mlp_bias);
    b.norm(hf + "input_layernorm", gs + "input_layernorm", C, false);
    b.norm(hf + "post_attention_layernorm", gs + "post_attention_layernorm", C, false);
  }
  b.norm("model.norm", "norm", C, false);
  if (!c.tie_word_embeddings) b.add("lm_head.weight", "lm_head.weight", {V, C});
  return layout;
}

// ModernBertForMaskedLM (transformers' modeling_modernbert.py): model.embeddings
// (tok_embeddings, norm), model.layers.N (attn_norm from layer 1 on, attn.Wqkv, attn.Wo,
// mlp_norm, mlp.Wi, mlp.Wo), model.final_norm, head (dense, norm), decoder (its weight tied to
// the embeddings, its bias).
Layout modernbert_layout(const ModernBertConfig& c) {
  Layout layout;
  layout.published_as = "ModernBertForMaskedLM";
  LayoutBuilder b(layout);
  const int64_t C = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  b.add("model.embeddings.tok_embeddings.weight", "tok_embeddings.weight", {V, C}).head_alias =
      "decoder.weight";
  b.norm("model.embeddings.norm", "embedding_norm", C, c.norm_bias);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string hf = fmt::format("model.layers.{}.", l), gs = fmt::format("layers.{}.", l);
    if (l > 0) b.norm(hf + "attn_norm", gs + "attn_norm", C, c.norm_bias);
    b.stacked_qkv(hf + "attn.Wqkv", gs + "attn", C, C, C, c.attention_bias);
    b.linear(hf + "attn.Wo", gs + "attn.o_proj", C, C, c.attention_bias);
    b.norm(hf + "mlp_norm", gs + "mlp_norm", C, c.norm_bias);
    b.linear(hf + "mlp.Wi", gs + "mlp.Wi", 2 * I, C, c.mlp_bias);
    b.linear(hf + "mlp.Wo", gs + "mlp.Wo", C, I, c.mlp_bias);
  }
  b.norm("model.final_norm", "final_norm", C, c.norm_bias);
  b.linear("head.dense", "head_dense", C, C, false);
  b.norm("head.norm", "head_norm", C, c.norm_bias);
  if (c.decoder_bias) b.add("decoder.bias", "decoder_bias", {V});
  return layout;
}

// ViTForImageClassification (transformers' modeling_vit.py): vit.embeddings (cls_token,
// position_embeddings, patch_embeddings.projection), vit.encoder.layer.N (attention.attention
// query, key, value; attention.output.dense; intermediate.dense; output.dense;
// layernorm_before; layernorm_after), vit.layernorm, classifier.
Layout vit_layout(const VisionConfig& v, int64_t num_labels) {
  check_usage(v.qkv_bias,
              "vit with qkv_bias false has no attention output bias, which "
              "ViTForImageClassification always has: its weights have no published layout",
              "keep qkv_bias true to read or write Hugging Face weights");
  Layout layout;
  layout.published_as = "ViTForImageClassification";
  LayoutBuilder b(layout);
  const int64_t C = v.hidden_size, I = v.intermediate_size, P = v.patch_size;
  b.add("vit.embeddings.cls_token", "encoder.cls_token", {1, 1, C});
  b.add("vit.embeddings.position_embeddings", "encoder.position_embeddings",
        {1, v.num_tokens(), C});
  b.add("vit.embeddings.patch_embeddings.projection.weight",
        "encoder.patch_embeddings.projection.weight", {C, v.num_channels, P, P});
  b.add("vit.embeddings.patch_embeddings.projection.bias",
        "encoder.patch_embeddings.projection.bias", {C});
  for (int64_t l = 0; l < v.num_hidden_layers; ++l) {
    const std::string hf = fmt::format("vit.encoder.layer.{}.", l),
                      gs = fmt::format("encoder.layers.{}.", l);
    b.linear(hf + "attention.attention.query", gs + "attention.q_proj", C, C, true);
    b.linear(hf + "attention.attention.key", gs + "attention.k_proj", C, C, true);
    b.linear(hf + "attention.attention.value", gs + "attention.v_proj", C, C, true);
    b.linear(hf + "attention.output.dense", gs + "attention.o_proj", C, C, true);
    b.linear(hf + "intermediate.dense", gs + "mlp.fc1", I, C, true);
    b.linear(hf + "output.dense", gs + "mlp.fc2", C, I, true);
    b.norm(hf + "layernorm_before", gs + "layernorm_before", C, true);
    b.norm(hf + "layernorm_after", gs + "layernorm_after", C, true);
  }
  b.norm("vit.layernorm", "encoder.layernorm", C, true);
  b.linear("classifier", "classifier", num_labels, C, true);
  return layout;
}

// nanoVLM's VisionLanguageModel (huggingface/nanoVLM models/*.py): vision_encoder
// (patch_embedding.position_embedding, patch_embedding.conv, blocks.N: ln1, attn.qkv_proj,
// attn.out_proj, ln2, mlp.fc1, mlp.fc2; layer_norm), decoder (token_embedding,
// rotary_embd.inv_freq, blocks.N: mlp gate, up, down; attn q, k, v, out_proj; norm1; norm2;
// norm; head when not tied), MP.proj.
Layout nanovlm_layout(const NanoVlmConfig& c) {
  const VisionConfig& v = c.vision;
  const LlamaConfig& d = c.decoder;
  const char* hint =
      "nanoVLM's layers have no such setting: keep the preset's value to read or "
      "write nanoVLM weights";
  check_usage(v.qkv_bias,
              "nanovlm with qkv_bias false has no nanoVLM layout (its vision "
              "attention always has biases)",
              hint);
  check_usage(v.num_channels == 3, "nanovlm with num_channels other than 3 has no nanoVLM layout",
              hint);
  check_usage(!d.attention_bias && !d.mlp_bias,
              "nanovlm with decoder biases has no nanoVLM layout (its decoder has none)", hint);
  check_usage(d.head_dim * d.num_attention_heads == d.hidden_size,
              "nanovlm with head_dim other than hidden_size / num_attention_heads has no nanoVLM "
              "layout",
              hint);
  Layout layout;
  layout.published_as = "nanoVLM's VisionLanguageModel";
  LayoutBuilder b(layout);
  const int64_t Cv = v.hidden_size, Iv = v.intermediate_size, P = v.patch_size;
  const int64_t C = d.hidden_size, V = d.vocab_size, I = d.intermediate_size;
  const int64_t kv_out = d.num_key_value_heads * d.head_dim;
  b.add("vision_encoder.patch_embedding.position_embedding", "vision.position_embeddings",
        {1, v.num_tokens(), Cv});
  b.add("vision_encoder.patch_embedding.conv.weight", "vision.patch_embeddings.projection.weight",
        {Cv, v.num_channels, P, P});
  b.add("vision_encoder.patch_embedding.conv.bias", "vision.patch_embeddings.projection.bias",
        {Cv});
  for (int64_t l = 0; l < v.num_hidden_layers; ++l) {
    const std::string hf = fmt::format("vision_encoder.blocks.{}.", l),
                      gs = fmt::format("vision.layers.{}.", l);
    b.norm(hf + "ln1", gs + "layernorm_before", Cv, true);
    b.stacked_qkv(hf + "attn.qkv_proj", gs + "attention", Cv, Cv, Cv, true);
    b.linear(hf + "attn.out_proj", gs + "attention.o_proj", Cv, Cv, true);
    b.norm(hf + "ln2", gs + "layernorm_after", Cv, true);
    b.linear(hf + "mlp.fc1", gs + "mlp.fc1", Iv, Cv, true);
    b.linear(hf + "mlp.fc2", gs + "mlp.fc2", Cv, Iv, true);
  }
  b.norm("vision_encoder.layer_norm", "vision.layernorm", Cv, true);
  HfTensor& embed = b.add("decoder.token_embedding.weight", "decoder.embed_tokens.weight", {V, C});
  if (d.tie_word_embeddings) embed.head_alias = "decoder.head.weight";
  layout.tensors.push_back({"decoder.rotary_embd.inv_freq", {}, {d.head_dim / 2}, "", true});
  RotaryOptions rotary(d.head_dim);
  rotary.theta(d.rope_theta);
  rotary.llama3_scaling(d.rope_scaling);
  layout.rotary = rotary;
  for (int64_t l = 0; l < d.num_hidden_layers; ++l) {
    const std::string hf = fmt::format("decoder.blocks.{}.", l),
                      gs = fmt::format("decoder.layers.{}.", l);
    b.linear(hf + "mlp.gate_proj", gs + "mlp.gate_proj", I, C, false);
    b.linear(hf + "mlp.up_proj", gs + "mlp.up_proj", I, C, false);
    b.linear(hf + "mlp.down_proj", gs + "mlp.down_proj", C, I, false);
    b.linear(hf + "attn.q_proj", gs + "self_attn.q_proj", C, C, false);
    b.linear(hf + "attn.k_proj", gs + "self_attn.k_proj", kv_out, C, false);
    b.linear(hf + "attn.v_proj", gs + "self_attn.v_proj", kv_out, C, false);
    b.linear(hf + "attn.out_proj", gs + "self_attn.o_proj", C, C, false);
    b.norm(hf + "norm1", gs + "input_layernorm", C, false);
    b.norm(hf + "norm2", gs + "post_attention_layernorm", C, false);
  }
  b.norm("decoder.norm", "decoder.norm", C, false);
  if (!d.tie_word_embeddings) b.add("decoder.head.weight", "decoder.lm_head.weight", {V, C});
  const int64_t s2 = c.pixel_shuffle_factor * c.pixel_shuffle_factor;
  b.add("MP.proj.weight", "projector.weight", {C, s2 * Cv});
  return layout;
}

void check_published(const std::string& model) {
  if (model_registry().get(model).published) return;  // an unknown name lists the valid ones
  std::vector<std::string> names;
  for (const auto& item : model_registry().items())
    if (item.entry.published) names.push_back(item.name);
  const std::string last = names.empty() ? "" : names.back();
  if (!names.empty()) names.pop_back();
  fail_usage(fmt::format("model '{}' has no published weights or config names", model),
             fmt::format("Hugging Face names exist for {}{}{}", fmt::join(names, ", "),
                         names.empty() ? "" : " and ", last));
}

int64_t vit_num_labels(const json& arch) { return ArchReader(arch, "vit").positive("num_labels"); }

template <typename T>
T& model_as(const char* family, Model& m) {
  auto* typed = dynamic_cast<T*>(&m);
  if (!typed) fail_runtime(fmt::format("the model passed as '{}' is another model", family));
  return *typed;
}

Layout llama_layout_of_arch(const json& arch) { return llama_layout(llama_config(arch)); }
Layout llama_layout_of_model(Model& m) {
  return llama_layout(model_as<LlamaModel>("llama", m).config());
}
Layout modernbert_layout_of_arch(const json& arch) {
  return modernbert_layout(modernbert_config(arch));
}
Layout modernbert_layout_of_model(Model& m) {
  return modernbert_layout(model_as<ModernBertModel>("modernbert", m).config());
}
Layout vit_layout_of_arch(const json& arch) {
  return vit_layout(vision_config(arch, "vit"), vit_num_labels(arch));
}
Layout vit_layout_of_model(Model& m) {
  auto& vit = model_as<ViTModel>("vit", m);
  return vit_layout(vit.encoder->config(), vit.classifier->options.out_features());
}
// transformers 5 builds ViT's layers as vit.layers.N with attention.{q,k,v,o}_proj and
// mlp.fc{1,2}, and maps the checkpoint's vit.encoder.layer.N names onto them when it loads.
std::string vit_adapter_module(const std::string& published_module) {
  static const std::vector<std::pair<std::string, std::string>> kParts = {
      {".attention.attention.query", ".attention.q_proj"},
      {".attention.attention.key", ".attention.k_proj"},
      {".attention.attention.value", ".attention.v_proj"},
      {".attention.output.dense", ".attention.o_proj"},
      {".intermediate.dense", ".mlp.fc1"},
      {".output.dense", ".mlp.fc2"}};
  const std::string layer = "vit.encoder.layer.";
  if (published_module.compare(0, layer.size(), layer) != 0) return published_module;
  const size_t dot = published_module.find('.', layer.size());
  if (dot == std::string::npos) return published_module;
  const std::string rest = published_module.substr(dot);
  for (const auto& [from, to] : kParts)
    if (rest == from)
      return "vit.layers." + published_module.substr(layer.size(), dot - layer.size()) + to;
  return published_module;
}

Layout nanovlm_layout_of_arch(const json& arch) { return nanovlm_layout(nanovlm_config(arch)); }
Layout nanovlm_layout_of_model(Model& m) {
  return nanovlm_layout(model_as<NanoVlmModel>("nanovlm", m).config());
}

const PublishedNames& published_names(const std::string& model) {
  check_published(model);
  return *model_registry().get(model).published;
}

Layout layout_of_arch(const std::string& model, const json& arch) {
  return published_names(model).layout_of_arch(arch);
}

Layout layout_of_model(const std::string& model, Model& m) {
  return published_names(model).layout_of_model(m);
}

std::string shape_text(at::IntArrayRef shape) {
  std::string out;
  for (const int64_t d : shape) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return "[" + out + "]";
}

// A name from a file, cut to 100 bytes (at a character boundary), control characters as '?'.
std::string short_name(const std::string& name) {
  size_t cut = std::min<size_t>(name.size(), 100);
  while (cut < name.size() && cut > 0 &&
         (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80)
    --cut;
  std::string out = name.substr(0, cut);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return cut < name.size() ? out + "..." : out;
}

// Up to `most` names, then how many more.
std::string some_names(const std::vector<std::string>& names, size_t most = 5) {
  std::string out;
  // Names come from a file: each is cut, so a crafted header cannot flood the message.
  for (size_t i = 0; i < names.size() && i < most; ++i)
    out += (i ? ", '" : "'") + short_name(names[i]) + "'";
  if (names.size() > most) out += fmt::format(" and {} more", names.size() - most);
  return out;
}

// Every tensor of `layout` given (`shape_of` says its shape, nullptr when absent) with its
// shape, and no other name among `given`: a usage error naming `source` and the tensor.
template <typename ShapeOf>
void check_layout_tensors(const std::string& model, const Layout& layout,
                          const std::vector<std::string>& given, ShapeOf shape_of,
                          const std::string& source) {
  const std::string hint = fmt::format(
      "gradscope's {} with this architecture reads the {} tensors {} has, named and shaped as "
      "docs/weights.md (\"Names\") lists them; is the file for another architecture?",
      model, layout.tensors.size(), layout.published_as);
  std::set<std::string> known;
  std::vector<std::string> missing, extra;
  for (const HfTensor& t : layout.tensors) {
    known.insert(t.name);
    if (!t.head_alias.empty()) known.insert(t.head_alias);
    if (!shape_of(t.name) && (t.head_alias.empty() || !shape_of(t.head_alias)))
      missing.push_back(t.name);
  }
  for (const std::string& name : given)
    if (!known.count(name)) extra.push_back(name);
  if (!missing.empty())
    fail_usage(
        fmt::format("{} lacks {} tensor{} of {}'s published layout: {}", source, missing.size(),
                    missing.size() == 1 ? "" : "s", model, some_names(missing)),
        hint);
  if (!extra.empty())
    fail_usage(
        fmt::format("{} holds {} tensor{} that {}'s published layout does not have: {}", source,
                    extra.size(), extra.size() == 1 ? "" : "s", model, some_names(extra)),
        hint);
  for (const HfTensor& t : layout.tensors)
    for (const std::string* name : {&t.name, &t.head_alias}) {
      if (name->empty()) continue;
      const auto shape = shape_of(*name);
      if (shape && *shape != at::IntArrayRef(t.shape))
        fail_usage(fmt::format("{}: tensor '{}' has shape {} where the architecture has {}", source,
                               *name, shape_text(*shape), shape_text(t.shape)),
                   "the weights are for another architecture: give the folder with its "
                   "config.json, or set the architecture that matches them");
    }
}

}  // namespace hf_weights_detail

// ---------------------------------------------------------------------------------------

namespace {

// The published tensors of `layout`, each from gradscope's parameters as `param` gives them
// (undefined: the tensor is left out), stacked where the published layout stacks them; the
// rotary frequencies too when `buffers`.
std::vector<std::pair<std::string, torch::Tensor>> published_tensors(
    const hf_weights_detail::Layout& layout,
    const std::function<torch::Tensor(const std::string&)>& param, bool buffers) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const hf_weights_detail::HfTensor& t : layout.tensors) {
    if (t.rotary_frequencies) {
      if (buffers) out.emplace_back(t.name, rope_inv_freq(*layout.rotary));
      continue;
    }
    std::vector<torch::Tensor> parts;
    for (const auto& part : t.parts) parts.push_back(param(part));
    if (std::any_of(parts.begin(), parts.end(), [](const auto& p) { return !p.defined(); }))
      continue;
    out.emplace_back(t.name, parts.size() == 1 ? parts[0] : torch::cat(parts, 0));
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> hf_tensors(const std::string& model, Model& m) {
  const hf_weights_detail::Layout layout = hf_weights_detail::layout_of_model(model, m);
  const auto params = m.named_parameters();
  // LoRA's adapters are merged into the weights they adapt: the published layout has no
  // place for them (save them apart with lora_adapter_tensors).
  const std::map<std::string, torch::Tensor> merged = lora_merged_weights(m);
  return published_tensors(
      layout,
      [&](const std::string& name) {
        const auto it = merged.find(name);
        if (it != merged.end()) return it->second;
        const torch::Tensor* p = params.find(name);
        if (!p) fail_runtime(fmt::format("{} has no parameter '{}'", model, name));
        return p->detach();
      },
      true);
}

std::vector<std::pair<std::string, torch::Tensor>> hf_gradients(const std::string& model,
                                                                Model& m) {
  const hf_weights_detail::Layout layout = hf_weights_detail::layout_of_model(model, m);
  const auto params = m.named_parameters();
  return published_tensors(
      layout,
      [&](const std::string& name) {
        const torch::Tensor* p = params.find(name);
        if (!p) fail_runtime(fmt::format("{} has no parameter '{}'", model, name));
        return p->grad().defined() ? p->grad().detach() : torch::Tensor();
      },
      false);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> hf_tensor_shapes(
    const std::string& model, const nlohmann::json& arch) {
  const hf_weights_detail::Layout layout = hf_weights_detail::layout_of_arch(model, arch);
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const hf_weights_detail::HfTensor& t : layout.tensors) out.emplace_back(t.name, t.shape);
  return out;
}

void check_hf_tensor_shapes(const std::string& model, const nlohmann::json& arch,
                            const std::map<std::string, std::vector<int64_t>>& given,
                            const std::string& source) {
  const hf_weights_detail::Layout layout = hf_weights_detail::layout_of_arch(model, arch);
  std::vector<std::string> names;
  for (const auto& named : given) names.push_back(named.first);
  hf_weights_detail::check_layout_tensors(
      model, layout, names,
      [&](const std::string& name) -> std::optional<at::IntArrayRef> {
        const auto it = given.find(name);
        if (it == given.end()) return std::nullopt;
        return at::IntArrayRef(it->second);
      },
      source);
}

void load_hf_tensors(const std::string& model, Model& m,
                     const std::map<std::string, torch::Tensor>& tensors,
                     const std::string& source) {
  const hf_weights_detail::Layout layout = hf_weights_detail::layout_of_model(model, m);
  auto find = [&](const std::string& name) -> const torch::Tensor* {
    if (name.empty()) return nullptr;
    auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
  };

  // Everything is checked before the first copy.
  std::vector<std::string> given;
  for (const auto& named : tensors) given.push_back(named.first);
  hf_weights_detail::check_layout_tensors(
      model, layout, given,
      [&](const std::string& name) -> std::optional<at::IntArrayRef> {
        const torch::Tensor* t = find(name);
        if (!t) return std::nullopt;
        return t->sizes();
      },
      source);
  for (const hf_weights_detail::HfTensor& t : layout.tensors) {
    for (const std::string* name : {&t.name, &t.head_alias}) {
      const torch::Tensor* given_tensor = find(*name);
      if (!given_tensor) continue;
      check_usage(given_tensor->is_floating_point(),
                  fmt::format("{}: tensor '{}' is {}, not floating point", source, *name,
                              c10::toString(given_tensor->scalar_type())),
                  "weights are float32, bfloat16 or float16");
    }
    const torch::Tensor *embedding = find(t.name), *head = find(t.head_alias);
    if (embedding && head &&
        (embedding->scalar_type() != head->scalar_type() || !torch::equal(*embedding, *head)))
      fail_usage(fmt::format("{}: '{}' differs from '{}': the weights are not tied", source,
                             t.head_alias, t.name),
                 fmt::format("gradscope's {} ties its head to the embedding (this architecture "
                             "has tie_word_embeddings true); drop '{}' from the file, or set "
                             "tie_word_embeddings false if the architecture allows it",
                             model, t.head_alias));
    if (t.rotary_frequencies) {
      // The frequencies as the file's dtype holds them (bf16 and fp16 files round them).
      const torch::Tensor expected =
          rope_inv_freq(*layout.rotary).to(embedding->scalar_type()).to(torch::kFloat);
      const torch::Tensor given = embedding->to(torch::kCPU, torch::kFloat);
      check_usage(torch::allclose(given, expected, 1e-6, 0.0),
                  fmt::format("{}: '{}' holds rotary frequencies other than those of rope_theta "
                              "{} (head size {})",
                              source, t.name, layout.rotary->theta(), layout.rotary->head_size()),
                  "the weights and the configuration disagree: give the folder with its "
                  "config.json");
    }
  }

  const auto params = m.named_parameters();
  torch::NoGradGuard no_grad;
  for (const hf_weights_detail::HfTensor& t : layout.tensors) {
    if (t.rotary_frequencies) continue;
    const torch::Tensor* embedding = find(t.name);
    const torch::Tensor& given = embedding ? *embedding : *find(t.head_alias);
    std::vector<int64_t> rows;
    std::vector<torch::Tensor> targets;
    for (const auto& part : t.parts) {
      const torch::Tensor* p = params.find(part);
      if (!p) fail_runtime(fmt::format("{} has no parameter '{}'", model, part));
      targets.push_back(*p);
      rows.push_back(p->size(0));
    }
    if (targets.size() == 1) {
      targets[0].copy_(given);
    } else {
      const auto pieces = given.split_with_sizes(rows, 0);
      for (size_t i = 0; i < targets.size(); ++i) targets[i].copy_(pieces[i]);
    }
  }
}

}  // namespace gradscope
