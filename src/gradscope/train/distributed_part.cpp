#include "gradscope/train/distributed_part.h"

#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/log.h"
#include "gradscope/train/record_parts.h"

namespace gradscope {
namespace {

std::string first_line_of(const std::string& text) { return text.substr(0, text.find('\n')); }

// With several ranks: the run disturbed when any rank was (see below).
void merge_rank_contention(RunRecord& record, Communicator& comm) {
  // A step waits for the slowest rank at its collectives, so a rank whose cores were shared
  // stretches every rank's step: the run is disturbed when any rank was. The figures stay
  // this rank's; the reasons name the other ranks' crossings.
  nlohmann::json mine = {{"disturbed", false}, {"reasons", nlohmann::json::array()}};
  if (record.contention)
    mine = {{"disturbed", record.contention->disturbed}, {"reasons", record.contention->reasons}};
  try {
    const std::vector<std::string> all = comm.gather_text(mine.dump());
    for (size_t r = 0; r < all.size(); ++r) {
      if (static_cast<int64_t>(r) == comm.rank()) continue;
      const nlohmann::json other = nlohmann::json::parse(all[r]);
      if (!other.at("disturbed").get<bool>()) continue;
      if (!record.contention) record.contention = RunContention{};
      record.contention->disturbed = true;
      for (const auto& reason : other.at("reasons"))
        record.contention->reasons.push_back(
            fmt::format("rank {}: {}", r, reason.get<std::string>()));
    }
  } catch (const std::exception& e) {
    log_warn("the other ranks' contention could not be gathered: {}", first_line_of(e.what()));
  }
}

}  // namespace

void record_distributed_part(RunRecord& record, const Session& session, const ShardFigures& shard,
                             const CommStats& timed_comm, int64_t timed_run) {
  Communicator& comm = *session.communicator();
  const RunConfig& c = session.resolved().config;
  RunDistributed d;
  d.world = comm.world();
  d.shard = shard_name(c.shard);
  d.launcher = session.launcher();
  d.backend = comm.world() > 1 ? "gloo" : "none";
  d.flat_params = shard.flat_elements;
  d.shard_params = shard.shard_elements;
  d.hosts = comm.rank_hosts();
  d.nnodes = comm.host_count();
  if (!comm.interface_name().empty()) d.interface = comm.interface_name();
  if (const auto& probe = session.link())
    d.link = RunLink{probe->bytes, probe->repeats, probe->best_s, probe->bus_bytes_per_s};
  const RankFigures mine = rank_figures_of(record, comm.rank(), shard.buffer_peak_bytes, timed_comm,
                                           timed_run, shard.reduced_bytes, shard.overlapped_bytes);
  // Every rank ends its loop at the same step with the same status, except when one failed on
  // its own (an error, out of memory) or lost a peer: then only this rank's figures are known.
  const bool together = record.status != RunStatus::kError &&
                        record.status != RunStatus::kOom &&
                        record.status != RunStatus::kCrashed;
  if (comm.world() > 1 && together) {
    try {
      const std::vector<std::string> all = comm.gather_text(rank_figures_to_json(mine).dump());
      for (size_t r = 0; r < all.size(); ++r)
        d.ranks.push_back(
            rank_figures_from_json(nlohmann::json::parse(all[r]), fmt::format("rank {}", r)));
    } catch (const std::exception& e) {
      log_warn("the other ranks' figures could not be gathered: {}", first_line_of(e.what()));
      d.ranks = {mine};
    }
  } else {
    d.ranks.push_back(mine);
  }
  if (comm.world() > 1 && together) merge_rank_contention(record, comm);
  record.distributed = std::move(d);
}

}  // namespace gradscope
