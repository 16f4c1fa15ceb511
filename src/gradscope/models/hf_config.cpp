// The configurations of models with published names: config.json both ways, each key of
// gradscope's architecture under its published name (hf_weights.h).
#include "gradscope/models/hf_weights.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/models/common/arch.h"
#include "gradscope/models/hf_weights_detail.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/registry.h"

namespace gradscope {
namespace hf_weights_detail {

using nlohmann::json;

// ---------------------------------------------------------------------------------------
// Configurations (hf_weights_detail.h).

constexpr KeyKind kInt = KeyKind::kInteger, kNum = KeyKind::kNumber,
                  kFlag = KeyKind::kFlag, kText = KeyKind::kText,
                  kObject = KeyKind::kObject;

const ConfigNames& llama_config_names() {
  static const ConfigNames llama{"LlamaForCausalLM",
                                 {{"model_type", "model_type", kText},
                                  {"vocab_size", "vocab_size", kInt},
                                  {"hidden_size", "hidden_size", kInt},
                                  {"num_hidden_layers", "num_hidden_layers", kInt},
                                  {"num_attention_heads", "num_attention_heads", kInt},
                                  {"num_key_value_heads", "num_key_value_heads", kInt},
                                  {"head_dim", "head_dim", kInt},
                                  {"intermediate_size", "intermediate_size", kInt},
                                  {"rms_norm_eps", "rms_norm_eps", kNum},
                                  {"rope_theta", "rope_theta", kNum},
                                  {"rope_scaling", "rope_scaling", kObject},
                                  {"tie_word_embeddings", "tie_word_embeddings", kFlag},
                                  {"attention_bias", "attention_bias", kFlag},
                                  {"mlp_bias", "mlp_bias", kFlag},
                                  {"attention_dropout", "attention_dropout", kNum},
                                  {"initializer_range", "initializer_range", kNum}},
                                 {{"hidden_act", "silu"}, {"pretraining_tp", 1, false}},
                                 {}};
  return llama;
}

const ConfigNames& modernbert_config_names() {
  static const ConfigNames modernbert{
      "ModernBertForMaskedLM",
      {{"model_type", "model_type", kText},
       {"vocab_size", "vocab_size", kInt},
       {"hidden_size", "hidden_size", kInt},
       {"num_hidden_layers", "num_hidden_layers", kInt},
       {"num_attention_heads", "num_attention_heads", kInt},
       {"intermediate_size", "intermediate_size", kInt},
       {"global_attn_every_n_layers", "global_attn_every_n_layers", kInt},
       {"local_attention", "local_attention", kInt},
       {"global_rope_theta", "global_rope_theta", kNum},
       {"local_rope_theta", "local_rope_theta", kNum},
       {"norm_eps", "norm_eps", kNum},
       {"norm_bias", "norm_bias", kFlag},
       {"attention_bias", "attention_bias", kFlag},
       {"mlp_bias", "mlp_bias", kFlag},
       {"decoder_bias", "decoder_bias", kFlag},
       {"attention_dropout", "attention_dropout", kNum},
       {"initializer_range", "initializer_range", kNum}},
      {{"hidden_activation", "gelu"},
       {"classifier_activation", "gelu"},
       {"classifier_bias", false},
       {"tie_word_embeddings", true},
       // gradscope's embedding has no padding row; Hugging Face's default id (50283) would
       // not fit a smaller vocabulary.
       {"pad_token_id", nullptr, false}},
      {}};
  return modernbert;
}

const ConfigNames& vit_config_names() {
  static const ConfigNames vit{"ViTForImageClassification",
                               {{"model_type", "model_type", kText},
                                {"hidden_size", "hidden_size", kInt},
                                {"num_hidden_layers", "num_hidden_layers", kInt},
                                {"num_attention_heads", "num_attention_heads", kInt},
                                {"intermediate_size", "intermediate_size", kInt},
                                {"image_size", "image_size", kInt},
                                {"patch_size", "patch_size", kInt},
                                {"num_channels", "num_channels", kInt},
                                {"layer_norm_eps", "layer_norm_eps", kNum},
                                {"qkv_bias", "qkv_bias", kFlag},
                                {"hidden_act", "hidden_act", kText},
                                {"initializer_range", "initializer_range", kNum},
                                {"hidden_dropout", "hidden_dropout_prob", kNum},
                                {"attention_dropout", "attention_probs_dropout_prob", kNum}},
                               {},
                               {"num_labels"}};
  return vit;
}

const ConfigNames& nanovlm_config_names() {
  static const ConfigNames nanovlm{
      nullptr,
      {{"vision_hidden_size", "vit_hidden_dim", kInt},
       {"vision_intermediate_size", "vit_inter_dim", kInt},
       {"patch_size", "vit_patch_size", kInt},
       {"image_size", "vit_img_size", kInt},
       {"vision_num_attention_heads", "vit_n_heads", kInt},
       {"vision_num_hidden_layers", "vit_n_blocks", kInt},
       {"vision_layer_norm_eps", "vit_ln_eps", kNum},
       {"hidden_size", "lm_hidden_dim", kInt},
       {"intermediate_size", "lm_inter_dim", kInt},
       {"rms_norm_eps", "lm_rms_eps", kNum},
       {"rope_theta", "lm_re_base", kNum},
       {"vocab_size", "lm_vocab_size", kInt},
       {"num_attention_heads", "lm_n_heads", kInt},
       {"num_key_value_heads", "lm_n_kv_heads", kInt},
       {"num_hidden_layers", "lm_n_blocks", kInt},
       {"tie_word_embeddings", "lm_tie_weights", kFlag},
       {"pixel_shuffle_factor", "mp_pixel_shuffle_factor", kInt}},
      {{"vit_cls_flag", false}, {"lm_attn_scaling", 1.0}, {"lm_use_tokens", false, false}},
      {}};
  return nanovlm;
}

const char* kind_text(KeyKind kind) {
  switch (kind) {
    case KeyKind::kInteger:
      return "a whole number";
    case KeyKind::kNumber:
      return "a number";
    case KeyKind::kFlag:
      return "true or false";
    case KeyKind::kText:
      return "a string";
    case KeyKind::kObject:
      return "an object or null";
  }
  return "?";
}

[[noreturn]] void fail_config(const std::string& source, const std::string& what,
                              const std::string& model) {
  fail_usage(fmt::format("{}: {}", source, what),
             fmt::format("gradscope reads {}'s config.json as docs/weights.md (\"Names\") "
                         "describes it",
                         model));
}

// The value of a published key as the architecture holds it (integers as integers, numbers as
// floats), or a usage error naming the key.
json config_value(const json& v, KeyKind kind, const std::string& key, const std::string& source,
                  const std::string& model) {
  if (v.is_null()) return v;
  bool ok = false;
  json out = v;
  switch (kind) {
    case KeyKind::kInteger:
      ok = v.is_number_integer();
      if (ok) out = v.get<int64_t>();
      break;
    case KeyKind::kNumber:
      ok = v.is_number();
      if (ok) out = v.get<double>();
      break;
    case KeyKind::kFlag:
      ok = v.is_boolean();
      break;
    case KeyKind::kText:
      ok = v.is_string();
      break;
    case KeyKind::kObject:
      ok = v.is_object();
      break;
  }
  if (!ok)
    fail_config(source, fmt::format("'{}' must be {}, got {}", key, kind_text(kind), v.dump()),
                model);
  return out;
}

// A value of the "gradscope" object, checked against the type `base` has for it (as --arch
// checks its overrides); any value when `base` has none.
json gradscope_value(const json& v, const json* slot, const std::string& key,
                     const std::string& source, const std::string& model) {
  if (!slot || slot->is_null() || v.is_null()) return v;
  const char* expected = nullptr;
  if (slot->is_number_integer()) {
    if (v.is_number_integer()) return v.get<int64_t>();
    expected = "a whole number";
  } else if (slot->is_number()) {
    if (v.is_number()) return v.get<double>();
    expected = "a number";
  } else if (slot->is_boolean()) {
    if (v.is_boolean()) return v;
    expected = "true or false";
  } else if (slot->is_string()) {
    if (v.is_string()) return v;
    expected = "a string";
  } else if (slot->is_object()) {
    if (v.is_object()) return v;
    expected = "an object";
  } else {
    if (v.is_array()) return v;
    expected = "an array";
  }
  fail_config(source,
              fmt::format("'gradscope.{}' must be {} (the preset has {}={}), got {}", key, expected,
                          key, slot->dump(), v.dump()),
              model);
}

// Keys written for the published loaders, derived from the architecture and never read back.

// The length gradscope trained at, and at least the context the rotary scaling was made for
// (Llama 3's original_max_position_embeddings): Hugging Face's Llama computes rotary tables for
// any position and its llama3 scaling reads neither, but its loader warns when the scaling's
// context exceeds this.
void llama_write_derived(const json& arch, json& out) {
  if (!arch.contains("seq_len")) return;
  json positions = arch["seq_len"];
  const auto scaling = arch.find("rope_scaling");
  if (scaling != arch.end() && scaling->is_object()) {
    const auto original = scaling->find("original_max_position_embeddings");
    if (original != scaling->end() && original->is_number() && positions.is_number() &&
        original->get<double>() > positions.get<double>())
      positions = static_cast<int64_t>(std::ceil(original->get<double>()));
  }
  out["max_position_embeddings"] = positions;
}

void modernbert_write_derived(const json& arch, json& out) {
  if (arch.contains("seq_len")) out["max_position_embeddings"] = arch["seq_len"];
  // gradscope's one hidden dropout is Hugging Face's embedding and MLP dropouts (its
  // attention_dropout also drops the attention output).
  if (arch.contains("hidden_dropout")) {
    out["embedding_dropout"] = arch["hidden_dropout"];
    out["mlp_dropout"] = arch["hidden_dropout"];
  }
}

void vit_write_derived(const json& arch, json& out) {
  const int64_t labels = vit_num_labels(arch);
  json id2label = json::object(), label2id = json::object();
  for (int64_t i = 0; i < labels; ++i) {
    id2label[std::to_string(i)] = fmt::format("LABEL_{}", i);
    label2id[fmt::format("LABEL_{}", i)] = i;
  }
  out["id2label"] = id2label;
  out["label2id"] = label2id;
}

// nanoVLM rescales its rotary frequencies past lm_max_position_embeddings, gradscope never:
// nanoVLM's default, or the whole sequence when longer.
void nanovlm_write_derived(const json& arch, json& out) {
  const json* seq = arch.contains("seq_len") ? &arch["seq_len"] : nullptr;
  const int64_t positions = nanovlm_config(arch).image_tokens() + (seq ? seq->get<int64_t>() : 0);
  out["lm_max_position_embeddings"] = std::max<int64_t>(8192, positions);
  if (seq) out["lm_max_length"] = *seq;  // caption tokens
}

// An object-valued key of `parent`, or a usage error naming it (`name`).
json object_at(const json& parent, const char* key, const std::string& name,
               const std::string& source, const std::string& model) {
  const json& v = parent.at(key);
  if (!v.is_object())
    fail_config(source, fmt::format("'{}' must be an object, got {}", name, v.dump()), model);
  return v;
}

// Hugging Face's newer spelling of rotary settings (rope_parameters).
void llama_read_special(const json& config, json& arch, const std::string& source) {
  const std::string model = "llama";
  if (!config.contains("rope_parameters") || config["rope_parameters"].is_null()) return;
  const json rp = object_at(config, "rope_parameters", "rope_parameters", source, model);
  if (!config.contains("rope_theta") && rp.contains("rope_theta"))
    arch["rope_theta"] =
        config_value(rp["rope_theta"], kNum, "rope_parameters.rope_theta", source, model);
  if (!config.contains("rope_scaling")) {
    const json type = rp.value("rope_type", json("default"));
    if (type == "default") {
      arch["rope_scaling"] = nullptr;
    } else {
      json scaling = rp;
      scaling.erase("rope_theta");
      arch["rope_scaling"] = scaling;
    }
  }
}

// Hugging Face's newer spelling of rotary settings (rope_parameters per attention kind), and
// layer_types, which must be what global_attn_every_n_layers builds.
void modernbert_read_special(const json& config, json& arch, const std::string& source) {
  const std::string model = "modernbert";
  if (config.contains("rope_parameters") && !config["rope_parameters"].is_null()) {
    const json rp = object_at(config, "rope_parameters", "rope_parameters", source, model);
    const std::pair<const char*, const char*> kinds[] = {{"full_attention", "global_rope_theta"},
                                                         {"sliding_attention", "local_rope_theta"}};
    for (const auto& [kind, key] : kinds) {
      if (!rp.contains(kind) || config.contains(key)) continue;
      const std::string name = std::string("rope_parameters.") + kind;
      const json p = object_at(rp, kind, name, source, model);
      const json type = p.value("rope_type", json("default"));
      if (type != "default")
        fail_config(source,
                    fmt::format("'{}.rope_type' is {}; gradscope's ModernBERT has only "
                                "\"default\" rotary embeddings",
                                name, type.dump()),
                    model);
      if (p.contains("rope_theta"))
        arch[key] = config_value(p["rope_theta"], kNum, name + ".rope_theta", source, model);
    }
  }
  if (config.contains("layer_types") && !config["layer_types"].is_null()) {
    const json& types = config["layer_types"];
    const ArchReader r(arch, "modernbert");
    const int64_t every = r.positive("global_attn_every_n_layers", 3);
    bool ok =
        types.is_array() && static_cast<int64_t>(types.size()) == r.positive("num_hidden_layers");
    for (size_t i = 0; ok && i < types.size(); ++i)
      ok = types[i] ==
           (static_cast<int64_t>(i) % every == 0 ? "full_attention" : "sliding_attention");
    if (!ok)
      fail_config(source,
                  fmt::format("'layer_types' {} is not global attention on every {}th layer "
                              "from layer 0, which is all gradscope's ModernBERT builds",
                              types.dump(), every),
                  model);
  }
}

// The labels: num_labels, or as many as id2label has.
void vit_read_special(const json& config, json& arch, const std::string& source) {
  const std::string model = "vit";
  std::optional<int64_t> labels;
  if (config.contains("num_labels") && !config["num_labels"].is_null())
    labels = config_value(config["num_labels"], kInt, "num_labels", source, model).get<int64_t>();
  if (config.contains("id2label") && !config["id2label"].is_null()) {
    const json id2label = object_at(config, "id2label", "id2label", source, model);
    const auto n = static_cast<int64_t>(id2label.size());
    if (labels && *labels != n)
      fail_config(
          source,
          fmt::format("'num_labels' {} disagrees with the {} labels of 'id2label'", *labels, n),
          model);
    labels = n;
  }
  if (labels) arch["num_labels"] = *labels;
}

// Which published class or kind of config this is; a usage error unless it is the model's.
void check_class(const std::string& model, const ConfigNames& names, const json& config,
                 const std::string& source) {
  if (!names.architecture_class) {
    for (const char* key : {"architectures", "model_type"})
      if (config.contains(key))
        fail_usage(fmt::format("{}: '{}' is {}: a Hugging Face config, not nanoVLM's", source, key,
                               config[key].dump()),
                   "nanovlm reads nanoVLM's own config.json (vit_*, lm_*, mp_* keys)");
    return;
  }
  if (config.contains("architectures") && !config["architectures"].is_null()) {
    const json& a = config["architectures"];
    if (!a.is_array())
      fail_config(source, "'architectures' must be a list, got " + a.dump(), model);
    const bool found = std::find(a.begin(), a.end(), json(names.architecture_class)) != a.end();
    if (!found)
      fail_usage(fmt::format("{}: 'architectures' is {}, not {}", source, a.dump(),
                             names.architecture_class),
                 fmt::format("gradscope's {} reads and writes {} weights", model,
                             names.architecture_class));
  }
  if (config.contains("model_type") && config["model_type"] != nlohmann::json(model))
    fail_usage(
        fmt::format("{}: 'model_type' is {}, not \"{}\"", source, config["model_type"].dump(),
                    model),
        fmt::format("pass a {} config.json, or pick the model it is for with --model", model));
}

}  // namespace hf_weights_detail

nlohmann::json hf_config(const std::string& model, const nlohmann::json& arch) {
  hf_weights_detail::check_published(model);
  model_registry().get(model).count_params(arch);  // a usage error when not an architecture
  const PublishedNames& names_of = hf_weights_detail::published_names(model);
  const hf_weights_detail::ConfigNames& names = names_of.config_names();
  nlohmann::json out = nlohmann::json::object();
  if (names.architecture_class) out["architectures"] = {names.architecture_class};
  std::set<std::string> published;
  for (const auto& key : names.keys) {
    published.insert(key.arch);
    if (arch.contains(key.arch)) out[key.published] = arch[key.arch];
  }
  for (const auto& fixed : names.fixed) out[fixed.published] = fixed.value;
  names_of.write_derived(arch, out);
  for (const auto& key : names.special) published.insert(key);
  nlohmann::json own = nlohmann::json::object();
  for (const auto& [key, value] : arch.items())
    if (!published.count(key)) own[key] = value;
  // A tokenizer read from a file is written as the file beside the weights (--save-weights
  // copies it there), never as a path on this machine.
  if (own.contains("tokenizer") && own["tokenizer"].is_string()) {
    const std::string name = own["tokenizer"].get<std::string>();
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0)
      own["tokenizer"] = "tokenizer.json";
  }
  if (!own.empty()) out["gradscope"] = own;
  return out;
}

