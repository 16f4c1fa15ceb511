#include "gradscope/models/hf_adapters.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/models/common/lora.h"
#include "gradscope/models/hf_weights_detail.h"

namespace gradscope {
namespace {

constexpr char kPeftPrefix[] = "base_model.model.";

// A published module whose parts (one, or several stacked: ModernBERT's Wqkv) gradscope
// adapts, with its name in PEFT's files (PublishedNames::adapter_module).
struct AdaptedModule {
  const hf_weights_detail::HfTensor* tensor;  // the module's weight in the published layout
  std::string module;
  std::vector<std::pair<size_t, LoraAdapterImpl*>> parts;  // (index in tensor->parts, adapter)
  std::vector<int64_t> part_rows;                          // rows of each of tensor->parts
};

// Every published module of `layout` with an adapter on one of its parts, in layout order; a
// runtime error when an adapter of `m` has no published module.
std::vector<AdaptedModule> adapted_modules(const std::string& model, Model& m,
                                           const hf_weights_detail::Layout& layout) {
  std::map<std::string, LoraAdapterImpl*> adapters;  // by the adapted layer's weight name
  for (const auto& [name, adapter] : lora_adapters(m)) adapters[name + ".weight"] = adapter;
  const torch::OrderedDict<std::string, torch::Tensor> params = m.named_parameters();
  const PublishedNames& names = hf_weights_detail::published_names(model);
  const std::string suffix = ".weight";
  std::vector<AdaptedModule> out;
  size_t found = 0;
  for (const hf_weights_detail::HfTensor& t : layout.tensors) {
    AdaptedModule a{&t, "", {}, {}};
    for (size_t i = 0; i < t.parts.size(); ++i) {
      const torch::Tensor* weight = params.find(t.parts[i]);
      if (!weight) fail_runtime(fmt::format("{} has no parameter '{}'", model, t.parts[i]));
      a.part_rows.push_back(weight->size(0));
      const auto it = adapters.find(t.parts[i]);
      if (it != adapters.end()) a.parts.emplace_back(i, it->second);
    }
    if (a.parts.empty()) continue;
    if (t.name.size() <= suffix.size() ||
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      fail_runtime(fmt::format("{}: adapted tensor '{}' is not a weight", model, t.name));
    const std::string published = t.name.substr(0, t.name.size() - suffix.size());
    a.module = names.adapter_module ? names.adapter_module(published) : published;
    found += a.parts.size();
    out.push_back(std::move(a));
  }
  if (found != adapters.size())
    fail_runtime(fmt::format("{}: {} of {} adapters have no published module", model, found,
                             adapters.size()));
  return out;
}

// The published tensors of the heads that train beside the adapters (lora_trainable: ViT's
// classifier), in layout order.
std::vector<const hf_weights_detail::HfTensor*> head_tensors(
    Model& m, const hf_weights_detail::Layout& layout) {
  const torch::OrderedDict<std::string, torch::Tensor> params = m.named_parameters();
  std::vector<const hf_weights_detail::HfTensor*> out;
  for (const std::string& head : m.lora_trainable())
    for (const hf_weights_detail::HfTensor& t : layout.tensors) {
      if (t.parts.size() != 1 || t.parts[0].compare(0, head.size() + 1, head + ".") != 0) continue;
      if (!params.find(t.parts[0]))
        fail_runtime(fmt::format("the model has no parameter '{}'", t.parts[0]));
      out.push_back(&t);
    }
  return out;
}

}  // namespace

AdapterExport hf_adapters(const std::string& model, Model& m, const LoraOptions& options,
                          const std::string& base_model) {
  const hf_weights_detail::Layout layout = hf_weights_detail::layout_of_model(model, m);
  // Held for the whole export: find() points into this dictionary.
  const torch::OrderedDict<std::string, torch::Tensor> params = m.named_parameters();
  torch::NoGradGuard no_grad;
  AdapterExport out;
  nlohmann::json targets = nlohmann::json::array();
  nlohmann::json rank_pattern = nlohmann::json::object();
  nlohmann::json alpha_pattern = nlohmann::json::object();
  for (const AdaptedModule& am : adapted_modules(model, m, layout)) {
    torch::Tensor a, b;
    if (am.tensor->parts.size() == 1) {
      a = am.parts[0].second->A.detach();
      b = am.parts[0].second->B.detach();
    } else {
      // Rows of the stacked weight per part, in order; each adapted part's B in its rows and
      // its own block of r columns.
      const int64_t r = options.rank, k = static_cast<int64_t>(am.parts.size());
      std::vector<torch::Tensor> as;
      for (const auto& part : am.parts) as.push_back(part.second->A.detach());
      a = torch::cat(as, 0);  // (k r, in)
      b = torch::zeros({am.tensor->shape.at(0), k * r}, am.parts[0].second->B.options());
      int64_t row = 0, column = 0;
      size_t next = 0;
      for (size_t i = 0; i < am.part_rows.size(); ++i) {
        if (next < am.parts.size() && am.parts[next].first == i) {
          b.narrow(0, row, am.part_rows[i])
              .narrow(1, column, r)
              .copy_(am.parts[next].second->B.detach());
          column += r;
          ++next;
        }
        row += am.part_rows[i];
      }
      if (k > 1) {
        rank_pattern[am.module] = k * r;
        alpha_pattern[am.module] = static_cast<double>(k) * options.alpha;
      }
    }
    targets.push_back(am.module);
    out.tensors.emplace_back(kPeftPrefix + am.module + ".lora_A.weight", a);
    out.tensors.emplace_back(kPeftPrefix + am.module + ".lora_B.weight", b);
  }
  // The heads that trained beside the adapters, whole, under their published names.
  nlohmann::json to_save = nlohmann::json::array();
  for (const hf_weights_detail::HfTensor* t : head_tensors(m, layout)) {
    out.tensors.emplace_back(kPeftPrefix + t->name, params.find(t->parts[0])->detach());
    const std::string module = t->name.substr(0, t->name.rfind('.'));
    if (std::find(to_save.begin(), to_save.end(), module) == to_save.end())
      to_save.push_back(module);
  }
  const char* task_type = hf_weights_detail::published_names(model).peft_task_type;
  out.config = {{"peft_type", "LORA"},
                {"task_type", task_type ? nlohmann::json(task_type) : nlohmann::json(nullptr)},
                {"base_model_name_or_path",
                 base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model)},
                {"r", options.rank},
                {"lora_alpha", options.alpha},
                {"lora_dropout", options.dropout},
                {"target_modules", targets},
                {"rank_pattern", rank_pattern},
                {"alpha_pattern", alpha_pattern},
                {"modules_to_save", to_save.empty() ? nlohmann::json(nullptr) : to_save},
                {"bias", "none"},
                {"fan_in_fan_out", false},
                {"init_lora_weights", true},
                {"inference_mode", true}};
  return out;
}

namespace {

// A numeric key of adapter_config.json; absent or null: nullopt.
std::optional<double> config_number(const nlohmann::json& config, const std::string& key,
                                    const std::string& source) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  check_usage(it->is_number(),
              fmt::format("{}: adapter_config.json's \"{}\" is not a number", source, key));
  return it->get<double>();
}

// Keys of adapter_config.json that do not change what the adapters compute: what they are for,
// where they came from, and how they were trained or picked (the tensors decide which modules
// are adapted: targets, layers and heads missing from them or extra are refused anyway).
const std::set<std::string> kAdapterInformation = {
    "peft_type", "task_type", "base_model_name_or_path", "revision", "auto_mapping",
    "peft_version", "inference_mode", "megatron_core", "qalora_group_size", "lora_dropout",
    "target_modules", "exclude_modules", "layers_to_transform", "layers_pattern",
    "modules_to_save", "ensure_weight_tying"};
// Keys read and checked on their own.
const std::set<std::string> kAdapterChecked = {"r", "lora_alpha", "rank_pattern",
                                               "alpha_pattern"};

// Refuses a PEFT configuration that gradscope's adapters cannot be: another method, another r
// or alpha than the run's, or LoRA variants gradscope does not compute.
void check_adapter_config(const nlohmann::json& config, const LoraOptions& options,
                          const std::string& source) {
  check_usage(config.is_object(), source + ": adapter_config.json is not a JSON object");
  const auto type = config.find("peft_type");
  check_usage(type != config.end() && type->is_string() && type->get<std::string>() == "LORA",
              source + ": adapter_config.json's peft_type is not \"LORA\"",
              "--init-adapters reads LoRA adapters as PEFT saves them");
  const std::optional<double> r = config_number(config, "r", source);
  const std::optional<double> alpha = config_number(config, "lora_alpha", source);
  check_usage(r && alpha, source + ": adapter_config.json needs \"r\" and \"lora_alpha\"");
  check_usage(*r == static_cast<double>(options.rank) && *alpha == options.alpha,
              fmt::format("{}: the adapters have r {} and lora_alpha {}, the run --lora-rank {} "
                          "and --lora-alpha {}",
                          source, *r, *alpha, options.rank, options.alpha),
              fmt::format("pass --lora-rank {} --lora-alpha {}", *r, *alpha));
  for (const auto& [key, value] : config.items()) {
    if (kAdapterInformation.count(key) || kAdapterChecked.count(key)) continue;
    if (key == "bias") {
      check_usage(value.is_null() || value == "none",
                  source + ": adapter_config.json trains biases (\"bias\" is not \"none\"), "
                           "which gradscope's LoRA does not");
    } else if (key == "init_lora_weights") {
      // How PEFT drew the adapters; the values below draw from the base as it is. The others
      // (pissa, olora, corda, loftq, eva...) change the base weights the adapters belong to.
      check_usage(value.is_boolean() || value == "gaussian",
                  fmt::format("{}: adapter_config.json's init_lora_weights {} pairs the adapters "
                              "with base weights PEFT changed, which --init-from does not hold",
                              source, json_preview(value)));
    } else {
      // Every other key is a LoRA variant (DoRA, rsLoRA, aLoRA, QA-LoRA, bias adapters...) or
      // a setting gradscope does not have: accepted only when it is off.
      const bool off = value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
                       ((value.is_object() || value.is_array()) && value.empty());
      check_usage(off,
                  fmt::format("{}: adapter_config.json sets \"{}\" ({}), which changes what the "
                              "adapters compute in a way gradscope's LoRA does not",
                              source, hf_weights_detail::short_name(key), json_preview(value)),
                  "gradscope reads plain LoRA adapters");
    }
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    check_usage(it->is_object(), fmt::format("{}: \"{}\" is not an object", source, key));
    for (const auto& [name, value] : it->items()) {
      check_usage(value.is_number(), fmt::format("{}: \"{}\" of '{}' is not a number", source,
                                                 key, hf_weights_detail::short_name(name)));
      // PEFT reads a key as a regular expression matched at a name's end; gradscope reads
      // module names and dotted suffixes, which are the same expression when they hold none
      // of its special characters.
      const bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
      });
      check_usage(plain && name.front() != '.' && name.back() != '.',
                  fmt::format("{}: \"{}\" key '{}' is a pattern, not a module name", source, key,
                              hf_weights_detail::short_name(name)),
                  "gradscope reads module names and dotted suffixes of them");
    }
  }
}

