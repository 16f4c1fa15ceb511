// The report's figures, drawn by gnuplot (gnuplot.h): per model the loss curves on each axis
// (steps, samples, time, energy), peak memory by component, time per step by phase and loss
// against peak memory, and with several ranks the memory per rank and the step time against
// ranks (scaling.h); across models utilization over time and energy per run.
#pragma once

#include <string>
#include <vector>

#include "gradscope/report/groups.h"

namespace gradscope {

struct Figure {
  std::string name;     // file stem under figures/
  std::string section;  // a model's name, or "" for the cross-model figures
  // "loss", "memory", "rank-memory", "phases", "scaling", "link", "pareto", "utilization",
  // "energy"
  std::string kind;
  std::string axis;  // loss figures: steps, samples, time or energy
  std::string title, caption;
};

// Writes figures/NAME.{dat,gp} for every figure the data allows and draws them with
// `gnuplot` (the executable to run). Throws a runtime error naming the figure when gnuplot
// fails, and a usage error when it cannot be started.
std::vector<Figure> write_figures(const GroupedRuns& data, const std::string& dir,
                                  const std::string& gnuplot = "gnuplot");

}  // namespace gradscope
