// Runs with several ranks (--nproc, --shard): the same configuration on other rank counts,
// its one-rank baseline, and how well the ranks scale.
//
// - Two groups are the same configuration on other rank counts when their identity settings
//   differ only in nproc; with the shard mode and the bucket size erased too, they are the same
//   work spread another way. The per-rank batch (--batch) is an identity setting, so it is
//   equal in both: N ranks see N times the samples of one step.
// - Scaling efficiency of a group on N ranks: tokens_per_s(N) / (N x tokens_per_s(1)), where
//   the record's tokens/s counts every rank's tokens (the whole step's) and the one-rank
//   baseline is the same work with shard ddp at nproc 1 (the same bucket size first), else
//   with shard none at nproc 1. 1 is perfect scaling; communication and waiting lower it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/report/groups.h"

namespace gradscope {

// The same work in one process (nproc 1, shard none), where the data has it.
std::optional<size_t> one_process_group(const GroupedRuns& data, size_t group);
// The one-rank baseline of a group's scaling (above), where the data has it.
std::optional<size_t> scaling_baseline(const GroupedRuns& data, size_t group);
// The group's scaling efficiency (above); NaN when it or its baseline has no tokens/s.
double scaling_efficiency(const GroupedRuns& data, size_t group);

// One line of "step time against ranks": the groups of one configuration that differ only in
// nproc, by rank count.
struct ScalingLine {
  std::string title;           // the shard mode, after the configuration where a model has several
  std::vector<size_t> groups;  // group indices, nproc ascending
};

// The lines of a model: every configuration that ran with several ranks (distributed_group),
// and its one-process form, in report order, shard modes in their order (none, ddp, zero1,
// zero2, fsdp).
std::vector<ScalingLine> scaling_lines(const GroupedRuns& data, const std::string& model);
// The distinct rank counts of the lines.
size_t rank_counts(const GroupedRuns& data, const std::vector<ScalingLine>& lines);

}  // namespace gradscope
