#include "gradscope/sweep/grid.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string_view>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/plain_text.h"
#include "gradscope/core/settings.h"
#include "gradscope/sweep/grid_detail.h"

namespace gradscope {
namespace {

using grid_detail::describe;
using grid_detail::expect_array_of_tables;
using grid_detail::expect_table;
using grid_detail::parse_toml;
using grid_detail::region_of;
using grid_detail::scalar_text;
using grid_detail::where;

// A grid beyond this is a typo (an axis of 1000 seeds) rather than a plan, and expanding it
// would take the memory and time of a crash before any run starts.
constexpr int64_t kMaxRuns = 100000;

// What a run key's value must be, checked at load time so a typo fails with file and line.
enum class ValueKind {
  kText,
  kInteger,
  kNumber,  // integer or float
  kLr,      // a number or "auto"
  kBytes,   // a positive integer, or text such as "512MiB"
  kFlag,    // a boolean: the flag is given when true
};

struct RunKey {
  std::string name;
  ValueKind kind;
  bool defines_run;  // in the run id; the others say how a run is measured
};

// The run settings (core/settings.h) with '-' as '_', less the output ones (--db, --json,
// --quiet, --memory-snapshot, --sweep): a sweep decides those per run itself. opt and arch
// are tables, not scalar keys.
const std::vector<RunKey>& run_key_table() {
  static const std::vector<RunKey> keys = [] {
    std::vector<RunKey> out;
    for (const Setting& s : run_settings()) {
      if (s.role == SettingRole::kOutput || s.type == SettingType::kPairs) continue;
      ValueKind kind = ValueKind::kText;
      switch (s.type) {
        case SettingType::kInteger:
          kind = ValueKind::kInteger;
          break;
        case SettingType::kNumber:
          kind = ValueKind::kNumber;
          break;
        case SettingType::kLr:
          kind = ValueKind::kLr;
          break;
        case SettingType::kBytes:
          kind = ValueKind::kBytes;
          break;
        case SettingType::kFlag:
          kind = ValueKind::kFlag;
          break;
        default:
          break;
      }
      out.push_back({s.toml_key(), kind, s.role == SettingRole::kDefines});
    }
    return out;
  }();
  return keys;
}

const RunKey* find_run_key(std::string_view name) {
  for (const auto& key : run_key_table())
    if (name == key.name) return &key;
  return nullptr;
}

bool is_table_key(std::string_view name) {
  const Setting* s = find_setting(std::string(name));
  return s != nullptr && s->type == SettingType::kPairs;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string run_keys_hint(bool with_tables) {
  return "valid keys: " + joined(run_keys()) + (with_tables ? ", and the tables opt and arch" : "");
}

// Axis priority: the four study dimensions first (in the order a reader scans a results
// table), seed last so that repeats of one configuration sit next to each other.
int priority(const std::string& key) {
  static const std::vector<std::string> first = {"model", "preset", "optimizer", "strategy"};
  auto it = std::find(first.begin(), first.end(), key);
  if (it != first.end()) return static_cast<int>(it - first.begin());
  return key == "seed" ? 5 : 4;
}

bool before_in_priority(const std::string& a, const std::string& b) {
  const int pa = priority(a), pb = priority(b);
  return pa != pb ? pa < pb : a < b;
}

// The text of a run key's value, after checking it has the kind the key takes.
std::string run_value_text(const std::string& file, const RunKey& key, const std::string& what,
                           const toml::node& node, const std::string& array_hint) {
  const std::string at = where(file, node.source());
  auto wrong = [&](const char* expected, const char* example) {
    fail_usage(fmt::format("{}: {} must be {}, not {}", at, what, expected, describe(node)),
               fmt::format("write e.g. {} = {}", key.name, example));
  };
  if (node.is_array() || node.is_table()) return scalar_text(file, what, node, array_hint);
  switch (key.kind) {
    case ValueKind::kText:
      if (!node.is_string()) wrong("text", "\"name\"");
      break;
    case ValueKind::kInteger:
      if (!node.is_integer()) wrong("an integer", "4");
      break;
    case ValueKind::kNumber:
      if (!node.is_number()) wrong("a number", "0.1");
      break;
    case ValueKind::kLr:
      if (!node.is_number() && !(node.is_string() && node.as_string()->get() == "auto"))
        wrong("a number or \"auto\"", "3e-4");
      break;
    case ValueKind::kFlag:
      if (!node.is_boolean()) wrong("true or false", "true");
      break;
    case ValueKind::kBytes:
      if (node.is_integer()) {
        check_usage(node.as_integer()->get() > 0,
                    fmt::format("{}: {} must be a positive byte count, not {}", at, what,
                                node.as_integer()->get()),
                    "write e.g. memory_cap = \"8GiB\"");
      } else if (node.is_string()) {
        try {
          parse_bytes(std::string(node.as_string()->get()));
        } catch (const Error& e) {
          fail_usage(fmt::format("{}: {}: {}", at, what, e.what()), e.hint());
        }
      } else {
        wrong("a byte size", "\"8GiB\"");
      }
      break;
  }
  return scalar_text(file, what, node, array_hint);
}

// NAME = VALUE entries of an opt or arch table (free names, scalar values).
void read_name_table(const std::string& file, const std::string& table_name,
                     const std::string& section, const toml::node& node,
                     std::map<std::string, std::string>& into) {
  const std::string what = fmt::format("'{}' in {}", table_name, section);
  const auto& table =
      expect_table(file, what, node,
                   fmt::format("write {0} = {{ NAME = VALUE, ... }}: each entry becomes --{0} "
                               "NAME=VALUE",
                               table_name));
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    into[name] = scalar_text(file, fmt::format("'{}' in {}", name, what), value,
                             "write a list as text, e.g. betas = \"0.9,0.999\"");
  }
}

// Run keys plus the opt and arch tables, as in [fixed], an override's `set` and a run
// configuration file. `section` names the place in messages.
void read_run_table(const std::string& file, const toml::table& table, const std::string& section,
                    const std::string& array_hint, RunSpec& into) {
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    if (is_table_key(name)) {
      auto& target = name == "opt" ? into.opt : into.arch;
      read_name_table(file, name, section, value, target);
      continue;
    }
    const RunKey* run_key = find_run_key(name);
    if (!run_key) {
      std::string hint = run_keys_hint(true);
      if (name == "db") hint = "the database is a sweep setting: put db under [sweep]; " + hint;
      fail_usage(fmt::format("{}: unknown key '{}' in {}", where(file, region_of(key, value)), name,
                             section),
                 hint);
    }
    into.values[name] =
        run_value_text(file, *run_key, fmt::format("'{}' in {}", name, section), value, array_hint);
  }
}

// One `when` or [[exclude]] entry: every key must match one of its values.
struct Condition {
  std::string key;
  std::vector<std::string> any_of;
  std::string at;  // "FILE:LINE" of the key
};
using Match = std::vector<Condition>;

bool matches(const Match& match, const std::map<std::string, std::string>& values) {
  for (const auto& c : match) {
    auto it = values.find(c.key);
    if (it == values.end()) return false;
    if (std::find(c.any_of.begin(), c.any_of.end(), it->second) == c.any_of.end()) return false;
  }
  return true;
}

Match read_match(const std::string& file, const toml::table& table, const std::string& section) {
  Match match;
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    const std::string at = where(file, region_of(key, value));
    const RunKey* run_key = find_run_key(name);
    if (!run_key) {
      fail_usage(fmt::format("{}: unknown key '{}' in {}", at, name, section),
                 is_table_key(name)
                     ? "opt and arch entries cannot be matched; " + run_keys_hint(false)
                     : run_keys_hint(false));
    }
    const std::string what = fmt::format("'{}' in {}", name, section);
    Condition c{name, {}, at};
    if (const auto* array = value.as_array()) {
      check_usage(!array->empty(), fmt::format("{}: {} is an empty array", at, what),
                  "list the values to match, e.g. optimizer = [\"sgd\", \"adam\"]");
      for (const auto& item : *array)
        c.any_of.push_back(
            run_value_text(file, *run_key, what, item, "list single values; arrays do not nest"));
    } else {
      c.any_of.push_back(run_value_text(file, *run_key, what, value, ""));
    }
    match.push_back(std::move(c));
  }
  return match;
}

