// The settings table's rows of the ranks a run trains on: how many, on how many hosts, how
// they share a step, and where they meet (settings_table_rows.cpp calls add_rank_rows in
// --help's order). torchrun's vocabulary: --nnodes, --node-rank, --master-addr, --master-port,
// --nproc-per-node; --nproc N is the one-host shorthand for --nnodes 1 --nproc-per-node N.
#include <cmath>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/core/plain_text.h"
#include "gradscope/core/setting_rows.h"
#include "gradscope/core/settings.h"

namespace gradscope {
namespace setting_rows {
namespace {

using R = SettingRole;
using S = SettingSection;
using T = SettingType;

constexpr int64_t kMaxRanks = 1024;

// A host name or an IPv4 or IPv6 literal: letters, digits and . - _ : (nothing a shell, a URL
// or a log line would read as more than one word).
bool is_address_text(const std::string& text) {
  if (text.empty() || text.size() > 253) return false;
  for (char ch : text)
    if (!(is_plain_name_char(ch) || ch == ':')) return false;
  return true;
}

Setting nproc_row() {
  Setting s = member_row("nproc", "nproc", &RunConfig::nproc, T::kInteger, R::kDefines,
                         S::kDevice,
                         "Ranks (processes) that train together, with --shard; each reads its "
                         "share of every step (global batch = batch x accum-steps x nproc). "
                         "gradscope run starts them itself on this machine (at most the cores "
                         "it may run on + 4 ranks), or each is started by torchrun or srun; "
                         "across hosts see --nnodes (docs/distributed.md)");
  s.check = [flag = s.flag()](const RunConfig& c) {
    check_usage(c.nproc >= 1 && c.nproc <= kMaxRanks,
                fmt::format("{} {} must be between 1 and {}", flag, c.nproc, kMaxRanks),
                "pass the number of ranks, e.g. --nproc 2");
    check_usage(c.nproc == 1 || c.shard != Shard::kNone,
                fmt::format("{} {} needs a way to share the work: --shard", flag, c.nproc),
                "add --shard ddp (or zero1, zero2, fsdp)");
    check_usage(c.nproc == 1 || !c.lr_auto,
                fmt::format("--lr auto searches with one process, not with {} {}", flag, c.nproc),
                "find the rate with one process, then pass it with --lr");
  };
  // In the id only with several ranks: the key is newer than the first records.
  s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
    if (purpose == JsonPurpose::kRecord || c.nproc != 1) out["nproc"] = c.nproc;
  };
  return s;
}

Setting nnodes_row() {
  Setting s = member_row("nnodes", "nnodes", &RunConfig::nnodes, T::kInteger, R::kDefines,
                         S::kDevice,
                         "Hosts the ranks train on, --nproc-per-node on each: start `gradscope "
                         "run` with the same settings on every host, each with its --node-rank, "
                         "all with node 0's --master-addr and --master-port");
  s.check = [](const RunConfig& c) {
    check_usage(c.nnodes >= 1 && c.nnodes <= kMaxRanks,
                fmt::format("--nnodes {} must be between 1 and {}", c.nnodes, kMaxRanks),
                "pass the number of hosts, e.g. --nnodes 2");
    check_usage(c.nproc % c.nnodes == 0,
                fmt::format("--nproc {} ranks cannot be spread evenly over --nnodes {}", c.nproc,
                            c.nnodes),
                "pass --nproc-per-node: the ranks on each host");
  };
  // A run on several hosts is other work than the same ranks on one (its steps cross a
  // network): in the id when above 1, so that the report never averages the two.
  s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
    if (purpose == JsonPurpose::kRecord || c.nnodes != 1) out["nnodes"] = c.nnodes;
  };
  return s;
}

Setting nproc_per_node_row() {
  Setting s = member_row("nproc-per-node", "", &RunConfig::nproc_per_node, T::kInteger,
                         R::kOutput, S::kDevice,
                         "Ranks on each host: --nproc becomes --nnodes x this (0: not given, "
                         "--nproc counts every host's ranks)");
  // After --nproc and --nnodes in the table, so that both are known here.
  s.parse = [flag = s.flag()](RunConfig& c, const std::string& text) {
    const int64_t k = parse_integer(flag, text);
    check_usage(k >= 1 && k <= kMaxRanks,
                fmt::format("{} {} must be between 1 and {}", flag, k, kMaxRanks),
                "pass the ranks on each host, e.g. --nproc-per-node 2");
    check_usage(c.nnodes >= 1 && c.nnodes <= kMaxRanks / k,
                fmt::format("--nnodes {} x {} {} is more than {} ranks", c.nnodes, flag, k,
                            kMaxRanks),
                "use fewer hosts or ranks per host");
    check_usage(c.nproc == 1 || c.nproc == c.nnodes * k,
                fmt::format("--nproc {} disagrees with --nnodes {} x {} {}", c.nproc, c.nnodes,
                            flag, k),
                "leave --nproc out: it follows from --nnodes and --nproc-per-node");
    c.nproc_per_node = k;
    c.nproc = c.nnodes * k;
  };
  s.check = [flag = s.flag()](const RunConfig& c) {
    check_usage(c.nproc_per_node == 0 || c.nproc == c.nnodes * c.nproc_per_node,
                fmt::format("--nproc {} disagrees with --nnodes {} x {} {}", c.nproc, c.nnodes,
                            flag, c.nproc_per_node),
                "leave --nproc out: it follows from --nnodes and --nproc-per-node");
  };
  return s;
}

Setting node_rank_row() {
  Setting s = member_row("node-rank", "", &RunConfig::node_rank, T::kInteger, R::kOutput,
                         S::kDevice,
                         "With --nnodes: this host's place, 0 to nnodes - 1; node 0 hosts the "
                         "meeting point and holds rank 0, which writes the record");
  s.check = [](const RunConfig& c) {
    check_usage(c.node_rank >= 0 && c.node_rank < c.nnodes,
                fmt::format("--node-rank {} must be between 0 and --nnodes - 1 ({})", c.node_rank,
                            c.nnodes - 1),
                "number the hosts 0, 1, ... with --node-rank");
  };
  return s;
}

Setting master_addr_row() {
  Setting s = member_row("master-addr", "", &RunConfig::master_addr, T::kText, R::kOutput,
                         S::kDevice,
                         "With --nnodes: node 0's address (a host name or an IP address) that "
                         "every host reaches; node 0's meeting point listens on it alone");
  s.check = [](const RunConfig& c) {
    check_usage(c.master_addr.empty() || is_address_text(c.master_addr),
                fmt::format("--master-addr '{}' is no host name or IP address",
                            terminal_text(c.master_addr.substr(0, 80))),
                "write e.g. --master-addr 10.0.0.1 or --master-addr node01");
    check_usage(c.master_addr.empty() || c.nnodes > 1,
                "--master-addr is for runs across hosts (--nnodes above 1)",
                "leave it out: ranks on one host meet on a port the system picks");
  };
  return s;
}

Setting master_port_row() {
  Setting s = member_row("master-port", "", &RunConfig::master_port, T::kInteger, R::kOutput,
                         S::kDevice,
                         "With --nnodes: the port of node 0's meeting point (torchrun's "
                         "default 29500); it must be free on node 0 and open to the others");
  s.check = [](const RunConfig& c) {
    check_usage(c.master_port >= 1 && c.master_port <= 65535,
                fmt::format("--master-port {} must be between 1 and 65535", c.master_port),
                "pass e.g. --master-port 29500");
  };
  return s;
}

Setting ifname_row() {
  Setting s = member_row("ifname", "", &RunConfig::ifname, T::kText, R::kOutput, S::kDevice,
                         "The network interface the ranks reach each other on (eth0, ib0); "
                         "default GLOO_SOCKET_IFNAME, else the address this host's name "
                         "resolves to");
  s.check = [](const RunConfig& c) {
    check_usage(c.ifname.empty() || is_plain_name(c.ifname, 15),
                fmt::format("--ifname '{}' is no network interface name",
                            terminal_text(c.ifname.substr(0, 80))),
                "name an interface `ip link` lists, e.g. --ifname eth0");
  };
  return s;
}

Setting network_row() {
  Setting s = member_row("network", "network", &RunConfig::network, T::kText, R::kDefines,
                         S::kDevice,
                         "A name for the interconnect between the hosts (25gbe, ib-hdr): in the "
                         "run id, so that runs on different networks are reported apart");
  s.check = [](const RunConfig& c) {
    check_usage(c.network.empty() || is_plain_name(c.network, 64),
                fmt::format("--network '{}' must be 1 to 64 letters, digits, '.', '_' or '-'",
                            terminal_text(c.network.substr(0, 80))),
                "write e.g. --network 25gbe");
  };
  // In the id only when named: runs before it had none.
  s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
    if (purpose == JsonPurpose::kRecord || !c.network.empty()) out["network"] = c.network;
  };
  return s;
}

