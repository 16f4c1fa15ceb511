#include "gradscope/train/comm_estimate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <map>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/comm/comm.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/train/estimate.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace {

constexpr double kFloatBytes = 4;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A number followed by a unit of `units` (matched case-insensitively, longest first); nullopt
// when the text is not one.
std::optional<double> number_with_unit(const std::string& text,
                                       const std::map<std::string, double>& units) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = lower(text.substr(used));
  const auto it = units.find(unit);
  if (it == units.end() || !std::isfinite(v) || v <= 0) return std::nullopt;
  return v * it->second;
}

// The ring of N ranks over nnodes nodes: its slowest link.
Link ring_link(int64_t nnodes, const Link& inter, const Link& intra) {
  if (nnodes <= 1) return intra;
  return {std::min(inter.bytes_per_s, intra.bytes_per_s),
          std::max(inter.latency_s, intra.latency_s)};
}

// One rank's collectives, each a ring over `world` ranks on `link`.
struct Ring {
  int64_t world;
  Link link;
  // An all-reduce of n bytes: its time, and (added to `bytes`) what the rank sends.
  double allreduce(double n, double& bytes) const {
    const double rounds = 2.0 * static_cast<double>(world - 1);
    bytes += rounds * n / static_cast<double>(world);
    return rounds * (link.latency_s + n / static_cast<double>(world) / link.bytes_per_s);
  }
  // A ring reduce-scatter of n bytes (each rank receives n / N): N-1 rounds of n / N.
  double reduce_scatter(double n, double& bytes) const {
    const double rounds = static_cast<double>(world - 1);
    bytes += rounds * n / static_cast<double>(world);
    return rounds * (link.latency_s + n / static_cast<double>(world) / link.bytes_per_s);
  }
  // An all-gather of s bytes from each rank.
  double allgather(double s, double& bytes) const {
    const double rounds = static_cast<double>(world - 1);
    bytes += rounds * s;
    return rounds * (link.latency_s + s / link.bytes_per_s);
  }
};

// The step as the link and the compute thread see it: compute runs, a synchronous collective
// waits for the link and then for itself, an asynchronous one (a bucket) queues on the link
// while compute goes on.
class Timeline {
 public:
  explicit Timeline(size_t cap) : cap_(cap) {}
  void compute(double s) { t_ += s; }
  void sync(double c) {
    const double start = std::max(t_, link_);
    exposed_ += start + c - t_;
    t_ = link_ = start + c;
    comm_ += c;
    ++count_;
  }
  void async(double c) {
    if (cap_ > 0 && in_flight_.size() >= cap_) {
      const double w = std::max(0.0, in_flight_.front() - t_);
      exposed_ += w;
      t_ += w;
      in_flight_.pop_front();
    }
    const double start = std::max(t_, link_);
    link_ = start + c;
    in_flight_.push_back(link_);
    comm_ += c;
    ++count_;
  }
  // Waits for everything in flight.
  void drain() {
    exposed_ += std::max(0.0, link_ - t_);
    t_ = std::max(t_, link_);
    in_flight_.clear();
  }
  double comm() const { return comm_; }
  double exposed() const { return exposed_; }
  int64_t count() const { return count_; }

 private:
  size_t cap_;
  double t_ = 0, link_ = 0, comm_ = 0, exposed_ = 0;
  int64_t count_ = 0;
  std::deque<double> in_flight_;
};

// Buckets of consecutive member parameters from the last backwards, up to bucket_bytes each
// (as the reducer forms them): each bucket's parameter indices.
std::vector<std::vector<size_t>> buckets_of(const std::vector<ParamPlace>& params,
                                           const std::vector<bool>& member,
                                           int64_t bucket_bytes) {
  std::vector<size_t> order;
  for (size_t i = 0; i < params.size(); ++i)
    if (member[i]) order.push_back(i);
  std::vector<std::vector<size_t>> out;
  size_t end = order.size();
  while (end > 0) {
    size_t begin = end - 1;
    int64_t sum = params[order[begin]].bytes;
    while (begin > 0 && sum + params[order[begin - 1]].bytes <= bucket_bytes)
      sum += params[order[--begin]].bytes;
    out.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(begin),
                     order.begin() + static_cast<std::ptrdiff_t>(end));
    end = begin;
  }
  return out;
}

