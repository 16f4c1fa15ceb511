#include "gradscope/train/weights_io.h"

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <system_error>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/safetensors.h"
#include "gradscope/models/hf_adapters.h"
#include "gradscope/models/hf_weights.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;

// config.json is small; published tokenizers are a few MiB.
constexpr int64_t kMaxConfigBytes = int64_t{1} << 20;
constexpr int64_t kMaxTokenizerBytes = int64_t{256} << 20;  // as data/ reads them

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Whether `name` is a file a save of that kind writes.
bool saved_file(const std::string& name, bool adapters) {
  if (adapters) return name == "adapter_config.json" || name == "adapter_model.safetensors";
  return name == "config.json" || name == "tokenizer.json" || name == "model.safetensors" ||
         name == "model.safetensors.index.json" ||
         (name.rfind("model-", 0) == 0 && ends_with(name, ".safetensors"));
}

// Writes a save into a new folder beside `dir` (".NAME.saving-XXXXXX") with `write`, then
// puts that folder in place of `dir` whole (replace_folder, core/files.h): a reader of `dir`,
// or a process killed at any moment, sees the earlier save or the new one, never a mix of the
// two. Returns the files written, as paths in `dir`. A symbolic link `dir` stays: the folder
// it points at is replaced.
std::vector<std::string> save_folder(
    const std::string& dir,
    const std::function<std::vector<std::string>(const std::string& staged)>& write) {
  std::error_code ec;
  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  if (fs::is_symlink(target, ec)) {
    target = fs::canonical(target, ec);
    if (ec) fail_runtime(fmt::format("cannot resolve '{}': {}", dir, ec.message()));
  }
  // What a save killed part-way left behind.
  for (const fs::path& stale : sibling_folders(target, ".saving-")) fs::remove_all(stale, ec);
  const fs::path staged = make_sibling_folder(target, ".saving-");
  std::vector<std::string> written;
  try {
    for (const std::string& file : write(staged.string()))
      written.push_back((fs::path(dir) / fs::path(file).filename()).string());
    replace_folder(staged, target);
  } catch (...) {
    fs::remove_all(staged, ec);
    throw;
  }
  // Earlier saves that a file system without RENAME_EXCHANGE left aside.
  for (const fs::path& aside : sibling_folders(target, kAsideTag)) fs::remove_all(aside, ec);
  return written;
}

}  // namespace

InitSource read_init_source(const std::string& path) {
  InitSource source;
  source.path = path;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  check_usage(!ec && fs::exists(status), "--init-from '" + path + "' does not exist",
              "name a Hugging Face model folder (config.json and model.safetensors) or a "
              ".safetensors file");
  if (fs::is_regular_file(status)) {
    check_usage(ends_with(path, ".safetensors"),
                "--init-from '" + path + "' is a file but not a .safetensors file",
                "name a .safetensors file, or the folder that holds model.safetensors");
    source.weights = path;
    return source;
  }
  check_usage(fs::is_directory(status),
              "--init-from '" + path + "' is neither a file nor a folder");
  const fs::path dir(path);
  // Each file a folder may hold is either absent or a regular file: one that is there in
  // another form (a folder, a FIFO, a dangling link) is refused, never taken as absent.
  const bool single = optional_input_file((dir / "model.safetensors").string(), "weights file");
  const bool sharded =
      optional_input_file((dir / "model.safetensors.index.json").string(), "safetensors index");
  check_usage(
      single || sharded,
      "folder '" + path + "' has neither model.safetensors nor model.safetensors.index.json",
      "--init-from takes a folder as Hugging Face writes it, or a .safetensors file");
  source.weights = path;
  const fs::path config = dir / "config.json";
  if (optional_input_file(config.string(), "model config")) {
    source.config_path = config.string();
    nlohmann::json j = parse_json_input_unique(
        read_input_file(source.config_path, "model config", kMaxConfigBytes), source.config_path);
    check_usage(j.is_object(), "'" + source.config_path + "' is not a JSON object",
                "config.json holds the model's configuration as Hugging Face writes it");
    source.config = std::move(j);
  }
  const fs::path tokenizer = dir / "tokenizer.json";
  if (optional_input_file(tokenizer.string(), "tokenizer file"))
    source.tokenizer_json = tokenizer.string();
  return source;
}

nlohmann::json apply_init_config(const std::string& model, const InitSource& source,
                                 const nlohmann::json& arch) {
  if (!source.config) return arch;
  return arch_from_hf_config(model, *source.config, arch, source.config_path);
}

void check_init_weights(const std::string& model, const nlohmann::json& arch,
                        const InitSource& source) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (SafetensorsEntry& e : read_safetensors_header(source.weights))
    shapes.emplace(e.name, std::move(e.shape));
  check_hf_tensor_shapes(model, arch, shapes, source.weights);
}

void load_init_weights(const std::string& model, Model& m, const InitSource& source) {
  const std::map<std::string, torch::Tensor> tensors = read_safetensors(source.weights);
  load_hf_tensors(model, m, tensors, source.weights);
}