Setting shard_row() {
  Setting s = choice_row<Shard>(
      "shard", "shard", &RunConfig::shard, S::kDevice,
      "How --nproc ranks share a step: none (one process), ddp (gradients all-reduced in "
      "buckets as backward makes them), zero1 (optimizer state split over the ranks), zero2 "
      "(also gradients), fsdp (also parameters, gathered per block)",
      parse_shard, shard_name, shard_names());
  s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
    if (purpose == JsonPurpose::kRecord || c.shard != Shard::kNone)
      out["shard"] = shard_name(c.shard);
  };
  return s;
}

Setting grad_reduce_row() {
  Setting s = choice_row<GradReduce>(
      "grad-reduce", "grad_reduce", &RunConfig::grad_reduce, S::kDevice,
      "With --shard fsdp: how a block's gradients reach the ranks that keep their shards: "
      "all-reduce (every rank sums the whole block, keeps its shard) or reduce-scatter "
      "(c10d's collective: each rank receives its shard's sum)",
      parse_grad_reduce, grad_reduce_name, grad_reduce_names());
  s.check = [flag = s.flag()](const RunConfig& c) {
    // zero2's shards are contiguous ranges of all parameters, so a bucket lies in one rank's
    // shard (or two): scattering it would send the whole bucket to each rank's chunk.
    check_usage(c.grad_reduce == GradReduce::kAllReduce || c.shard == Shard::kFsdp,
                fmt::format("{} reduce-scatter applies to --shard fsdp only (got --shard {})",
                            flag, shard_name(c.shard)),
                "add --shard fsdp, or leave --grad-reduce out");
  };
  // In the id only when not the default: runs before it had none.
  s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
    if (purpose == JsonPurpose::kRecord || c.grad_reduce != GradReduce::kAllReduce)
      out["grad_reduce"] = grad_reduce_name(c.grad_reduce);
  };
  return s;
}