struct Shape {
  std::vector<ParamPlace> params;
  std::vector<double> block_share;  // of a micro-batch's forward FLOPs, per block
  double head_share = 0;            // the rest: the loss head (and embeddings)
  int64_t blocks = 0, first_block_param = 0;
  double micro_forward_s = 0, micro_backward_s = 0;
  int64_t accum = 1;
};

// Where backward's gradients complete: the order of backward's segments, from the loss
// head down the blocks; a root parameter before the first block's (an embedding) completes
// at the end.
int64_t ready_segment(const Shape& s, size_t param) {
  const ParamPlace& p = s.params[param];
  if (p.block >= 0) return s.blocks - p.block;  // segment 1 + (blocks - 1 - block)
  return static_cast<int64_t>(param) < s.first_block_param ? s.blocks + 1 : 0;
}

// scatter: fsdp's blocks reduced by a ring reduce-scatter (--grad-reduce reduce-scatter on
// NCCL; Gloo's reduce-scatter is an all-reduce).
CommModePrediction predict_mode(const Shape& s, Shard mode, const Ring& ring,
                                int64_t bucket_bytes, bool norm_sum, bool scatter) {
  const bool fsdp = mode == Shard::kFsdp;
  const double n = static_cast<double>(ring.world);
  CommModePrediction m;
  m.shard = shard_name(mode);
  // fsdp's units: each block's parameters, N S_b elements.
  std::vector<double> unit(static_cast<size_t>(s.blocks), 0.0);
  std::vector<bool> member(s.params.size(), true);
  double root_bytes = 0, all_bytes = 0;
  for (size_t i = 0; i < s.params.size(); ++i) {
    all_bytes += static_cast<double>(s.params[i].bytes);
    if (fsdp && s.params[i].block >= 0) {
      unit[static_cast<size_t>(s.params[i].block)] += static_cast<double>(s.params[i].bytes);
      member[i] = false;
    } else {
      root_bytes += static_cast<double>(s.params[i].bytes);
    }
  }
  const auto unit_shard = [&](int64_t b) {
    return std::ceil(unit[static_cast<size_t>(b)] / kFloatBytes / n) * kFloatBytes;
  };
  const auto buckets = buckets_of(s.params, member, bucket_bytes);
  const size_t cap = (mode == Shard::kZero2 || fsdp) ? kZero2BucketsInFlight : 0;
  Timeline tl(cap);
  for (int64_t micro = 0; micro < s.accum; ++micro) {
    const bool reduces = micro == s.accum - 1;
    for (int64_t b = 0; b < s.blocks; ++b) {  // forward
      if (fsdp && unit[static_cast<size_t>(b)] > 0)
        tl.sync(ring.allgather(unit_shard(b), m.bytes_per_step));
      tl.compute(s.block_share[static_cast<size_t>(b)] * s.micro_forward_s);
    }
    tl.compute(s.head_share * s.micro_forward_s);
    // Backward, segment by segment; buckets launch in order once complete.
    size_t next = 0;
    const auto launch_complete = [&](int64_t done_segment) {
      while (reduces && next < buckets.size()) {
        bool complete = true;
        double bytes = 0;
        for (size_t i : buckets[next]) {
          complete = complete && ready_segment(s, i) <= done_segment;
          bytes += static_cast<double>(s.params[i].bytes);
        }
        if (!complete) return;
        tl.async(ring.allreduce(bytes, m.bytes_per_step));
        ++next;
      }
    };
    tl.compute(s.head_share * s.micro_backward_s);
    launch_complete(0);
    for (int64_t b = s.blocks - 1; b >= 0; --b) {
      const bool has_unit = fsdp && unit[static_cast<size_t>(b)] > 0;
      if (has_unit) tl.sync(ring.allgather(unit_shard(b), m.bytes_per_step));
      tl.compute(s.block_share[static_cast<size_t>(b)] * s.micro_backward_s);
      if (has_unit && reduces)
        tl.sync(scatter ? ring.reduce_scatter(unit_shard(b) * n, m.bytes_per_step)
                        : ring.allreduce(unit_shard(b) * n, m.bytes_per_step));
      launch_complete(s.blocks - b);
    }
    launch_complete(s.blocks + 1);
    tl.drain();
  }
  // After the update: the gradient norm's sum (logged or clipped), then the updated shards
  // gathered in chunks of bucket_bytes / 4 / N elements per rank.
  if (mode != Shard::kDdp) {
    if (norm_sum) tl.sync(ring.allreduce(8, m.bytes_per_step));
    const double shard = std::ceil((fsdp ? root_bytes : all_bytes) / kFloatBytes / n);
    const double chunk = std::max(1.0, std::floor(static_cast<double>(bucket_bytes) / 4 / n));
    for (double done = 0; done < shard; done += chunk)
      tl.sync(ring.allgather(std::min(chunk, shard - done) * kFloatBytes, m.bytes_per_step));
  }
  m.collectives = tl.count();
  m.comm_s = tl.comm();
  m.exposed_s = tl.exposed();
  m.hidden_s = std::max(0.0, m.comm_s - m.exposed_s);
  m.step_s = static_cast<double>(s.accum) * (s.micro_forward_s + s.micro_backward_s) +
             m.exposed_s;
  return m;
}