// A `when`/exclude key that no run has can never match: almost surely a mistake.
void check_match_keys(const Match& match, const std::set<std::string>& known,
                      const std::string& section, const std::string& known_where) {
  for (const auto& c : match)
    check_usage(known.count(c.key) > 0,
                fmt::format("{}: '{}' in {} never matches: no run sets it", c.at, c.key, section),
                fmt::format("match keys that {} set, or add '{}' there", known_where, c.key));
}

struct Axis {
  std::string key;
  std::vector<std::string> values;
  std::string at;
};

struct Override {
  Match when;
  RunSpec set;
};

std::vector<Axis> read_axes(const std::string& file, const toml::node& node) {
  std::vector<Axis> axes;
  const auto& table =
      expect_table(file, "[axes]", node, "write [axes] followed by KEY = [VALUE, ...] lines");
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    const std::string at = where(file, region_of(key, value));
    const RunKey* run_key = find_run_key(name);
    if (!run_key)
      fail_usage(fmt::format("{}: unknown key '{}' in [axes]", at, name),
                 is_table_key(name) ? "opt and arch cannot be axes: set their entries in [fixed] "
                                      "or in an override's set; " +
                                          run_keys_hint(false)
                                    : run_keys_hint(false));
    // Values of a setting outside the run id would all be one run id: the sweep would run
    // it once per value, the database would hold them as attempts of one run, and the
    // report would keep one of them.
    check_usage(run_key->defines_run,
                fmt::format("{}: '{}' cannot be an axis: it says how a run is measured, not "
                            "which run it is, so every value would be the same run id",
                            at, name),
                "set it in [fixed] for every run, or run one sweep per value, each with its "
                "own --db");
    const std::string what = fmt::format("axis '{}'", name);
    const auto* array = value.as_array();
    check_usage(array && !array->empty(),
                fmt::format("{}: {} must be a non-empty array, not {}", where(file, value.source()),
                            what, array ? "an empty array" : describe(value)),
                fmt::format("write e.g. {} = [A, B]; a value for every run goes in [fixed]", name));
    // The cap first: an axis longer than it makes the grid too large whatever else it holds,
    // and its values need not be read.
    check_usage(static_cast<int64_t>(array->size()) <= kMaxRuns,
                fmt::format("{}: {} has {} values, so the grid has at least {} runs, more than the "
                            "cap of {}",
                            at, what, array->size(), array->size(), kMaxRuns),
                "split the sweep into several files, or shorten the axis");
    Axis axis{name, {}, at};
    std::set<std::string> seen;  // each value once: a lookup per value, not a scan
    for (const auto& item : *array) {
      std::string text = run_value_text(file, *run_key, "each value of " + what, item,
                                        "list single values; arrays do not nest");
      check_usage(seen.insert(text).second,
                  fmt::format("{}: {} lists '{}' twice", where(file, item.source()), what, text),
                  "list each value once; repeat runs with a seed axis");
      axis.values.push_back(std::move(text));
    }
    axes.push_back(std::move(axis));
  }
  std::sort(axes.begin(), axes.end(),
            [](const Axis& a, const Axis& b) { return before_in_priority(a.key, b.key); });
  return axes;
}

