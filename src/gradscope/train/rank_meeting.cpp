#include "gradscope/train/rank_meeting.h"

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/core/settings.h"

namespace gradscope {
namespace {

using nlohmann::json;

json build_identity() {
  const EnvInfo env = current_env("cpu");
  std::error_code ec;
  const auto size = std::filesystem::file_size("/proc/self/exe", ec);
  return {{"gradscope", env.gradscope_version},
          {"commit", env.git_commit},
          {"libtorch", env.libtorch},
          {"build_type", env.build_type},
          {"executable_bytes", ec ? json(nullptr) : json(static_cast<int64_t>(size))}};
}

// The first key (a dotted path) where `a` and `b` differ, with both values; "" when equal.
std::string first_difference(const json& a, const json& b, const std::string& path,
                             std::string& mine, std::string& theirs) {
  if (a.is_object() && b.is_object()) {
    std::vector<std::string> keys;
    for (const auto& item : a.items()) keys.push_back(item.key());
    for (const auto& item : b.items())
      if (!a.contains(item.key())) keys.push_back(item.key());
    for (const std::string& k : keys) {
      const json x = a.contains(k) ? a.at(k) : json("(not set)");
      const json y = b.contains(k) ? b.at(k) : json("(not set)");
      const std::string at = path.empty() ? k : path + "." + k;
      const std::string d = first_difference(x, y, at, mine, theirs);
      if (!d.empty()) return d;
    }
    return "";
  }
  if (a == b) return "";
  mine = a.dump().substr(0, 80);
  theirs = b.dump().substr(0, 80);
  return path;
}

}  // namespace

void check_same_run(Communicator& comm, const RunConfig& config) {
  json identity = canonical_config_json(config);
  identity["dist_timeout_s"] = config.dist_timeout_s;
  const json mine = {{"build", build_identity()}, {"config", identity}};
  const std::vector<std::string> all = comm.gather_text(mine.dump());
  const auto parse = [&](size_t r) {
    try {
      return json::parse(all.at(r));
    } catch (const json::exception&) {
      fail_usage(fmt::format("rank {} sent no readable build and configuration", r),
                 "run the same gradscope on every host");
    }
  };
  const json first = parse(0);
  for (size_t r = 1; r < all.size(); ++r) {
    const json other = parse(r);
    std::string v0, vr;
    const std::string key = first_difference(first, other, "", v0, vr);
    if (key.empty()) continue;
    const auto& hosts = comm.rank_hosts();
    const auto host = [&](size_t i) {
      return i < hosts.size() ? " (host " + hosts[i] + ")" : std::string();
    };
    const bool build = key.rfind("build.", 0) == 0;
    fail_usage(fmt::format("rank {}{} runs another {} than rank 0{}: its {} is {}, rank 0's {}",
                           r, host(r), build ? "build" : "configuration", host(0), key, vr, v0),
               build ? "run the same gradscope on every host"
                     : "start every host's ranks with the same settings (only --node-rank and "
                       "the outputs differ)");
  }
}

std::optional<LinkProbe> probe_hosts_link(Communicator& comm) {
  if (comm.host_count() <= 1) return std::nullopt;
  const LinkProbe p = comm.probe_link(int64_t{256} << 10, int64_t{64} << 20, 3);
  log_info("link between the {} hosts: {:.3g} Gbit/s (all-reduce of {} in {:.3g} s)",
           comm.host_count(), p.bus_bytes_per_s * 8 / 1e9,
           format_bytes(static_cast<double>(p.bytes)), p.best_s);
  return p;
}

}  // namespace gradscope
