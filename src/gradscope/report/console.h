// What a person sees in the terminal: progress while a run trains, a summary when it ends.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/train/trainer.h"

namespace gradscope {

// A progress bar with ETA, loss and tokens/s on a terminal; plain periodic lines otherwise
// (logs, CI), at most one every `interval_s` seconds plus the first and last step.
std::unique_ptr<ProgressSink> make_console_progress(FILE* out, bool is_terminal,
                                                    double interval_s = 10.0);

// The end-of-run summary table of a record, with extra (label, value) rows at the end.
std::string summary_table(const nlohmann::json& record,
                          const std::vector<std::pair<std::string, std::string>>& extra = {});

// "1m23s", "4.2s", "850ms"
std::string format_duration(double seconds);

}  // namespace gradscope
