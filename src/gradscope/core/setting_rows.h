// The building blocks of the settings table (settings_table.cpp): reading a setting's text
// and its JSON with errors that name it, and rows bound to one RunConfig member. Internal to
// core/: everything else reads the table through settings.h.
#pragma once

#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/settings.h"

namespace gradscope {

// Every row, in the order --help shows them (settings_table.cpp).
std::vector<Setting> build_settings_table();

namespace setting_rows {

using json = nlohmann::json;

// ---- reading text ----

inline int64_t parse_integer(const std::string& flag, const std::string& text) {
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  check_usage(pos > 0 && pos == text.size(),
              fmt::format("cannot read {} '{}' as a whole number", flag, text),
              fmt::format("write e.g. {} 4", flag));
  return v;
}

// A whole number >= 0 of the full 64-bit range (a seed).
inline uint64_t parse_unsigned(const std::string& flag, const std::string& text) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    // stoull would read "-1" as 2^64 - 1: a sign is refused first.
    if (!text.empty() && std::isdigit(static_cast<unsigned char>(text[0])))
      v = std::stoull(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  check_usage(pos > 0 && pos == text.size(),
              fmt::format("cannot read {} '{}' as a whole number >= 0", flag, text),
              fmt::format("write e.g. {} 1", flag));
  return v;
}

inline double parse_number(const std::string& flag, const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  check_usage(pos > 0 && pos == text.size() && std::isfinite(v),
              fmt::format("cannot read {} '{}' as a number", flag, text),
              fmt::format("write e.g. {} 0.1", flag));
  return v;
}

inline bool parse_flag(const std::string& flag, const std::string& text) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  fail_usage(fmt::format("cannot read {} '{}' as true or false", flag, text),
             fmt::format("give {} alone to turn it on", flag));
}

inline std::pair<std::string, std::string> parse_pair(const std::string& flag,
                                                      const std::string& text,
                                                      const std::string& example) {
  const auto eq = text.find('=');
  check_usage(eq != std::string::npos && eq > 0 && eq + 1 < text.size(),
              fmt::format("cannot read {} setting '{}'", flag.substr(2), text),
              fmt::format("write {} NAME=VALUE, e.g. {} {}", flag, flag, example));
  return {text.substr(0, eq), text.substr(eq + 1)};
}

inline std::string number_text(double v) { return fmt::format("{}", v); }

// ---- JSON of one value, with the record key named in errors ----

[[noreturn]] inline void wrong_type(const std::string& key, const json& v, const char* expected) {
  fail_usage(fmt::format("config.{} is {}, expected {}", key, json_preview(v), expected),
             "the record's config does not follow docs/record.md");
}

inline int64_t json_integer(const std::string& key, const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18)
      return static_cast<int64_t>(d);
  }
  wrong_type(key, v, "an integer");
}

inline double json_number(const std::string& key, const json& v) {
  if (v.is_number()) return v.get<double>();
  wrong_type(key, v, "a number");
}

inline std::string json_text(const std::string& key, const json& v) {
  if (v.is_string()) return v.get<std::string>();
  wrong_type(key, v, "text");
}

inline bool json_bool(const std::string& key, const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  wrong_type(key, v, "true or false");
}

