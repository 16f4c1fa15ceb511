#include "gradscope/report/scaling.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "gradscope/core/env.h"
#include "gradscope/core/statistics.h"

namespace gradscope {
namespace {

// The work of a step, whatever the ranks it is spread over.
std::string work_key(const Group& g) {
  return key_without(g, {"nproc", "shard", "grad_reduce", "bucket_bytes"});
}

// One configuration on any rank count.
std::string line_key(const Group& g) { return key_without(g, {"nproc"}); }

bool same_work(const Group& a, const Group& b) {
  return a.model == b.model && a.preset == b.preset && work_key(a) == work_key(b);
}

}  // namespace

std::optional<size_t> one_process_group(const GroupedRuns& data, size_t group) {
  const Group& g = data.groups[group];
  for (size_t i = 0; i < data.groups.size(); ++i) {
    const Group& o = data.groups[i];
    if (i != group && !distributed_group(o) && same_work(g, o)) return i;
  }
  return std::nullopt;
}

std::optional<size_t> scaling_baseline(const GroupedRuns& data, size_t group) {
  const Group& g = data.groups[group];
  std::optional<size_t> ddp, ddp_same_bucket, none;
  for (size_t i = 0; i < data.groups.size(); ++i) {
    const Group& o = data.groups[i];
    if (o.config.nproc != 1 || !same_work(g, o)) continue;
    if (o.config.shard == Shard::kDdp) {
      if (!ddp) ddp = i;
      if (!ddp_same_bucket && o.config.bucket_bytes == g.config.bucket_bytes) ddp_same_bucket = i;
    } else if (o.config.shard == Shard::kNone && !none) {
      none = i;
    }
  }
  if (ddp_same_bucket) return ddp_same_bucket;
  if (ddp) return ddp;
  return none;
}

double scaling_efficiency(const GroupedRuns& data, size_t group) {
  const std::optional<size_t> base = scaling_baseline(data, group);
  if (!base) return kNaN;
  const Group& g = data.groups[group];
  const Interval& n = g.tokens_per_s;
  const Interval& one = data.groups[*base].tokens_per_s;
  if (n.n == 0 || one.n == 0 || !std::isfinite(n.mean) || !(one.mean > 0)) return kNaN;
  return n.mean / (static_cast<double>(g.config.nproc) * one.mean);
}

std::vector<ScalingLine> scaling_lines(const GroupedRuns& data, const std::string& model) {
  // The configurations that ran with several ranks, by where they first appear.
  std::map<std::string, size_t> works;
  for (size_t i = 0; i < data.groups.size(); ++i) {
    const Group& g = data.groups[i];
    if (g.model == model && distributed_group(g)) works.emplace(g.preset + "\n" + work_key(g), i);
  }
  if (works.empty()) return {};
  std::map<std::string, std::vector<size_t>> by_line;
  for (size_t i = 0; i < data.groups.size(); ++i) {
    const Group& g = data.groups[i];
    if (g.model == model && works.count(g.preset + "\n" + work_key(g)))
      by_line[g.preset + "\n" + line_key(g)].push_back(i);
  }
  std::vector<std::pair<std::tuple<size_t, int, int64_t, std::string>, std::vector<size_t>>> order;
  for (auto& [key, groups] : by_line) {
    std::sort(groups.begin(), groups.end(), [&](size_t a, size_t b) {
      return data.groups[a].config.nproc < data.groups[b].config.nproc;
    });
    const Group& g = data.groups[groups.front()];
    const size_t first = works.at(g.preset + "\n" + work_key(g));
    order.push_back(
        {{first, static_cast<int>(g.config.shard), g.config.bucket_bytes, key}, groups});
  }
  std::sort(order.begin(), order.end());
  // Lines of one configuration and shard mode differ in the bucket size.
  std::map<std::pair<size_t, int>, int> per_mode;
  for (const auto& [at, groups] : order) ++per_mode[{std::get<0>(at), std::get<1>(at)}];
  std::vector<ScalingLine> lines;
  for (const auto& [at, groups] : order) {
    const Group& g = data.groups[groups.front()];
    ScalingLine line;
    line.title = g.config.shard == Shard::kNone ? std::string("1 process") : g.shard;
    if (g.config.shard != Shard::kNone && per_mode[{std::get<0>(at), std::get<1>(at)}] > 1)
      line.title += " bucket " + format_bytes(static_cast<double>(g.config.bucket_bytes));
    if (works.size() > 1) line.title = g.base_label + ", " + line.title;
    line.groups = groups;
    lines.push_back(std::move(line));
  }
  return lines;
}

size_t rank_counts(const GroupedRuns& data, const std::vector<ScalingLine>& lines) {
  std::set<int64_t> counts;
  for (const ScalingLine& line : lines)
    for (size_t i : line.groups) counts.insert(data.groups[i].config.nproc);
  return counts.size();
}

}  // namespace gradscope