Setting bucket_row() {
  Setting s = member_row("bucket-size", "bucket_bytes", &RunConfig::bucket_bytes, T::kBytes,
                         R::kDefines, S::kDevice,
                         "With --shard: gradients reduced (and parameters gathered) in "
                         "buckets of this many bytes; a bucket is the transient buffer of "
                         "one collective");
  s.parse = [](RunConfig& c, const std::string& text) { c.bucket_bytes = parse_bytes(text); };
  s.check = [flag = s.flag()](const RunConfig& c) {
    check_usage(c.bucket_bytes >= 1024, fmt::format("{} {} is below 1KiB", flag, c.bucket_bytes),
                "write a size such as 25MiB");
  };
  s.write = [](const RunConfig& c, json& out, JsonPurpose purpose) {
    if (purpose == JsonPurpose::kRecord || c.shard != Shard::kNone)
      out["bucket_bytes"] = c.bucket_bytes;
  };
  return s;
}

Setting dist_timeout_row() {
  Setting s = member_row("dist-timeout", "dist_timeout_s", &RunConfig::dist_timeout_s,
                         T::kNumber, R::kMeasures, S::kDevice,
                         "With --nproc: seconds the ranks wait for each other (to meet, and in "
                         "a collective) before the run fails; a rank that dies ends the others "
                         "sooner, when its connections close");
  s.check = [flag = s.flag()](const RunConfig& c) {
    check_usage(c.dist_timeout_s >= 1 && std::isfinite(c.dist_timeout_s),
                fmt::format("{} {} must be at least 1 second", flag, c.dist_timeout_s),
                "pass e.g. --dist-timeout 120");
  };
  return s;
}

}  // namespace

void add_rank_rows(std::vector<Setting>& t) {
  // --nproc and --nnodes before --nproc-per-node, whose value they multiply.
  t.push_back(nproc_row());
  t.push_back(nnodes_row());
  t.push_back(nproc_per_node_row());
  t.push_back(node_rank_row());
  t.push_back(master_addr_row());
  t.push_back(master_port_row());
  t.push_back(ifname_row());
  t.push_back(network_row());
  t.push_back(shard_row());
  t.push_back(grad_reduce_row());
  t.push_back(bucket_row());
  t.push_back(dist_timeout_row());
}

}  // namespace setting_rows
}  // namespace gradscope
