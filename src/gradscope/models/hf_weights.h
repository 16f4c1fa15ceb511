// The published names of each model's weights and configuration, both ways (docs/weights.md,
// "Names"): Llama as Hugging Face's LlamaForCausalLM, ModernBERT as ModernBertForMaskedLM, ViT
// as ViTForImageClassification, NanoVLM as huggingface/nanoVLM's own VisionLanguageModel (its
// v0.1 config keys, which nanoVLM-222M was published with).
//
// Where gradscope's layout differs from the published one, the mapping converts:
// - ModernBERT's attention has three projections q, k, v where Hugging Face has one fused
//   attn.Wqkv, and nanoVLM's vision attention one qkv_proj: the published tensor is the three
//   weights (and biases) stacked by rows, q first.
// - A tied head is one tensor, written once under the embedding's name; a file may also hold it
//   under the head's name (lm_head.weight, decoder.weight, decoder.head.weight), then equal to
//   the embedding bitwise.
// - nanoVLM keeps its decoder's rotary frequencies as a buffer in its state_dict
//   (decoder.rotary_embd.inv_freq): written from the configuration, and checked on reading.
// Everything else maps one to one with the same shape: gradscope's rotary embeddings rotate
// the halves of a head (Hugging Face's rotate_half, nanoVLM's too), so q and k rows keep their
// order, and patch projections are Conv2d weights (C, channels, P, P) on both sides.
//
// Dimension legend: C hidden size, V vocabulary, P patch size, L layers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/models/model.h"

namespace gradscope {

// The published config.json of an architecture: the published class's keys and values
// ("architectures": ["LlamaForCausalLM"], "model_type": "llama", ...; nanoVLM: its VLMConfig
// keys), plus a "gradscope" object holding the architecture keys the class has no name for
// (tokenizer, seq_len, dataset, dropouts the class does not have...), so that
// arch_from_hf_config(model, hf_config(model, arch), {}, source) == arch exactly. A few keys are
// written for the published loaders only and never read back (max_position_embeddings, the
// dropouts ModernBERT splits three ways, nanoVLM's lm_max_length). A usage error when `arch`
// is not a valid architecture of `model`, or `model` has no published names (the toy models).
nlohmann::json hf_config(const std::string& model, const nlohmann::json& arch);

// The architecture (the keys --arch takes) from a config.json, starting from `base` (the
// preset's architecture: keys the config does not give keep their values). Accepts what
// hf_config writes and the published configs, in Hugging Face's older (rope_theta,
// rope_scaling) and newer (rope_parameters) spellings. A key of the wrong type, a value
// gradscope's model cannot take (Llama's hidden_act other than silu, a nanoVLM class token...),
// or an architecture class that is not the model's is a usage error naming `source` and the
// key; so is a result that is not a valid architecture.
nlohmann::json arch_from_hf_config(const std::string& model, const nlohmann::json& config,
                                   const nlohmann::json& base, const std::string& source);

// The model's weights under the published names, in the order the published state_dict lists
// them: a tied head written once, as the embedding; ModernBERT's q, k, v stacked into
// attn.Wqkv (nanoVLM's into qkv_proj). Tensors are the model's own (detached, sharing their
// storage), or new ones for the stacked projections and nanoVLM's rotary frequencies.
std::vector<std::pair<std::string, torch::Tensor>> hf_tensors(const std::string& model, Model& m);

// The gradients of the model's parameters under the published names, laid out as hf_tensors
// lays out the weights (ModernBERT's q, k, v gradients stacked into attn.Wqkv's; a tied
// head's once, as the embedding's, holding both uses): what a published model's parameters'
// .grad hold after the same backward. Tensors with a part that has no gradient (frozen, or
// not reached) and buffers are left out.
std::vector<std::pair<std::string, torch::Tensor>> hf_gradients(const std::string& model,
                                                                Model& m);

// The names and shapes hf_tensors gives for this architecture, without building the model
// (paper presets do not fit in memory in tests): for listing against the published lists.
std::vector<std::pair<std::string, std::vector<int64_t>>> hf_tensor_shapes(
    const std::string& model, const nlohmann::json& arch);

// Checks a file's tensor names and shapes (a safetensors header's, by name) against the
// published layout of `arch`, before the model is built or any tensor read: every tensor of
// the layout with its shape and no other, as load_hf_tensors requires; a usage error naming
// `source` and the tensor. The architecture's sizes must be within the limits
// check_arch_limits states (the layout lists every layer's tensors).
void check_hf_tensor_shapes(const std::string& model, const nlohmann::json& arch,
                            const std::map<std::string, std::vector<int64_t>>& given,
                            const std::string& source);

// Copies published tensors into the model (converting each to its parameter's dtype and
// device; values as given). Every tensor hf_tensors lists must be present with its shape, and
// no other: a missing, extra or misshapen tensor is a usage error naming `source` and the
// tensor, found before anything is copied (nothing half-loaded). A tied head may also be given
// under the head's name (and then only equal to the embedding bitwise, else a usage error:
// the weights are not tied), or under the head's name alone (as nanoVLM's own files hold it).
void load_hf_tensors(const std::string& model, Model& m,
                     const std::map<std::string, torch::Tensor>& tensors,
                     const std::string& source);

}  // namespace gradscope
