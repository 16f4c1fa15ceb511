// Subcommands. Each adds itself to the root app; its callback sets the exit code and throws
// gradscope::Error for bad usage or input (main prints it and exits 2).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
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
void add_task_command(CLI::App& root, int& exit_code);
void add_probe_command(CLI::App& root, int& exit_code);
void add_estimate_command(CLI::App& root, int& exit_code);
void add_report_command(CLI::App& root, int& exit_code);
void add_eval_command(CLI::App& root, int& exit_code);
void add_outputs_command(CLI::App& root, int& exit_code);

// Parses `gradscope run` arguments (what follows the subcommand) into the run's configuration
// with the command's own checks; a sweep uses it to know each run's id before starting it.
RunConfig parse_run_arguments(const std::vector<std::string>& args);

// Shared by the commands that write files and read settings (defined in run.cpp).
// A usage error unless the file's folder exists and is writable.
void check_output_path(const std::string& path);
// The JSON, indented, by write_file_atomically (core/files.h): never half a record.
void write_json_atomically(const std::string& path, const nlohmann::json& j);

// `gradscope run --config FILE.toml ...`: the file's settings become flags right after `run`,
// so that flags given on the command line (which come later) override them.
std::vector<std::string> expand_run_config_files(const std::vector<std::string>& args);

// The command line as given (before --config files are expanded), which the ranks of
// --nproc run again (launch.cpp).
void set_run_command_line(std::vector<std::string> args);
// `gradscope run --nproc N` outside a launcher: starts N ranks of this command and waits for
// them; returns rank 0's exit code. When rank 0 dies without its record, `store` is given a
// crashed record of the run and a runtime error follows.
struct RunRecord;
int launch_local_ranks(const RunConfig& config, const std::function<void(const RunRecord&)>& store);

}  // namespace gradscope
