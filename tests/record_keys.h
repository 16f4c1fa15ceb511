// The keys of a run record's JSON as dotted paths ("memory.breakdown.logits", "steps[].loss"),
// and the keys docs/record.md lists, for the tests that hold the record's mappings to one
// another.
#pragma once

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace gradscope::testing {

// Objects whose keys are not the record's own: the architecture's, the optimizer's settings,
// the data source's and the estimate's (docs/record.md describes them in prose).
inline bool opaque_record_path(const std::string& path) {
  static const std::set<std::string> kOpaque = {"config.arch", "config.opt",
                                                "config.arch_overrides", "config.lr_search",
                                                "data", "estimate"};
  return kOpaque.count(path) > 0;
}

// Every key path of `j`, each once, in order of appearance; an array of objects contributes
// the keys of all its elements ("steps[].energy_j" when any step has one). With `nulls`, the
// paths whose value is null somewhere.
inline void collect_key_paths(const nlohmann::json& j, const std::string& prefix,
                              std::vector<std::string>& out, std::vector<std::string>* nulls) {
  if (j.is_array()) {
    for (const auto& e : j)
      if (e.is_object()) collect_key_paths(e, prefix + "[]", out, nulls);
    return;
  }
  if (!j.is_object() || opaque_record_path(prefix)) return;
  for (const auto& [key, value] : j.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (std::find(out.begin(), out.end(), path) == out.end()) out.push_back(path);
    if (nulls && value.is_null()) nulls->push_back(path);
    collect_key_paths(value, path, out, nulls);
  }
}

inline std::vector<std::string> key_paths(const nlohmann::json& j,
                                          std::vector<std::string>* nulls = nullptr) {
  std::vector<std::string> out;
  collect_key_paths(j, "", out, nulls);
  return out;
}

// The key paths of `expected` that `actual` lacks.
inline std::vector<std::string> missing_keys(const nlohmann::json& expected,
                                             const nlohmann::json& actual) {
  const std::vector<std::string> have = key_paths(actual);
  std::vector<std::string> out;
  for (const std::string& path : key_paths(expected))
    if (std::find(have.begin(), have.end(), path) == have.end()) out.push_back(path);
  return out;
}

// A key path without its array marks: docs/record.md writes "steps[]" and "steps" alike.
inline std::string plain_path(std::string path) {
  for (size_t at; (at = path.find("[]")) != std::string::npos;) path.erase(at, 2);
  return path;
}

// A dotted key path ("memory.peak_bytes") as a JSON pointer's path ("memory/peak_bytes").
inline std::string pointer_path(std::string path) {
  std::replace(path.begin(), path.end(), '.', '/');
  return path;
}

// The backticked words of a piece of markdown, in order.
inline std::vector<std::string> backticked(const std::string& text) {
  std::vector<std::string> out;
  for (size_t open = text.find('`'); open != std::string::npos;) {
    const size_t close = text.find('`', open + 1);
    if (close == std::string::npos) break;
    out.push_back(text.substr(open + 1, close - open - 1));
    open = text.find('`', close + 1);
  }
  return out;
}

// The keys docs/record.md lists, as plain paths. A section whose heading names an object
// ("## `memory`", "### `distributed.ranks[]`"; "## Top level" for the record itself) lists
// that object's keys in the first cell of its table rows; a row that names one key and whose
// text holds a backticked "{a, b, c}" lists that key's own keys too.
inline std::set<std::string> documented_record_keys() {
  std::istringstream doc(slurp(fixture("../../docs/record.md")));
  std::set<std::string> keys;
  bool in_fields = false;
  std::string prefix;
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("#", 0) == 0) {
      const std::vector<std::string> named = backticked(line);
      in_fields = line == "## Top level" || named.size() == 1;
      prefix = named.size() == 1 ? plain_path(named[0]) + "." : "";
      continue;
    }
    if (!in_fields || line.rfind("| `", 0) != 0) continue;
    const size_t cell_end = line.find(" |", 2);
    const std::vector<std::string> names = backticked(line.substr(0, cell_end));
    for (const std::string& name : names) keys.insert(prefix + name);
    if (names.size() != 1 || opaque_record_path(prefix + names[0])) continue;
    for (const std::string& word : backticked(line.substr(cell_end))) {
      if (word.size() < 2 || word.front() != '{' || word.back() != '}') continue;
      std::istringstream list(word.substr(1, word.size() - 2));
      for (std::string sub; std::getline(list, sub, ',');) {
        sub.erase(0, sub.find_first_not_of(' '));
        keys.insert(prefix + names[0] + "." + sub);
      }
    }
  }
  return keys;
}

}  // namespace gradscope::testing
