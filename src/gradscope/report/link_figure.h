// The report's figure of what a link costs: per model with runs whose ranks were on several
// hosts, step time and the communication the step waited for against the link's bandwidth
// as each run measured it when its ranks met (distributed.link), one line per configuration
// (the shard mode among what tells them apart). scripts/link-sweep.sh makes such runs.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "gradscope/report/figures.h"
#include "gradscope/report/groups.h"

namespace gradscope {

struct FigurePlot {
  Figure figure;
  int width = 0, height = 0;
  std::string data, body;  // NAME.dat and the plotting commands
};

// Nothing when the model has fewer than two such runs.
std::optional<FigurePlot> link_figure(const GroupedRuns& data, const std::string& model,
                                      const char* const* palette, size_t colors);

}  // namespace gradscope
