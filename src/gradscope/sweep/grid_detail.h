// What the sweep file's readers share: grid.cpp (run keys, axes, overrides, the expansion),
// grid_toml.cpp (reading a TOML file and turning its values into command-line text) and
// grid_settings.cpp (the [sweep] and [slurm] tables). Every message starts with "FILE:LINE:".
#pragma once

#include <string>
#include <string_view>

#include <toml++/toml.h>

#include "gradscope/sweep/grid.h"

namespace gradscope::grid_detail {

// "FILE:LINE" for messages, "FILE" when toml++ knows no line (an implicitly created table).
std::string where(const std::string& file, const toml::source_region& region);

// A key's own position is the most precise; a value's is the fallback.
const toml::source_region& region_of(const toml::key& key, const toml::node& node);

// What a node holds, for "must be X, not Y" messages ("text \"vit\"", "an array").
std::string describe(const toml::node& node);

// The command-line text of a scalar: strings as is, integers in decimal, floats in fmt's
// shortest round-trip form (0.05 -> "0.05", 3e-4 -> "0.0003", 1e-10 -> "1e-10"), booleans
// "true"/"false". `what` names the value in messages ("'lr' in [fixed]"); `array_hint` says
// what to do instead of an array, which depends on where the value stands.
std::string scalar_text(const std::string& file, const std::string& what, const toml::node& node,
                        const std::string& array_hint);

// Reads and parses a TOML file; a missing file and a syntax error are usage errors. `kind`
// names the file in messages ("sweep file").
toml::table parse_toml(const std::string& path, const char* kind);

// `node` as a table, else a usage error naming `what` with `hint`.
const toml::table& expect_table(const std::string& file, const std::string& what,
                                const toml::node& node, const std::string& hint);

// `node` as the entries of [[name]], else a usage error.
const toml::array& expect_array_of_tables(const std::string& file, const std::string& name,
                                          const toml::node& node);

// True when `name` is a run key or one of the tables opt and arch (for the hint that run keys
// belong under [fixed] or [axes]).
bool is_run_key_or_table(std::string_view name);

// The [sweep] and [slurm] tables, checked.
SweepSettings read_sweep_settings(const std::string& file, const toml::node& node);
SlurmSettings read_slurm_settings(const std::string& file, const toml::node& node);

}  // namespace gradscope::grid_detail
