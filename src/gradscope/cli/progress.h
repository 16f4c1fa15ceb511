// What a person sees in the terminal while a run trains.
#pragma once

#include <cstdio>
#include <memory>

#include "gradscope/train/trainer.h"

namespace gradscope {

// A progress bar with ETA, loss and tokens/s on a terminal; plain periodic lines otherwise
// (logs, CI), at most one every `interval_s` seconds plus the first and last step.
std::unique_ptr<ProgressSink> make_console_progress(FILE* out, bool is_terminal,
                                                    double interval_s = 10.0);

}  // namespace gradscope
