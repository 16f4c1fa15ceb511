// The end-of-run summary a person reads in the terminal: one table of a run record.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "gradscope/core/record.h"

namespace gradscope {

// The summary table of a record, with extra (label, value) rows at the end; what was not
// measured reads "n/a".
std::string summary_table(const RunRecord& record,
                          const std::vector<std::pair<std::string, std::string>>& extra = {});

}  // namespace gradscope
