// The run settings (core/settings.h) as command-line options: every command that takes run
// settings (run, verify, estimate) declares them from the one table, so a flag means the same
// everywhere, has one help text, and refuses a bad value with the same message.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gradscope/core/config.h"

namespace gradscope {

class SettingOptions {
 public:
  // Adds the settings named in `names` (flag names, "accum-steps"), or every setting when it is
  // empty, to `cmd`, grouped by section, with `defaults`' values shown as defaults.
  void add_to(CLI::App* cmd, const RunConfig& defaults, const std::vector<std::string>& names = {});
  // Applies the options given on the command line to `config`, in the table's order, with
  // each setting's own checks (a usage error names the flag).
  void apply(RunConfig& config) const;
  // Whether this flag was given.
  bool given(const std::string& name) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;  // flag name -> values given
  std::map<std::string, int64_t> flags_;                    // flag name -> times given
};

}  // namespace gradscope
