// The settings table: every setting of a run, defined once. A row names the setting (its flag
// `--name`, its TOML key `name` with '-' as '_'), its record key, type, help text, check and
// role; the default is RunConfig's member initializer. Everything that reads or writes run
// settings goes through the table:
//   - `gradscope run`'s options (cli/run.cpp), grouped by section in --help;
//   - a sweep's and a run configuration's TOML keys and their type checks (sweep/grid.cpp);
//   - the run record's "config" object, written and read back (core/record.h);
//   - the run id: the canonical JSON of the settings whose role is kDefines;
//   - the report's grouping key: the same settings but the seed, so runs that differ only in
//     seed (or in how they were measured, or where they were written) are one configuration.
// Adding a setting is one row here plus its use; see docs/architecture.md.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"

namespace gradscope {

enum class SettingRole {
  kDefines,   // what the run is: in the run id and the report's grouping key
  kMeasures,  // how it is run and measured (threads, limits, the sampler): in the record
  kOutput,    // where results go: neither in the id nor in the record
};

// What a setting's value is, which decides how TOML values are checked and how a value
// becomes command-line text.
enum class SettingType {
  kText,     // free text (a name, a path)
  kChoice,   // one of `choices`
  kInteger,  // a whole number
  kNumber,   // a number
  kLr,       // a number, or "auto"
  kBytes,    // a byte count: 1000000, 512MiB, 8GiB
  kFlag,     // on when given (--quiet); a TOML boolean
  kPairs,    // repeatable NAME=VALUE (--opt, --arch); a TOML table
};

// Where a setting stands in --help and the docs, in this order.
enum class SettingSection {
  kModel,       // what is trained
  kOptimizer,   // how it is optimized
  kStep,        // how a step is computed (memory)
  kShape,       // shape of the work
  kEvaluation,  // evaluation
  kDevice,      // where it runs
  kMeasure,     // how it is measured
  kOutput,      // outputs
};
const char* section_title(SettingSection section);

// What a setting's JSON is written for.
enum class JsonPurpose {
  kRecord,    // the run record's "config"
  kIdentity,  // the canonical JSON behind the run id
};

struct Setting {
  std::string name;  // the flag without "--" ("accum-steps"); the TOML key is toml_key()
  std::string key;   // the record's config key ("accum_steps"), "" when not recorded
  SettingType type;
  SettingRole role;
  SettingSection section;
  std::string help;
  std::vector<std::string> choices;  // kChoice: the valid values, in help order
  // Sets the value from text (a flag's value, a TOML value as command-line text; for a flag
  // "true"/"false"; for pairs one NAME=VALUE) and checks it: a usage error names the flag,
  // the value and what to write instead.
  std::function<void(RunConfig&, const std::string& text)> parse;
  // The value as command-line text ("" when unset): --help's default, a sweep's arguments.
  std::function<std::string(const RunConfig&)> text;
  // Checks the value as it stands (defaults and values set in code included).
  std::function<void(const RunConfig&)> check;
  // Writes the value into a config JSON object (nothing for kOutput), and reads it back
  // from one (absent keys leave the default: records of older versions lack newer settings).
  std::function<void(const RunConfig&, nlohmann::json& out, JsonPurpose purpose)> write;
  std::function<void(RunConfig&, const nlohmann::json& in)> read;

  std::string flag() const { return "--" + name; }
  std::string toml_key() const;  // name with '-' as '_'
};

// Every run setting, in section order.
const std::vector<Setting>& run_settings();
// The setting with this flag name ("accum-steps") or TOML key ("accum_steps"); null if none.
const Setting* find_setting(const std::string& name_or_key);

// Checks every setting's value and the rules between settings (the --lr-search-* settings
// need --lr auto; the step plan's parts must agree). A usage error names the first problem.
void check_config(const RunConfig& config);

// The run record's "config": every recorded setting (roles kDefines and kMeasures).
nlohmann::json config_to_json(const RunConfig& config);
// The configuration a record's "config" describes; settings it lacks keep their defaults. A
// usage error names a key whose value has the wrong type.
RunConfig config_from_json(const nlohmann::json& config);

// The canonical JSON of the settings that define the run (kDefines): what the run id
// digests, with the resolved architecture added (train/session.h). Keys added since the
// first records appear only when they differ from their default, so older run ids hold.
nlohmann::json canonical_config_json(const RunConfig& config);
// Hex digest (16 chars) of a canonical JSON (with "arch" added by the caller).
std::string run_id_of(const nlohmann::json& canonical);

// The report's grouping key of a recorded configuration: its canonical JSON without the
// seed, and with the learning rate as "auto" when it was searched (each seed may find
// another), as sorted "name=value;" text with nested objects flattened ("arch.hidden_size").
std::string grouping_key(const RunConfig& config, const nlohmann::json& arch);
// The flattened identity settings of a configuration ("opt.momentum" -> "0.9" as JSON text),
// without the seed, for labelling groups by what differs between them; `section_of` tells
// each flattened name's section.
std::map<std::string, std::string> identity_settings(const RunConfig& config,
                                                     const nlohmann::json& arch);
// The section of a flattened identity name ("arch.hidden_size" is the model's).
SettingSection identity_section(const std::string& flattened_name);

}  // namespace gradscope