void check_weights_folder(const std::string& dir, bool adapters) {
  check_usage(!dir.empty(), "--save-weights needs a folder");
  std::error_code ec;
  const fs::path p(dir);
  if (fs::exists(p, ec)) {
    check_usage(fs::is_directory(p, ec), "--save-weights '" + dir + "' exists and is not a folder",
                "name a new folder, or one an earlier --save-weights wrote");
    check_usage(access(dir.c_str(), W_OK) == 0,
                "--save-weights folder '" + dir + "' is not writable");
    // Only an empty folder or an earlier save is written over: config.json and the weights
    // files of any other folder are not gradscope's to replace.
    // An adapters save writes over an earlier adapters save only, a weights save over an
    // earlier weights save only, so that the two never mix in one folder.
    const bool empty = fs::is_empty(p, ec);
    const bool earlier_save =
        adapters ? fs::is_regular_file(p / "adapter_config.json", ec) &&
                       fs::is_regular_file(p / "adapter_model.safetensors", ec) &&
                       !fs::exists(p / "model.safetensors", ec)
                 : fs::is_regular_file(p / "config.json", ec) &&
                       !fs::exists(p / "adapter_config.json", ec) &&
                       (fs::is_regular_file(p / "model.safetensors", ec) ||
                        fs::is_regular_file(p / "model.safetensors.index.json", ec));
    check_usage(empty || earlier_save,
                "--save-weights folder '" + dir + "' holds other files and no earlier save" +
                    (adapters ? " of adapters" : ""),
                adapters ? "name a new or empty folder (a folder with adapter_config.json and "
                           "adapter_model.safetensors is written over)"
                         : "name a new or empty folder (a folder with config.json and "
                           "model.safetensors is written over)");
    // A save replaces the folder whole: anything else in it would go with the earlier save.
    for (const auto& entry : fs::directory_iterator(p, ec))
      check_usage(saved_file(entry.path().filename().string(), adapters) &&
                      entry.is_regular_file(ec),
                  fmt::format("--save-weights folder '{}' holds {}, which is not part of an "
                              "earlier save: the save replaces the whole folder",
                              dir, entry.path().filename().string()),
                  "move it out of the folder, or name another folder");
    return;
  }
  fs::path parent = p.parent_path();
  if (parent.empty()) parent = ".";
  check_usage(fs::is_directory(parent, ec),
              "--save-weights '" + dir + "': folder '" + parent.string() + "' does not exist",
              "create the folder above it first");
  check_usage(access(parent.c_str(), W_OK) == 0,
              "--save-weights '" + dir + "': folder '" + parent.string() + "' is not writable");
}

std::vector<std::string> save_weights(const std::string& model, Model& m,
                                      const nlohmann::json& arch, const std::string& dir,
                                      const std::string& tokenizer_json) {
  check_weights_folder(dir, /*adapters=*/false);
  // Read before anything is written: a tokenizer that cannot be read leaves the earlier save.
  const std::string tokenizer =
      tokenizer_json.empty()
          ? ""
          : read_input_file(tokenizer_json, "tokenizer file", kMaxTokenizerBytes);
  const auto tensors = hf_tensors(model, m);
  const std::string config = hf_config(model, arch).dump(2) + "\n";
  return save_folder(dir, [&](const std::string& staged) {
    std::vector<std::string> written = write_safetensors_set(staged, tensors, int64_t{5} << 30);
    const std::string config_path = (fs::path(staged) / "config.json").string();
    write_file_atomically(config_path, config);
    written.push_back(config_path);
    if (!tokenizer_json.empty()) {
      const std::string copy = (fs::path(staged) / "tokenizer.json").string();
      write_file_atomically(copy, tokenizer);
      written.push_back(copy);
    }
    return written;
  });
}

std::vector<std::string> save_adapters(const std::string& model, Model& m,
                                       const LoraOptions& options, const std::string& dir,
                                       const std::string& base_model) {
  check_weights_folder(dir, /*adapters=*/true);
  std::error_code ec;
  // The base as a loader finds it: the --init-from folder's absolute path (a relative one, or
  // one shaped like "org/name", would be looked up elsewhere or on the Hub), or null when the
  // run did not start from a folder with config.json.
  std::string base;
  if (!base_model.empty() && fs::is_directory(base_model, ec) &&
      fs::is_regular_file(fs::path(base_model) / "config.json", ec))
    base = fs::canonical(base_model, ec).string();
  const AdapterExport adapters = hf_adapters(model, m, options, ec ? std::string() : base);
  return save_folder(dir, [&](const std::string& staged) -> std::vector<std::string> {
    const std::string weights = (fs::path(staged) / "adapter_model.safetensors").string();
    write_safetensors(weights, adapters.tensors);
    const std::string config = (fs::path(staged) / "adapter_config.json").string();
    write_file_atomically(config, adapters.config.dump(2) + "\n");
    return {weights, config};
  });
}

void load_init_adapters(const std::string& model, Model& m, const LoraOptions& options,
                        const std::string& dir) {
  std::error_code ec;
  check_usage(fs::is_directory(dir, ec), "--init-adapters '" + dir + "' is not a folder",
              "name a folder PEFT's save_pretrained (or --save-adapters) wrote");
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  check_usage(optional_input_file(config_path, "adapter config") &&
                  optional_input_file(weights_path, "adapter weights"),
              "--init-adapters '" + dir +
                  "' needs adapter_config.json and adapter_model.safetensors",
              "name a folder PEFT's save_pretrained (or --save-adapters) wrote");
  const nlohmann::json config = parse_json_input_unique(
      read_input_file(config_path, "adapter config", kMaxConfigBytes), config_path);
  load_hf_adapters(model, m, options, config, read_safetensors(weights_path),
                   "--init-adapters '" + dir + "'");
}

}  // namespace gradscope