Shape shape_of(const RunConfig& config, double device_flops_per_s, double& forward_s,
               double& backward_s) {
  RunConfig one = config;
  one.set_ranks_on_one_host(1);
  one.shard = Shard::kNone;
  const MemoryEstimate e = estimate_run(one, 0);
  Shape s;
  s.params = trainable_param_places(one);
  s.accum = std::max<int64_t>(1, config.accum_steps);
  const double forward = e.model_flops_per_step / 3;
  forward_s = forward / device_flops_per_s;
  backward_s = (e.hardware_flops_per_step - forward) / device_flops_per_s;
  s.micro_forward_s = forward_s / static_cast<double>(s.accum);
  s.micro_backward_s = backward_s / static_cast<double>(s.accum);
  const nlohmann::json arch = resolve_arch(one);
  const std::vector<BlockFlops> blocks =
      block_forward_flops(one.model, arch, arch.at("seq_len").get<int64_t>());
  s.blocks = static_cast<int64_t>(blocks.size());
  const double per_micro = forward / static_cast<double>(s.accum);
  double in_blocks = 0;
  for (const BlockFlops& b : blocks) {
    const double f = static_cast<double>(one.batch) * (b.attention + b.mlp);
    s.block_share.push_back(per_micro > 0 ? f / per_micro : 0);
    in_blocks += f;
  }
  s.head_share = per_micro > 0 ? std::max(0.0, 1 - in_blocks / per_micro) : 0;
  s.first_block_param = static_cast<int64_t>(s.params.size());
  for (size_t i = 0; i < s.params.size(); ++i)
    if (s.params[i].block >= 0) {
      s.first_block_param = static_cast<int64_t>(i);
      break;
    }
  return s;
}

}  // namespace

