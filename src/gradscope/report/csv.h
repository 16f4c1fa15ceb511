// The report's CSV files. Empty cells mean "not measured".
#pragma once

#include <string>

#include "gradscope/report/claims.h"
#include "gradscope/report/groups.h"

namespace gradscope {

// runs.csv: one row per run (latest attempt of each run_id), in report order: configuration
// (ranks and shard mode included), status, losses, step time (and time waiting on collectives),
// throughput, peak memory by component, with several ranks rank 0's bytes sent per step and
// the ranks' mean overlapped share, energy, utilization, FLOPs.
std::string runs_csv(const GroupedRuns& data);
// steps.csv: one row per step with a finite loss, with cumulative samples, tokens, gradient
// evaluations (samples x passes), hardware FLOPs, time and energy.
std::string steps_csv(const GroupedRuns& data);
// claims.csv: one row per claim: its id, the claim, the verdicts at equal steps, samples and
// gradient evaluations, the measured figures and the rule; then the one-line headline, the
// scale of the deciding runs, the correction, the named contrasts (joined with "; ") and the
// verdict the rule gave (the verdict itself unless it is "indicative only").
std::string claims_csv(const std::vector<Finding>& findings);

}  // namespace gradscope