// The value a rank_pattern or alpha_pattern entry gives `module`: a key equal to its name or
// to a dotted suffix of it. Keys that match no adapted module are refused by the caller.
std::optional<double> pattern_value(const nlohmann::json& config, const char* key,
                                    const std::string& module, std::set<std::string>& matched,
                                    const std::string& source) {
  const auto it = config.find(key);
  if (it == config.end() || !it->is_object()) return std::nullopt;
  std::optional<double> found;
  for (const auto& [name, value] : it->items()) {
    const bool suffix = module.size() > name.size() &&
                        module.compare(module.size() - name.size(), name.size(), name) == 0 &&
                        module[module.size() - name.size() - 1] == '.';
    if (name != module && !suffix) continue;
    matched.insert(std::string(key) + "/" + name);
    // PEFT takes the first key in the file's order; the parsed object keeps none, so two keys
    // that match one module must agree.
    check_usage(!found || *found == value.get<double>(),
                fmt::format("{}: two \"{}\" keys match {} with different values", source, key,
                            module));
    found = value.get<double>();
  }
  return found;
}

// A pending copy into an adapter or a head, made once everything is checked.
struct AdapterCopy {
  torch::Tensor into;
  torch::Tensor from;
};

// The adapters of one published module whose parts gradscope adapts (`parts`: index in t.parts,
// adapter), from the file's A (R, in) and B (out, R): the copies, or a usage error.
void plan_module(const hf_weights_detail::HfTensor& t, const std::string& module,
                 const std::vector<std::pair<size_t, LoraAdapterImpl*>>& parts,
                 const std::vector<int64_t>& part_rows, const torch::Tensor& a,
                 const torch::Tensor& b, int64_t r, const std::string& source,
                 std::vector<AdapterCopy>& copies) {
  const int64_t rank = a.size(0), k = static_cast<int64_t>(parts.size());
  const bool shared = rank == r;  // one adapter over every row: parts share A
  check_usage(shared || rank == k * r,
              fmt::format("{}: the adapter of {} has rank {}, neither r ({}) nor {} x r for the "
                          "{} parts gradscope adapts there",
                          source, module, rank, r, k, k));
  torch::Tensor covered = torch::zeros_like(b, torch::kBool);  // where B may be non-zero
  int64_t row = 0;
  size_t next = 0;
  for (size_t i = 0; i < t.parts.size(); ++i) {
    const int64_t rows = part_rows[i];
    if (next < parts.size() && parts[next].first == i) {
      LoraAdapterImpl* adapter = parts[next].second;
      const int64_t column = shared ? 0 : static_cast<int64_t>(next) * r;
      copies.push_back({adapter->A, a.narrow(0, column, r)});
      copies.push_back({adapter->B, b.narrow(0, row, rows).narrow(1, column, r)});
      covered.narrow(0, row, rows).narrow(1, column, r).fill_(true);
      ++next;
    }
    row += rows;
  }
  const bool outside = b.masked_select(covered.logical_not()).ne(0).any().item<bool>();
  check_usage(!outside,
              fmt::format("{}: the adapter of {} changes rows that gradscope's adapters there "
                          "cannot hold (the rows of a part it does not adapt, or B off the "
                          "block of its part)",
                          source, module),
              "adapt every part of the stacked module (--lora-targets q,k,v for Wqkv)");
}

}  // namespace

