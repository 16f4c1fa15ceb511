// Subcommands. Each adds itself to the root app; its callback sets the exit code and throws
// gradscope::Error for bad usage or input (main prints it and exits 2).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "gradscope/core/config.h"

namespace gradscope {

void add_run_command(CLI::App& root, int& exit_code);
void add_list_command(CLI::App& root, int& exit_code);
void add_tokenize_command(CLI::App& root, int& exit_code);
void add_verify_command(CLI::App& root, int& exit_code);
void add_sweep_command(CLI::App& root, int& exit_code);
void add_collect_command(CLI::App& root, int& exit_code);
void add_probe_command(CLI::App& root, int& exit_code);
void add_estimate_command(CLI::App& root, int& exit_code);

// Parses `gradscope run` arguments (what follows the subcommand) into the run's configuration
// with the command's own checks; a sweep uses it to know each run's id before starting it.
RunConfig parse_run_arguments(const std::vector<std::string>& args);

// `gradscope run --config FILE.toml ...`: the file's settings become flags right after `run`,
// so that flags given on the command line (which come later) override them.
std::vector<std::string> expand_run_config_files(const std::vector<std::string>& args);

}  // namespace gradscope
