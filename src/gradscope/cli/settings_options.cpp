#include "gradscope/cli/settings_options.h"

#include <algorithm>

#include "gradscope/core/settings.h"

namespace gradscope {
namespace {

// What --help shows a setting's value as.
const char* type_name(SettingType type) {
  switch (type) {
    case SettingType::kInteger:
      return "INT";
    case SettingType::kNumber:
      return "NUMBER";
    case SettingType::kLr:
      return "NUMBER|auto";
    case SettingType::kBytes:
      return "SIZE";
    case SettingType::kChoice:
      return "NAME";
    case SettingType::kPairs:
      return "NAME=VALUE";
    default:
      return "TEXT";
  }
}

}  // namespace

void SettingOptions::add_to(CLI::App* cmd, const RunConfig& defaults,
                            const std::vector<std::string>& names) {
  for (const Setting& s : run_settings()) {
    if (!names.empty() && std::find(names.begin(), names.end(), s.name) == names.end()) continue;
    const std::string group = section_title(s.section);
    if (s.type == SettingType::kFlag) {
      cmd->add_flag(s.flag(), flags_[s.name], s.help)->group(group);
      continue;
    }
    std::string help = s.help;
    if (s.type == SettingType::kChoice) {
      std::string list;
      for (const auto& c : s.choices) list += (list.empty() ? "" : "|") + c;
      help += " [" + list + "]";
    }
    // One value per occurrence; a repeated flag takes its last value (pairs: all of them).
    CLI::Option* option = cmd->add_option(s.flag(), values_[s.name], help)
                              ->group(group)
                              ->expected(1)
                              ->type_name(type_name(s.type));
    if (s.type == SettingType::kPairs) {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    } else {
      // So a script can append overrides.
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      const std::string shown = s.text(defaults);
      if (!shown.empty()) option->default_str(shown);
    }
  }
}

void SettingOptions::apply(RunConfig& config) const {
  for (const Setting& s : run_settings()) {
    if (s.type == SettingType::kFlag) {
      const auto it = flags_.find(s.name);
      if (it != flags_.end() && it->second > 0) s.parse(config, "true");
      continue;
    }
    const auto it = values_.find(s.name);
    if (it == values_.end()) continue;
    for (const std::string& value : it->second) s.parse(config, value);
  }
}

bool SettingOptions::given(const std::string& name) const {
  const auto v = values_.find(name);
  if (v != values_.end() && !v->second.empty()) return true;
  const auto f = flags_.find(name);
  return f != flags_.end() && f->second > 0;
}

}  // namespace gradscope