Link parse_link(const std::string& flag, const std::string& text) {
  static const std::map<std::string, double> rates = {
      {"bit", 1 / 8.0},       {"kbit", 1e3 / 8},      {"mbit", 1e6 / 8},
      {"gbit", 1e9 / 8},      {"tbit", 1e12 / 8},     {"bit/s", 1 / 8.0},
      {"kbit/s", 1e3 / 8},    {"mbit/s", 1e6 / 8},    {"gbit/s", 1e9 / 8},
      {"tbit/s", 1e12 / 8},   {"b/s", 1},             {"kb/s", 1e3},
      {"mb/s", 1e6},          {"gb/s", 1e9},          {"tb/s", 1e12}};
  static const std::map<std::string, double> times = {
      {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  const std::string hint =
      "write a bandwidth and, after a comma, a latency: e.g. 100gbit, 25gbit,5us or 50GB/s";
  const size_t comma = text.find(',');
  const auto rate = number_with_unit(text.substr(0, comma), rates);
  check_usage(rate.has_value(),
              fmt::format("{} '{}': no bandwidth", flag, terminal_text(text.substr(0, 80))), hint);
  Link link{*rate, 0};
  if (comma != std::string::npos) {
    const std::string lat = text.substr(comma + 1);
    const auto l = lat == "0" ? std::optional<double>(0.0) : number_with_unit(lat, times);
    check_usage(l.has_value() && *l < 10,
                fmt::format("{} '{}': no latency after the comma", flag,
                            terminal_text(text.substr(0, 80))),
                hint);
    link.latency_s = *l;
  }
  return link;
}

std::string link_text(const Link& link) {
  return fmt::format("{}bit/s, {:.3g} us latency", format_si(link.bytes_per_s * 8),
                     link.latency_s * 1e6);
}

double parse_flops(const std::string& flag, const std::string& text) {
  static const std::map<std::string, double> units = {
      {"", 1}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"t", 1e12}, {"p", 1e15}};
  const auto v = number_with_unit(text, units);
  check_usage(v.has_value(), fmt::format("{} '{}' is no FLOP/s figure", flag,
                                         terminal_text(text.substr(0, 80))),
              "write e.g. 400T (400 x 10^12 FLOP/s) or 2.5e10");
  return *v;
}

CommPrediction predict_comm(const RunConfig& config, int64_t nnodes, int64_t per_node,
                            const Link& inter, const Link& intra, double device_flops_per_s) {
  CommPrediction p;
  p.nnodes = nnodes;
  p.per_node = per_node;
  p.inter = inter;
  p.intra = intra;
  p.device_flops_per_s = device_flops_per_s;
  const Shape s = shape_of(config, device_flops_per_s, p.forward_s, p.backward_s);
  const Ring ring{nnodes * per_node, ring_link(nnodes, inter, intra)};
  const bool scatter = config.grad_reduce == GradReduce::kReduceScatter &&
                       !reduce_scatter_copies_input(torch::Device(config.device), ring.world);
  for (Shard mode : {Shard::kDdp, Shard::kZero1, Shard::kZero2, Shard::kFsdp})
    if (shard_refusal(mode, config.optimizer).empty())
      p.modes.push_back(predict_mode(s, mode, ring, config.bucket_bytes,
                                     config.log_grad_norm || config.clip_grad_norm > 0,
                                     scatter && mode == Shard::kFsdp));
  return p;
}

nlohmann::json comm_prediction_to_json(const CommPrediction& p) {
  nlohmann::json modes = nlohmann::json::array();
  for (const auto& m : p.modes)
    modes.push_back({{"shard", m.shard},
                     {"bytes_per_step", m.bytes_per_step},
                     {"collectives", m.collectives},
                     {"comm_s", m.comm_s},
                     {"exposed_s", m.exposed_s},
                     {"hidden_s", m.hidden_s},
                     {"step_s", m.step_s}});
  return {{"nnodes", p.nnodes},
          {"nproc_per_node", p.per_node},
          {"link", {{"bytes_per_s", p.inter.bytes_per_s}, {"latency_s", p.inter.latency_s}}},
          {"intra_link", {{"bytes_per_s", p.intra.bytes_per_s}, {"latency_s", p.intra.latency_s}}},
          {"device_flops_per_s", p.device_flops_per_s},
          {"forward_s", p.forward_s},
          {"backward_s", p.backward_s},
          {"modes", modes}};
}

}  // namespace gradscope