// The top-level keys of a sweep file; a run key there was meant for [fixed] or [axes].
void check_top_level_keys(const std::string& path, const toml::table& root) {
  const std::string top_valid =
      "valid top-level keys: name, [sweep], [slurm], [fixed], [axes], [[override]], "
      "[[exclude]]";
  for (const auto& [key, value] : root) {
    const std::string name(key.str());
    if (name == "name" || name == "sweep" || name == "slurm" || name == "fixed" || name == "axes" ||
        name == "override" || name == "exclude")
      continue;
    fail_usage(
        fmt::format("{}: unknown top-level key '{}'", where(path, region_of(key, value)), name),
        find_run_key(name) || is_table_key(name)
            ? "run keys go under [fixed] (every run) or [axes] (varied); " + top_valid
            : top_valid);
  }
}

// The sweep's `name`, which goes into file names, a Slurm job name and the database: a plain
// name.
std::string read_sweep_name(const std::string& path, const toml::node& node) {
  check_usage(node.is_string() && !node.as_string()->get().empty(),
              fmt::format("{}: 'name' must be non-empty text, not {}", where(path, node.source()),
                          describe(node)),
              "write e.g. name = \"smoke\", or leave it out for the file's stem");
  std::string name(node.as_string()->get());
  check_usage(is_plain_name(name, 64),
              fmt::format("{}: 'name' must be at most 64 letters, digits, '.', '_' or '-'",
                          where(path, node.source())),
              "write e.g. name = \"study-tiny\"");
  return name;
}

