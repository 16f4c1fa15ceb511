// `gradscope list`: every model, preset, optimizer, strategy, data set and tokenizer.
#include <fmt/ranges.h>
#include "gradscope/cli/commands.h"

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/data/text.h"
#include "gradscope/data/tokenizer.h"
#include "gradscope/models/hf_weights.h"
#include "gradscope/models/registry.h"
#include "gradscope/optim/factory.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace {

nlohmann::json catalogue() {
  nlohmann::json j;
  for (const auto& item : model_registry().items()) {
    nlohmann::json presets = nlohmann::json::object();
    for (const auto& preset : item.entry.presets) {
      RunConfig c;
      c.model = item.name;
      c.preset = preset;
      const nlohmann::json arch = resolve_arch(c);
      presets[preset] = {{"params", item.entry.count_params(arch)}, {"arch", arch}};
    }
    j["models"][item.name] = {{"description", item.description},
                              {"kind", model_kind_name(item.entry.kind)},
                              {"preset_order", item.entry.presets},
                              {"presets", presets}};
  }
  for (const auto& item : optimizer_registry().items()) {
    nlohmann::json by_model = nlohmann::json::object();
    for (const auto& model : model_registry().names())
      by_model[model] = default_lr(item.name, model);
    j["optimizers"][item.name] = {{"description", item.description},
                                  {"default_lr", item.entry.default_lr},
                                  {"default_lr_by_model", by_model},
                                  {"settings", item.entry.keys}};
  }
  for (const auto& s : strategy_shorthands())
    j["strategies"][s.name] = {{"description", s.description}};
  for (const auto& s : step_options()) j["step_options"][s.name] = {{"description", s.description}};
  for (const auto& item : text_dataset_registry().items())
    j["datasets"][item.name] = {{"description", item.description}, {"folder", item.entry}};
  for (const auto& item : tokenizer_registry().items())
    j["tokenizers"][item.name] = {{"description", item.description},
                                  {"vocab_size", item.entry.vocab_size}};
  j["data_dir"] = data_dir();
  return j;
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_text(const nlohmann::json& j) {
  fmt::print("models (presets with parameters counted from the configuration):\n");
  for (const auto& [name, m] : j["models"].items()) {
    fmt::print("  {:<12} {}\n", name, m["description"].get<std::string>());
    for (const auto& preset : m["preset_order"]) {
      const auto& p = m["presets"][preset.get<std::string>()];
      const auto& a = p["arch"];
      if (m["kind"] == model_kind_name(ModelKind::kToy)) {
        fmt::print("    {:<6} {:>15} params  {}-dimensional{}\n", preset.get<std::string>(),
                   with_commas(p["params"].get<int64_t>()), a["dim"].get<int64_t>(),
                   a.contains("condition")
                       ? fmt::format(", condition number {:g}", a["condition"].get<double>())
                       : "");
        continue;
      }
      fmt::print("    {:<6} {:>15} params  {} layers, hidden {}, {} heads, seq {}, tokenizer {}\n",
                 preset.get<std::string>(), with_commas(p["params"].get<int64_t>()),
                 a.value("num_hidden_layers", 0), a.value("hidden_size", 0),
                 a.value("num_attention_heads", 0), a.value("seq_len", 0),
                 a.value("tokenizer", std::string("-")));
    }
  }
  fmt::print("\noptimizers (--optimizer; settings with --opt NAME=VALUE):\n");
  for (const auto& [name, o] : j["optimizers"].items()) {
    std::string settings;
    for (const auto& s : o["settings"])
      settings += (settings.empty() ? "" : ", ") + s.get<std::string>();
    std::string other_lrs;  // models whose default differs from the general one
    for (const auto& [model, lr] : o["default_lr_by_model"].items())
      if (lr.get<double>() != o["default_lr"].get<double>())
        other_lrs += fmt::format(", {} {:g}", model, lr.get<double>());
    fmt::print("  {:<12} {} (default lr {:g}{}; settings: {})\n", name,
               o["description"].get<std::string>(), o["default_lr"].get<double>(), other_lrs,
               settings.empty() ? "none" : settings);
  }
  fmt::print("\nstrategies (--strategy):\n");
  for (const auto& [name, s] : j["strategies"].items())
    fmt::print("  {:<30} {}\n", name, s["description"].get<std::string>());
  fmt::print("\nwith any strategy:\n");
  for (const auto& [name, s] : j["step_options"].items())
    fmt::print("  {:<30} {}\n", name, s["description"].get<std::string>());
  fmt::print("\ndata sets (--dataset; fetched into {}):\n", j["data_dir"].get<std::string>());
  for (const auto& [name, d] : j["datasets"].items())
    fmt::print("  {:<12} {}\n", name, d["description"].get<std::string>());
  fmt::print("\ntokenizers (--tokenizer):\n");
  for (const auto& [name, t] : j["tokenizers"].items())
    fmt::print("  {:<12} {} ({} ids)\n", name, t["description"].get<std::string>(),
               with_commas(t["vocab_size"].get<int64_t>()));
}

// The tensors a model's weights file holds (--save-weights), under the published names.
void print_tensors(const std::string& model, const std::string& preset, bool as_json) {
  RunConfig c;
  c.model = model;
  c.preset = preset;
  const nlohmann::json arch = resolve_arch(c);
  const auto shapes = hf_tensor_shapes(model, arch);
  int64_t numel = 0;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    numel += n;
    list.push_back({{"name", name}, {"shape", shape}});
  }
  if (as_json) {
    fmt::print("{}\n", nlohmann::json({{"model", model},
                                       {"preset", preset},
                                       {"tensors", list},
                                       {"count", shapes.size()},
                                       {"elements", numel}})
                           .dump(2));
    return;
  }
  for (const auto& [name, shape] : shapes)
    fmt::print("{:<64} ({})\n", terminal_text(name), fmt::join(shape, ", "));
  fmt::print("{} tensors, {} elements ({} {})\n", shapes.size(), with_commas(numel), model, preset);
}

}  // namespace

void add_list_command(CLI::App& root, int& exit_code) {
  auto as_json = std::make_shared<bool>(false);
  auto tensors = std::make_shared<std::string>();
  auto preset = std::make_shared<std::string>("paper");
  CLI::App* cmd = root.add_subcommand(
      "list",
      "List every model (with presets and parameter counts), optimizer, strategy, data "
      "set and tokenizer.\n"
      "With --tensors MODEL: the tensors its weights file holds under the published names\n"
      "(what --save-weights writes and --init-from reads; docs/weights.md), at --preset.");
  cmd->add_flag("--json", *as_json, "Print the catalogue as JSON");
  cmd->add_option("--tensors", *tensors,
                  "List the names and shapes of this model's weights (llama, modernbert, vit, "
                  "nanovlm)");
  cmd->add_option("--preset", *preset, "With --tensors: the preset (default paper)");
  cmd->callback([cmd, as_json, tensors, preset, &exit_code] {
    check_usage(!tensors->empty() || cmd->count("--preset") == 0,
                "--preset is for --tensors: the catalogue lists every preset",
                "add --tensors MODEL, or leave --preset out");
    if (!tensors->empty()) {
      print_tensors(*tensors, *preset, *as_json);
      exit_code = 0;
      return;
    }
    const nlohmann::json j = catalogue();
    if (*as_json)
      fmt::print("{}\n", j.dump(2));
    else
      print_text(j);
    exit_code = 0;
  });
}

}  // namespace gradscope
