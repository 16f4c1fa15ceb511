#include "gradscope/core/settings.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/rng.h"
#include "gradscope/core/setting_rows.h"

namespace gradscope {
namespace {

using json = nlohmann::json;

// Flattens a canonical JSON into "name" -> value text, nested objects one level down.
void flatten_into(const json& j, std::map<std::string, std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.value().is_object()) {
      for (auto sub = it.value().begin(); sub != it.value().end(); ++sub)
        out[it.key() + "." + sub.key()] = sub.value().dump();
    } else {
      out[it.key()] = it.value().dump();
    }
  }
}

}  // namespace

const char* section_title(SettingSection section) {
  switch (section) {
    case SettingSection::kModel:
      return "What is trained";
    case SettingSection::kOptimizer:
      return "How it is optimized";
    case SettingSection::kStep:
      return "How a step is computed (memory)";
    case SettingSection::kShape:
      return "Shape of the work";
    case SettingSection::kEvaluation:
      return "Evaluation";
    case SettingSection::kDevice:
      return "Where it runs";
    case SettingSection::kMeasure:
      return "How it is measured";
    case SettingSection::kOutput:
      return "Outputs";
  }
  return "?";
}

std::string Setting::toml_key() const {
  std::string k = name;
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

const std::vector<Setting>& run_settings() {
  static const std::vector<Setting> table = build_settings_table();
  return table;
}

const Setting* find_setting(const std::string& name_or_key) {
  for (const auto& s : run_settings())
    if (s.name == name_or_key || s.toml_key() == name_or_key) return &s;
  return nullptr;
}

void check_config(const RunConfig& c) {
  for (const auto& s : run_settings()) s.check(c);
  if (!c.lr_auto) {
    const RunConfig d;
    check_usage(c.lr_search_trials == d.lr_search_trials &&
                    c.lr_search_steps == d.lr_search_steps && c.lr_search_span == d.lr_search_span,
                "the --lr-search-* options only apply with --lr auto",
                "add --lr auto, or leave them out");
  }
  c.step_plan();  // the parts of the step must agree
}

json config_to_json(const RunConfig& config) {
  json out = json::object();
  for (const auto& s : run_settings()) s.write(config, out, JsonPurpose::kRecord);
  return out;
}

RunConfig config_from_json(const json& config) {
  check_usage(config.is_object(),
              "the record's config is " + json_preview(config) + ", not an object",
              "the record does not follow docs/record.md");
  RunConfig c;
  for (const auto& s : run_settings()) s.read(c, config);
  return c;
}

json canonical_config_json(const RunConfig& config) {
  json out = json::object();
  for (const auto& s : run_settings())
    if (s.role == SettingRole::kDefines) s.write(config, out, JsonPurpose::kIdentity);
  return out;
}

std::string run_id_of(const json& canonical) {
  // nlohmann::json keeps object keys sorted, so dump() is canonical.
  const std::string text = canonical.dump();
  // FNV-1a over the text, then two mixed halves: a stable 64-bit digest.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return fmt::format("{:016x}", mix64(h));
}

std::map<std::string, std::string> identity_settings(const RunConfig& config, const json& arch) {
  json canonical = canonical_config_json(config);
  canonical.erase("seed");
  // A searched rate is "auto" whatever each seed found.
  if (config.lr_auto) canonical["lr"] = "auto";
  if (arch.is_object()) canonical["arch"] = arch;
  std::map<std::string, std::string> flat;
  flatten_into(canonical, flat);
  return flat;
}

std::string grouping_key(const RunConfig& config, const json& arch) {
  std::string key;
  for (const auto& [name, value] : identity_settings(config, arch)) key += name + "=" + value + ";";
  return key;
}

SettingSection identity_section(const std::string& flattened_name) {
  const std::string top = flattened_name.substr(0, flattened_name.find('.'));
  if (top == "arch") return SettingSection::kModel;
  for (const auto& s : run_settings())
    if (s.key == top) return s.section;
  return SettingSection::kModel;
}

}  // namespace gradscope