// [fixed]: what every run gets, and where each key stands (for the message when an axis
// repeats one).
struct FixedRunKeys {
  RunSpec spec;
  std::map<std::string, std::string> at;  // key -> "FILE:LINE"
};

FixedRunKeys read_fixed(const std::string& path, const toml::node* node) {
  FixedRunKeys fixed;
  if (!node) return fixed;
  const auto& table = expect_table(path, "[fixed]", *node, "write [fixed] then KEY = VALUE");
  read_run_table(path, table, "[fixed]", "to vary it, move it to [axes]", fixed.spec);
  for (const auto& [key, value] : table)
    fixed.at[std::string(key.str())] = where(path, region_of(key, value));
  return fixed;
}

// The grid's size before anything is done per run. Each axis is within the cap (read_axes),
// so the product is counted in a double, which holds any count of these axes exactly enough
// to be named.
int64_t grid_run_count(const std::string& path, const std::vector<Axis>& axes) {
  double grid_runs = 1;
  for (const auto& axis : axes) grid_runs *= static_cast<double>(axis.values.size());
  check_usage(grid_runs <= static_cast<double>(kMaxRuns),
              fmt::format("{}: the grid has {:.0f} runs, more than the cap of {}", path, grid_runs,
                          kMaxRuns),
              "split the sweep into several files, or shorten an axis");
  return static_cast<int64_t>(grid_runs);
}

// The `index`th [[override]] entry (from 0): its `when`, checked against the keys of
// [fixed] and [axes] (`grid_keys`), and its `set`.
Override read_override(const std::string& path, const toml::table& entry, size_t index,
                       const std::set<std::string>& grid_keys) {
  const std::string section = fmt::format("override {}", index + 1);
  const std::string at = where(path, entry.source());
  Override ov;
  for (const auto& [key, value] : entry) {
    const std::string name(key.str());
    if (name == "when") {
      const std::string what = section + "'s when";
      ov.when = read_match(
          path, expect_table(path, what, value, "write when = { KEY = VALUE, ... }"), what);
      check_usage(!ov.when.empty(), fmt::format("{}: {} is empty", at, what),
                  "match at least one key, or put the settings in [fixed]");
      check_match_keys(ov.when, grid_keys, what, "[fixed] or [axes]");
    } else if (name == "set") {
      const std::string what = section + "'s set";
      read_run_table(path, expect_table(path, what, value, "write set = { KEY = VALUE, ... }"),
                     what, "an override sets one value; write one override per value", ov.set);
      check_usage(!ov.set.values.empty() || !ov.set.opt.empty() || !ov.set.arch.empty(),
                  fmt::format("{}: {} is empty", at, what),
                  "set at least one key, or remove the override");
    } else {
      fail_usage(fmt::format("{}: unknown key '{}' in {}", where(path, region_of(key, value)),
                             name, section),
                 "an [[override]] has exactly two keys: when (what to match) and set (what "
                 "to set)");
    }
  }
  check_usage(entry.contains("when"), fmt::format("{}: {} has no 'when'", at, section),
              "add when = { KEY = VALUE }; settings for every run go in [fixed]");
  check_usage(entry.contains("set"), fmt::format("{}: {} has no 'set'", at, section),
              "add set = { KEY = VALUE }");
  return ov;
}

