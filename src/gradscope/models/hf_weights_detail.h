// What the published tensor names (hf_weights.cpp) and configurations (hf_config.cpp) share:
// the shapes of a model's published layout and config names, each published model's own
// functions, and PublishedNames, which a model family's registry entry points at.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/models/common/layers.h"
#include "gradscope/models/model.h"

namespace gradscope {
struct PublishedNames;
}

namespace gradscope::hf_weights_detail {

using Shape = std::vector<int64_t>;

// ---- tensor layouts: each published tensor, in the published state_dict's order, with the
// gradscope parameters it is made of.

struct HfTensor {
  std::string name;                 // the published name
  std::vector<std::string> parts;   // gradscope parameter names, stacked by rows when several
  Shape shape;                      // the published shape
  std::string head_alias;           // a tied embedding: the head's published name
  bool rotary_frequencies = false;  // nanoVLM's inv_freq buffer: from the configuration
};

struct Layout {
  const char* published_as = "";  // the published class, for messages
  std::vector<HfTensor> tensors;
  std::optional<RotaryOptions> rotary;  // the frequencies of a rotary_frequencies entry
};

// ---- configurations: the architecture keys with a published name, the published keys whose
// value gradscope's model fixes, and the keys written for the published loaders only.

enum class KeyKind { kInteger, kNumber, kFlag, kText, kObject };

struct KeyName {
  const char* arch;       // the architecture's key
  const char* published;  // the config's key
  KeyKind kind;
};

// A published key whose value gradscope's model fixes: written, and when a config gives it,
// checked (unless `checked` is false: it changes nothing gradscope builds).
struct FixedKey {
  const char* published;
  nlohmann::json value;
  bool checked = true;
};

struct ConfigNames {
  const char* architecture_class;  // "architectures": [...]; null for nanoVLM (none)
  std::vector<KeyName> keys;
  std::vector<FixedKey> fixed;
  // Architecture keys with a published spelling that is not one key (ViT's num_labels).
  std::vector<std::string> special;
};

// A usage error unless `model` is one of the registry's models with published names.
void check_published(const std::string& model);

// The published names of `model`; a usage error as check_published.
const PublishedNames& published_names(const std::string& model);

// ViT's classes: the architecture's num_labels, checked.
int64_t vit_num_labels(const nlohmann::json& arch);

// ---- each published model's functions, for its PublishedNames (models/registry.cpp).
// Layouts (hf_weights.cpp): of an architecture, and of a built model.
Layout llama_layout_of_arch(const nlohmann::json& arch);
Layout llama_layout_of_model(Model& m);
Layout modernbert_layout_of_arch(const nlohmann::json& arch);
Layout modernbert_layout_of_model(Model& m);
Layout vit_layout_of_arch(const nlohmann::json& arch);
Layout vit_layout_of_model(Model& m);
std::string vit_adapter_module(const std::string& published_module);
Layout nanovlm_layout_of_arch(const nlohmann::json& arch);
Layout nanovlm_layout_of_model(Model& m);
// Configurations (hf_config.cpp).
const ConfigNames& llama_config_names();
const ConfigNames& modernbert_config_names();
const ConfigNames& vit_config_names();
const ConfigNames& nanovlm_config_names();
void llama_write_derived(const nlohmann::json& arch, nlohmann::json& out);
void modernbert_write_derived(const nlohmann::json& arch, nlohmann::json& out);
void vit_write_derived(const nlohmann::json& arch, nlohmann::json& out);
void nanovlm_write_derived(const nlohmann::json& arch, nlohmann::json& out);
void llama_read_special(const nlohmann::json& config, nlohmann::json& arch,
                        const std::string& source);
void modernbert_read_special(const nlohmann::json& config, nlohmann::json& arch,
                             const std::string& source);
void vit_read_special(const nlohmann::json& config, nlohmann::json& arch,
                      const std::string& source);

}  // namespace gradscope::hf_weights_detail

namespace gradscope {

// A model family's published names (docs/weights.md, "Names"): its tensors and its
// config.json both ways. A family without them (the toy problems) has none.
struct PublishedNames {
  // The published tensors of an architecture, and of a built model of the family (a runtime
  // error when the model is another family's).
  hf_weights_detail::Layout (*layout_of_arch)(const nlohmann::json& arch);
  hf_weights_detail::Layout (*layout_of_model)(Model& m);
  // The config's keys under their published names.
  const hf_weights_detail::ConfigNames& (*config_names)();
  // Writes the keys for the published loaders only, derived from the architecture (never read
  // back).
  void (*write_derived)(const nlohmann::json& arch, nlohmann::json& out);
  // Reads published spellings that are not one key (Hugging Face's newer rotary settings,
  // ViT's labels) into the architecture; null when there are none.
  void (*read_special)(const nlohmann::json& config, nlohmann::json& arch,
                       const std::string& source);
  // PEFT's task_type for the family's adapters ("CAUSAL_LM"), or null when PEFT has none.
  const char* peft_task_type;
  // The name PEFT gives an adapted module, from its published name: PEFT adapts the modules
  // of the model as transformers builds it, whose names may differ from the checkpoint's
  // (ViT's under transformers 5); null when they are the same.
  std::string (*adapter_module)(const std::string& published_module) = nullptr;
};

namespace hf_weights_detail {
// The family's published names; a usage error for a model without them (the toy problems).
const PublishedNames& published_names(const std::string& model);
// The published tensors of a built model of `model`'s family.
Layout layout_of_model(const std::string& model, Model& m);
// A name from a file for a message, cut to 100 bytes (at a character boundary), control
// characters as '?'.
std::string short_name(const std::string& name);
}  // namespace hf_weights_detail

}  // namespace gradscope