nlohmann::json arch_from_hf_config(const std::string& model, const nlohmann::json& config,
                                   const nlohmann::json& base, const std::string& source) {
  using hf_weights_detail::fail_config;
  hf_weights_detail::check_published(model);
  check_usage(config.is_object(), source + " is not a JSON object",
              "config.json holds the model's configuration as Hugging Face writes it");
  if (!base.is_null() && !base.is_object())
    fail_runtime("arch_from_hf_config: the base architecture is not an object");
  const PublishedNames& names_of = hf_weights_detail::published_names(model);
  const hf_weights_detail::ConfigNames& names = names_of.config_names();
  hf_weights_detail::check_class(model, names, config, source);

  nlohmann::json arch = base.is_object() ? base : nlohmann::json::object();
  std::set<std::string> published(names.special.begin(), names.special.end());
  for (const auto& key : names.keys) {
    published.insert(key.arch);
    if (config.contains(key.published)) {
      arch[key.arch] = hf_weights_detail::config_value(config[key.published], key.kind,
                                                       key.published, source, model);
      check_arch_limit(arch[key.arch], key.arch, source, key.published);
    }
  }
  if (names_of.read_special) names_of.read_special(config, arch, source);
  for (const auto& fixed : names.fixed) {
    if (!fixed.checked || !config.contains(fixed.published)) continue;
    const nlohmann::json& v = config[fixed.published];
    const bool same = v.is_number() && fixed.value.is_number()
                          ? v.get<double>() == fixed.value.get<double>()
                          : v == fixed.value;
    if (!same)
      fail_config(source,
                  fmt::format("'{}' is {}; gradscope's {} has {} only", fixed.published, v.dump(),
                              model, fixed.value.dump()),
                  model);
  }
  if (config.contains("gradscope")) {
    const nlohmann::json& own = config["gradscope"];
    if (!own.is_object())
      fail_config(source, "'gradscope' must be an object, got " + own.dump(), model);
    for (const auto& [key, value] : own.items()) {
      if (published.count(key))
        fail_config(
            source,
            fmt::format("'gradscope.{}' has a published name: give it at the top level", key),
            model);
      const nlohmann::json* slot = arch.contains(key) ? &arch[key] : nullptr;
      arch[key] = hf_weights_detail::gradscope_value(value, slot, key, source, model);
      check_arch_limit(arch[key], key, source, "gradscope." + key);
    }
  }
  if (arch.contains("model_type") && arch["model_type"] != nlohmann::json(model))
    fail_config(source,
                fmt::format("'model_type' is {}, not \"{}\"", arch["model_type"].dump(), model),
                model);
  check_arch_limits(arch, source);
  const ModelFamily& family = model_registry().get(model);
  try {
    if (family.finalize) family.finalize(arch);
    family.count_params(arch);  // parses and checks every key the model reads
  } catch (const Error& e) {
    fail_usage(fmt::format("{}: {}", source, e.what()), e.hint());
  }
  return arch;
}

}  // namespace gradscope
