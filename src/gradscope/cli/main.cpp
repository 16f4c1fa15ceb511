// gradscope: train transformers under different optimizers and memory strategies, and
// measure what each costs.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "gradscope/cli/commands.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/measure/memory.h"
#include "gradscope/train/train_state.h"

namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

int main(int argc, char** argv) {
  // `gradscope run` stops between steps on SIGTERM or SIGINT and records itself; until its
  // handlers are installed (StopSignals), a stop waits instead of ending it unrecorded.
  if (argc > 1 && std::string(argv[1]) == "run") gradscope::block_stop_signals();
  // Before any tensor exists, so that every CPU allocation is counted.
  gradscope::CpuMemoryTracker::install();

  CLI::App app{
      "gradscope: a microscope for memory-efficient training.\n"
      "Trains transformers with a choice of optimizer and memory strategy and measures\n"
      "loss, time per phase, memory, utilization and FLOP/s. Start with `gradscope list`,\n"
      "then `gradscope run --model llama --preset tiny --steps 200`."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("gradscope ") + GRADSCOPE_VERSION +
                                        " on LibTorch " + TORCH_VERSION);
  int exit_code = 0;
  gradscope::add_run_command(app, exit_code);
  gradscope::add_verify_command(app, exit_code);
  gradscope::add_eval_command(app, exit_code);
  gradscope::add_outputs_command(app, exit_code);
  gradscope::add_list_command(app, exit_code);
  gradscope::add_tokenize_command(app, exit_code);
  gradscope::add_sweep_command(app, exit_code);
  gradscope::add_collect_command(app, exit_code);
  gradscope::add_task_command(app, exit_code);
  gradscope::add_probe_command(app, exit_code);
  gradscope::add_estimate_command(app, exit_code);
  gradscope::add_report_command(app, exit_code);

  try {
    app.name(argv[0]);
    std::vector<std::string> args(argv + 1, argv + argc);
    gradscope::set_run_command_line(args);
    args = gradscope::expand_run_config_files(args);
    std::reverse(args.begin(), args.end());  // CLI11 parses a vector from the back
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << gradscope::terminal_text(e.what()) << "\n"
              << "hint: see `gradscope --help` or `gradscope COMMAND --help`\n";
    return 2;
  } catch (const gradscope::Error& e) {
    std::cerr << "error: " << gradscope::terminal_text(e.what()) << "\n";
    std::cerr << "hint: "
              << gradscope::terminal_text(e.hint().empty() ? "see `gradscope COMMAND --help`"
                                                           : e.hint())
              << "\n";
    return e.kind() == gradscope::ErrorKind::kUsage ? 2 : 1;
  } catch (const c10::Error& e) {
    std::cerr
        << "error: " << first_line(e.what_without_backtrace()) << "\n"
        << "hint: this is a LibTorch error; rerun with a smaller configuration or report it\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << gradscope::terminal_text(first_line(e.what())) << "\n";
    return 1;
  }
  return exit_code;
}