void load_hf_adapters(const std::string& model, Model& m, const LoraOptions& options,
                      const nlohmann::json& config,
                      const std::map<std::string, torch::Tensor>& tensors,
                      const std::string& source) {
  check_adapter_config(config, options, source);
  const hf_weights_detail::Layout layout = hf_weights_detail::layout_of_model(model, m);
  const torch::OrderedDict<std::string, torch::Tensor> params = m.named_parameters();
  auto tensor = [&](const std::string& name, const std::string& why) -> const torch::Tensor& {
    const auto it = tensors.find(name);
    check_usage(it != tensors.end(), fmt::format("{}: no tensor '{}' ({})", source, name, why));
    return it->second;
  };
  auto expect_shape = [&](const std::string& name, const torch::Tensor& t,
                          const std::vector<int64_t>& shape) {
    check_usage(t.sizes().vec() == shape,
                fmt::format("{}: tensor '{}' has shape {}, the model's needs {}", source, name,
                            fmt::join(t.sizes().vec(), "x"), fmt::join(shape, "x")));
  };
  std::set<std::string> used, matched;
  std::vector<AdapterCopy> copies;
  const double scale = options.alpha / static_cast<double>(options.rank);
  for (const AdaptedModule& am : adapted_modules(model, m, layout)) {
    const hf_weights_detail::HfTensor& t = *am.tensor;
    const std::string& module = am.module;
    const std::string why = "the adapter of " + module + ", which --lora-targets adapts";
    const std::string name_a = kPeftPrefix + module + ".lora_A.weight";
    const std::string name_b = kPeftPrefix + module + ".lora_B.weight";
    const torch::Tensor& a = tensor(name_a, why);
    const torch::Tensor& b = tensor(name_b, why);
    const int64_t rank = a.dim() == 2 ? a.size(0) : -1;
    check_usage(rank >= 1, fmt::format("{}: tensor '{}' is not a matrix", source, name_a));
    expect_shape(name_a, a, {rank, t.shape.at(1)});
    expect_shape(name_b, b, {t.shape.at(0), rank});
    const double module_rank =
        pattern_value(config, "rank_pattern", module, matched, source).value_or(options.rank);
    const double module_alpha =
        pattern_value(config, "alpha_pattern", module, matched, source).value_or(options.alpha);
    check_usage(module_rank == static_cast<double>(rank),
                fmt::format("{}: the adapter of {} has rank {}, its configuration says {}",
                            source, module, rank, module_rank));
    check_usage(std::abs(module_alpha / module_rank - scale) <= 1e-12 * scale,
                fmt::format("{}: the adapter of {} is scaled by {} / {}, the run's adapters by "
                            "alpha / r = {}",
                            source, module, module_alpha, module_rank, scale));
    plan_module(t, module, am.parts, am.part_rows, a.to(torch::kFloat), b.to(torch::kFloat),
                options.rank, source, copies);
    used.insert(name_a);
    used.insert(name_b);
  }
  for (const hf_weights_detail::HfTensor* t : head_tensors(m, layout)) {
    const std::string name = kPeftPrefix + t->name;
    const torch::Tensor& from = tensor(name, "the head that trains beside the adapters");
    expect_shape(name, from, t->shape);
    copies.push_back({*params.find(t->parts[0]), from});
    used.insert(name);
  }
  for (const auto& [name, t] : tensors)
    check_usage(used.count(name),
                fmt::format("{}: tensor '{}' is no adapter of a module --lora-targets adapts",
                            source, hf_weights_detail::short_name(name)),
                "pass the --lora-targets the adapters were trained on");
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    const auto it = config.find(key);
    if (it == config.end() || !it->is_object()) continue;
    for (const auto& [name, value] : it->items())
      check_usage(matched.count(std::string(key) + "/" + name),
                  fmt::format("{}: {} entry '{}' names no module the run adapts", source, key,
                              hf_weights_detail::short_name(name)),
                  "gradscope reads module names and dotted suffixes, not patterns");
  }
  torch::NoGradGuard no_grad;
  for (const AdapterCopy& c : copies) c.into.copy_(c.from);
}

}  // namespace gradscope
