// Subcommands. Each adds itself to the root app; its callback sets the exit code and throws
// gradscope::Error for bad usage or input (main prints it and exits 2).
#pragma once

#include <CLI/CLI.hpp>

namespace gradscope {

void add_run_command(CLI::App& root, int& exit_code);
void add_list_command(CLI::App& root, int& exit_code);
void add_tokenize_command(CLI::App& root, int& exit_code);
void add_verify_command(CLI::App& root, int& exit_code);

}  // namespace gradscope