inline std::map<std::string, std::string> json_pairs(const std::string& key, const json& v) {
  if (!v.is_object()) wrong_type(key, v, "an object of NAME: VALUE text");
  std::map<std::string, std::string> out;
  for (auto it = v.begin(); it != v.end(); ++it)
    out[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
  return out;
}

// A choice as text, checked against its valid names.
template <typename Enum>
Enum parse_choice(const std::string& flag, const std::string& text,
                  std::optional<Enum> (*parse)(const std::string&),
                  const std::vector<std::string>& valid) {
  const auto v = parse(text);
  if (!v) {
    std::string list;
    for (const auto& n : valid) list += (list.empty() ? "" : ", ") + n;
    fail_usage(fmt::format("unknown {} '{}'", flag, text), "valid values: " + list);
  }
  return *v;
}

// ---- row builders ----

// A setting whose parse, text, check, write and read the caller writes itself (defaults: no
// check, no JSON).
inline Setting custom_row(std::string name, std::string key, SettingType type, SettingRole role,
                          SettingSection section, std::string help) {
  Setting s;
  s.name = std::move(name);
  s.key = std::move(key);
  s.type = type;
  s.role = role;
  s.section = section;
  s.help = std::move(help);
  s.text = [](const RunConfig&) { return std::string(); };
  s.check = [](const RunConfig&) {};
  s.write = [](const RunConfig&, json&, JsonPurpose) {};
  s.read = [](RunConfig&, const json&) {};
  return s;
}

// A setting stored in one member, written under `key` (in both purposes when it defines the
// run, in the record only when it measures). Checks default to none.
template <typename T>
Setting member_row(std::string name, std::string key, T RunConfig::*member, SettingType type,
                   SettingRole role, SettingSection section, std::string help) {
  Setting s;
  s.name = std::move(name);
  s.key = std::move(key);
  s.type = type;
  s.role = role;
  s.section = section;
  s.help = std::move(help);
  const std::string flag = s.flag();
  const std::string k = s.key;
  s.parse = [member, flag](RunConfig& c, const std::string& text) {
    if constexpr (std::is_same_v<T, std::string>) {
      c.*member = text;
    } else if constexpr (std::is_same_v<T, bool>) {
      c.*member = parse_flag(flag, text);
    } else if constexpr (std::is_same_v<T, double>) {
      c.*member = parse_number(flag, text);
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      c.*member = parse_unsigned(flag, text);
    } else if constexpr (std::is_same_v<T, int>) {
      const int64_t v = parse_integer(flag, text);
      check_usage(v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(),
                  fmt::format("{} {} is out of range", flag, v), "pass e.g. " + flag + " 2");
      c.*member = static_cast<int>(v);
    } else {
      c.*member = static_cast<T>(parse_integer(flag, text));
    }
  };
  s.text = [member](const RunConfig& c) {
    if constexpr (std::is_same_v<T, std::string>) {
      return c.*member;
    } else if constexpr (std::is_same_v<T, bool>) {
      return std::string(c.*member ? "true" : "false");
    } else if constexpr (std::is_same_v<T, double>) {
      return number_text(c.*member);
    } else {
      return std::to_string(c.*member);
    }
  };
  s.check = [](const RunConfig&) {};
  if (role != SettingRole::kOutput) {
    s.write = [member, k, role](const RunConfig& c, json& out, JsonPurpose purpose) {
      if (purpose == JsonPurpose::kIdentity && role != SettingRole::kDefines) return;
      out[k] = c.*member;
    };
    s.read = [member, k](RunConfig& c, const json& in) {
      const auto it = in.find(k);
      if (it == in.end() || it->is_null()) return;
      if constexpr (std::is_same_v<T, std::string>) {
        c.*member = json_text(k, *it);
      } else if constexpr (std::is_same_v<T, bool>) {
        c.*member = json_bool(k, *it);
      } else if constexpr (std::is_same_v<T, double>) {
        c.*member = json_number(k, *it);
      } else {
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (it->is_number_unsigned()) {
            c.*member = it->template get<uint64_t>();
            return;
          }
        }
        c.*member = static_cast<T>(json_integer(k, *it));
      }
    };
  } else {
    s.write = [](const RunConfig&, json&, JsonPurpose) {};
    s.read = [](RunConfig&, const json&) {};
  }
  return s;
}

// A check that an integer member is at least `min` (1: "must be positive").
template <typename T>
std::function<void(const RunConfig&)> at_least(T RunConfig::*member, const std::string& flag,
                                               int64_t min, const std::string& hint) {
  return [=](const RunConfig& c) {
    const int64_t v = static_cast<int64_t>(c.*member);
    check_usage(v >= min,
                min == 1 ? fmt::format("{} {} must be positive", flag, v)
                         : fmt::format("{} {} must be >= {}", flag, v, min),
                hint);
  };
}

inline std::function<void(const RunConfig&)> non_negative(double RunConfig::*member,
                                                          const std::string& flag,
                                                          const std::string& hint) {
  return [=](const RunConfig& c) {
    check_usage(std::isfinite(c.*member) && c.*member >= 0,
                fmt::format("{} {} must be >= 0", flag, c.*member), hint);
  };
}

// A setting whose value is an enumeration held in a member (optional or not).
template <typename Enum, typename Member>
Setting choice_row(std::string name, std::string key, Member RunConfig::*member,
                   SettingSection section, std::string help,
                   std::optional<Enum> (*parse)(const std::string&), const char* (*to_name)(Enum),
                   std::vector<std::string> choices) {
  Setting s;
  s.name = std::move(name);
  s.key = std::move(key);
  s.type = SettingType::kChoice;
  s.role = SettingRole::kDefines;
  s.section = section;
  s.help = std::move(help);
  s.choices = choices;
  const std::string flag = s.flag();
  const std::string k = s.key;
  s.parse = [=](RunConfig& c, const std::string& text) {
    c.*member = parse_choice<Enum>(flag, text, parse, choices);
  };
  s.text = [=](const RunConfig& c) -> std::string {
    if constexpr (std::is_same_v<Member, Enum>) {
      return to_name(c.*member);
    } else {
      return c.*member ? to_name(*(c.*member)) : "";
    }
  };
  s.check = [](const RunConfig&) {};
  s.write = [=](const RunConfig& c, json& out, JsonPurpose) {
    if constexpr (std::is_same_v<Member, Enum>) out[k] = to_name(c.*member);
  };
  s.read = [=](RunConfig& c, const json& in) {
    const auto it = in.find(k);
    if (it == in.end() || it->is_null()) return;
    const auto v = parse(json_text(k, *it));
    if (!v) wrong_type(k, *it, "one of its names");
    c.*member = *v;
  };
  return s;
}

// The rows from how a step is computed to the outputs, appended to `t` in --help's order
// (settings_table_rows.cpp).
void add_step_to_output_rows(std::vector<Setting>& t);
// The rows of the ranks a run trains on and where they meet (--nproc, --nnodes, --shard, ...),
// appended to `t` (settings_rank_rows.cpp); add_step_to_output_rows calls it.
void add_rank_rows(std::vector<Setting>& t);

}  // namespace setting_rows
}  // namespace gradscope
