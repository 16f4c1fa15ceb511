// Weights in and out of a run: --init-from reads a Hugging Face folder (config.json,
// model.safetensors or a sharded set, tokenizer.json) or one .safetensors file; --save-weights
// writes the folder back (docs/weights.md). The tensor names and the config's keys are the
// published ones (models/hf_weights.h); the files are read and written by core/safetensors.h.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "gradscope/models/model.h"

namespace gradscope {

// What an --init-from path holds, found without reading any tensor.
struct InitSource {
  std::string path;                      // as given
  std::string weights;                   // the .safetensors file, or the folder holding them
  std::optional<nlohmann::json> config;  // the folder's config.json, when it has one
  std::string config_path;
  std::string tokenizer_json;  // the folder's tokenizer.json, "" when it has none
};

// A usage error naming the path when it is neither a .safetensors file nor a folder with
// model.safetensors or model.safetensors.index.json, or when its config.json is not a JSON
// object.
InitSource read_init_source(const std::string& path);

// The run's architecture with an --init-from folder's config.json applied over `arch` (the
// preset's): the keys --arch takes, as the config gives them (arch_from_hf_config). `arch` as
// given when the source has no config.json.
nlohmann::json apply_init_config(const std::string& model, const InitSource& source,
                                 const nlohmann::json& arch);

// Checks the source's tensor names and shapes, from the safetensors headers alone, against the
// published layout of `arch` (the resolved architecture, its sizes within check_arch_limits):
// every tensor of the layout with its shape and no other. Run before the model is built, so
// that a config.json that does not describe the weights beside it, or a file holding another
// tensor, is a usage error naming the file and the tensor before anything of the claimed sizes
// is allocated or any tensor's data is read.
void check_init_weights(const std::string& model, const nlohmann::json& arch,
                        const InitSource& source);

// Copies the source's tensors into the model (every tensor found with its shape, and no other;
// a usage error naming the file and the tensor otherwise, before anything is copied).
void load_init_weights(const std::string& model, Model& m, const InitSource& source);

// Checks, before a run starts, that `dir` can be written: it is a folder or can be made in an
// existing, writable one; an existing folder must be empty or hold an earlier save of the same
// kind (weights, or with `adapters` LoRA's adapters) and no other file, since a save replaces
// the whole folder. A usage error naming it otherwise.
void check_weights_folder(const std::string& dir, bool adapters = false);

// Writes config.json and model.safetensors (a sharded set above 5 GiB) into a new folder beside
// `dir` and puts it in place of `dir` whole (replace_folder, core/files.h): a kill at any moment
// leaves the earlier save or the new one, never a mix. `tokenizer_json`, when not empty, is
// copied beside them as tokenizer.json. Returns the files written (as paths in `dir`).
std::vector<std::string> save_weights(const std::string& model, Model& m,
                                      const nlohmann::json& arch, const std::string& dir,
                                      const std::string& tokenizer_json = "");

// Writes LoRA's adapters as PEFT does (hf_adapters), the folder replaced whole as above:
// adapter_model.safetensors and adapter_config.json, whose base_model_name_or_path is the
// absolute path of `base_model` (the --init-from folder), or null when it is not a folder with
// config.json. Returns the files written.
std::vector<std::string> save_adapters(const std::string& model, Model& m,
                                       const LoraOptions& options, const std::string& dir,
                                       const std::string& base_model);

// --init-adapters DIR: a PEFT adapters folder (adapter_config.json and
// adapter_model.safetensors, as PEFT's save_pretrained or --save-adapters writes it) read into
// the adapters attached with `options` (load_hf_adapters, models/hf_adapters.h). A usage error
// naming DIR for a folder without those files or with adapters the run cannot hold.
void load_init_adapters(const std::string& model, Model& m, const LoraOptions& options,
                        const std::string& dir);

}  // namespace gradscope