// The [[exclude]] entries, each checked against the keys a run can have after the overrides.
std::vector<Match> read_excludes(const std::string& path, const toml::node& node,
                                 const std::set<std::string>& final_keys) {
  std::vector<Match> excludes;
  const auto& entries = expect_array_of_tables(path, "exclude", node);
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& entry = *entries[i].as_table();
    const std::string section = fmt::format("exclude {}", i + 1);
    Match match = read_match(path, entry, section);
    check_usage(!match.empty(),
                fmt::format("{}: {} is empty, so it would drop every run",
                            where(path, entry.source()), section),
                "give the keys a dropped run matches, e.g. model = \"llama\"");
    check_match_keys(match, final_keys, section, "[fixed], [axes] or an override's set");
    excludes.push_back(std::move(match));
  }
  return excludes;
}

// The grid's `total` runs in expansion order, each with the overrides its [fixed] and [axes]
// values match applied, into sweep.runs; those an exclude matches are only counted.
void expand_grid(const RunSpec& fixed, const std::vector<Axis>& axes,
                 const std::vector<Override>& overrides, const std::vector<Match>& excludes,
                 int64_t total, Sweep& sweep) {
  std::vector<size_t> index(axes.size(), 0);
  for (int64_t n = 0; n < total; ++n) {
    RunSpec run = fixed;
    for (size_t a = 0; a < axes.size(); ++a) run.values[axes[a].key] = axes[a].values[index[a]];
    const std::map<std::string, std::string> grid_values = run.values;
    for (const auto& ov : overrides) {
      if (!matches(ov.when, grid_values)) continue;
      for (const auto& [key, value] : ov.set.values) run.values[key] = value;
      for (const auto& [key, value] : ov.set.opt) run.opt[key] = value;
      for (const auto& [key, value] : ov.set.arch) run.arch[key] = value;
    }
    const bool dropped = std::any_of(excludes.begin(), excludes.end(),
                                     [&](const Match& m) { return matches(m, run.values); });
    if (dropped)
      ++sweep.excluded;
    else
      sweep.runs.push_back(std::move(run));
    // Odometer: the last axis turns fastest.
    for (size_t a = axes.size(); a-- > 0;) {
      if (++index[a] < axes[a].values.size()) break;
      index[a] = 0;
    }
  }
}

}  // namespace

bool grid_detail::is_run_key_or_table(std::string_view name) {
  return find_run_key(name) != nullptr || is_table_key(name);
}

const std::vector<std::string>& run_keys() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& key : run_key_table()) out.push_back(key.name);
    return out;
  }();
  return names;
}

std::vector<std::string> RunSpec::args() const {
  std::vector<std::string> keys;
  for (const auto& [key, value] : values) keys.push_back(key);
  std::stable_sort(keys.begin(), keys.end(), before_in_priority);
  std::vector<std::string> out;
  for (const auto& key : keys) {
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const Setting* setting = find_setting(key);
    if (setting != nullptr && setting->type == SettingType::kFlag) {
      // A flag takes no value: given when true, left out when false.
      if (values.at(key) == "true") out.push_back(flag);
      continue;
    }
    out.push_back(flag);
    out.push_back(values.at(key));
  }
  for (const auto& [name, value] : opt) {
    out.push_back("--opt");
    out.push_back(name + "=" + value);
  }
  for (const auto& [name, value] : arch) {
    out.push_back("--arch");
    out.push_back(name + "=" + value);
  }
  return out;
}

std::string RunSpec::label(const std::vector<std::string>& axes) const {
  std::vector<std::string> keys = axes;
  if (keys.empty()) keys = {"model", "preset", "optimizer", "strategy"};
  std::stable_sort(keys.begin(), keys.end(), before_in_priority);
  std::string out;
  for (const auto& key : keys) {
    auto it = values.find(key);
    if (it == values.end()) continue;
    if (!out.empty()) out += ' ';
    out += priority(key) < 4 ? it->second : key + "=" + it->second;
  }
  return out;
}

Sweep load_sweep(const std::string& path) {
  const toml::table root = parse_toml(path, "sweep file");
  check_top_level_keys(path, root);
  Sweep sweep;
  sweep.path = path;
  sweep.name = plain_name_from(std::filesystem::path(path).stem().string(), 64);
  if (const auto* node = root.get("name")) sweep.name = read_sweep_name(path, *node);
  if (const auto* node = root.get("sweep"))
    sweep.settings = grid_detail::read_sweep_settings(path, *node);
  if (const auto* node = root.get("slurm"))
    sweep.slurm = grid_detail::read_slurm_settings(path, *node);

  const FixedRunKeys fixed = read_fixed(path, root.get("fixed"));
  std::vector<Axis> axes;
  if (const auto* node = root.get("axes")) axes = read_axes(path, *node);
  for (const auto& axis : axes) {
    auto it = fixed.at.find(axis.key);
    check_usage(it == fixed.at.end(),
                fmt::format("{}: '{}' is both in [fixed] ({}) and in [axes]", axis.at, axis.key,
                            it == fixed.at.end() ? "" : it->second),
                "keep it in one place: [fixed] for every run, [axes] to vary it");
    sweep.axes.push_back(axis.key);
  }
  const int64_t total = grid_run_count(path, axes);

  // Keys a run can have, for the never-matches checks: an override's `when` sees [fixed] and
  // [axes]; an exclude also sees what the overrides set.
  std::set<std::string> grid_keys;
  for (const auto& [key, value] : fixed.spec.values) grid_keys.insert(key);
  for (const auto& axis : axes) grid_keys.insert(axis.key);
  std::set<std::string> final_keys = grid_keys;

  std::vector<Override> overrides;
  if (const auto* node = root.get("override")) {
    const auto& entries = expect_array_of_tables(path, "override", *node);
    for (size_t i = 0; i < entries.size(); ++i) {
      Override ov = read_override(path, *entries[i].as_table(), i, grid_keys);
      for (const auto& [key, value] : ov.set.values) final_keys.insert(key);
      overrides.push_back(std::move(ov));
    }
  }
  std::vector<Match> excludes;
  if (const auto* node = root.get("exclude")) excludes = read_excludes(path, *node, final_keys);

  expand_grid(fixed.spec, axes, overrides, excludes, total, sweep);
  check_usage(!sweep.runs.empty(),
              fmt::format("{}: the grid is empty: [[exclude]] drops all {} of its runs", path,
                          sweep.excluded),
              "remove or narrow an [[exclude]] entry");
  return sweep;
}

RunSpec load_run_config(const std::string& path) {
  const toml::table root = parse_toml(path, "run configuration");
  RunSpec spec;
  for (const auto& [key, value] : root) {
    const std::string name(key.str());
    if (name == "name" || name == "sweep" || name == "slurm" || name == "fixed" || name == "axes" ||
        name == "override" || name == "exclude")
      fail_usage(fmt::format("{}: '{}' belongs in a sweep file, not a run configuration",
                             where(path, region_of(key, value)), name),
                 "run a sweep file with `gradscope sweep FILE`; a run configuration has run keys "
                 "at the top level and optional [opt] and [arch] tables");
  }
  read_run_table(path, root, "the run configuration",
                 "one configuration per file; use gradscope sweep for a grid", spec);
  return spec;
}

}  // namespace gradscope
