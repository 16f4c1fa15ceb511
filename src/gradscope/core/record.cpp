#include "gradscope/core/record.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/plain_text.h"
#include "gradscope/core/settings.h"

namespace gradscope {
namespace {

using json = nlohmann::json;

constexpr std::pair<RunStatus, const char*> kStatuses[] = {
    {RunStatus::kStatusOk, "ok"},
    {RunStatus::kStatusOom, "oom"},
    {RunStatus::kStatusDiverged, "diverged"},
    {RunStatus::kStatusTimeout, "timeout"},
    {RunStatus::kStatusError, "error"},
    {RunStatus::kStatusCrashed, "crashed"},
    {RunStatus::kStatusInterrupted, "interrupted"}};

template <typename T>
json or_null(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

// Reads one object of a record, naming the path of a bad field in its errors. A missing key
// and null read as "not there"; a value of another type is an error.
// Ids name rows and travel into reports and file listings: plain characters only.
bool is_record_id(const std::string& id) { return is_plain_name(id, 128); }

// The first characters of a refused value, with anything unprintable as '?', for a message.
std::string printable_prefix(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 40; ++i)
    out += text[i] >= 0x20 && text[i] < 0x7f ? text[i] : '?';
  return text.size() > 40 ? out + "..." : out;
}

// Entries keyed by their "step" (steps, evaluations) must not repeat one.
template <typename Entry>
void check_unique_steps(const std::vector<Entry>& entries, const char* key) {
  std::set<int64_t> seen;
  for (const Entry& e : entries)
    check_usage(seen.insert(e.step).second,
                fmt::format("run record field {} lists step {} twice", key, e.step),
                "the record does not follow docs/record.md");
}

class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) fail("an object", j_);
  }

  bool has(const char* key) const {
    const auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  const json& at(const char* key) const { return j_.at(key); }
  Reader object(const char* key) const { return Reader(j_.at(key), name(key)); }

  std::optional<double> number(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_.at(key);
    if (!v.is_number()) fail(key, "a number", v);
    return v.get<double>();
  }
  std::optional<int64_t> integer(const char* key) const {
    if (!has(key)) return std::nullopt;
    return integer_of(j_.at(key), name(key));
  }
  // An integer that must be there (a step's number: rows are keyed by it).
  int64_t required_integer(const char* key) const {
    if (!has(key)) fail_at(name(key), "an integer", j_.value(key, json(nullptr)));
    return integer_of(j_.at(key), name(key));
  }
  std::optional<std::string> text(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_.at(key);
    if (!v.is_string()) fail(key, "text", v);
    return v.get<std::string>();
  }
  std::optional<bool> boolean(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail(key, "true or false", v);
    return v.get<bool>();
  }
  // An array's elements, each read by `read(element, "path[i]")`.
  template <typename T, typename F>
  std::vector<T> array(const char* key, F read) const {
    std::vector<T> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    if (!v.is_array()) fail(key, "an array", v);
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(read(v[i], fmt::format("{}[{}]", name(key), i)));
    return out;
  }

  std::string name(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  static int64_t integer_of(const json& v, const std::string& path) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18)
        return static_cast<int64_t>(d);
    }
    fail_at(path, "an integer", v);
  }
  [[noreturn]] static void fail_at(const std::string& path, const char* expected, const json& v) {
    fail_usage(
        fmt::format("run record field {} is {}, expected {}", path, json_preview(v), expected),
        "the record does not follow docs/record.md");
  }

 private:
  [[noreturn]] void fail(const char* expected, const json& v) const {
    fail_at(path_.empty() ? "(the record)" : path_, expected, v);
  }
  [[noreturn]] void fail(const char* key, const char* expected, const json& v) const {
    fail_at(name(key), expected, v);
  }

  const json& j_;
  std::string path_;
};

// ---- parts: to JSON ----

json step_to_json(const StepEntry& s) {
  json j = {{"step", s.step},
            {"loss", or_null(s.loss)},
            {"lr", s.lr},
            {"grad_norm", or_null(s.grad_norm)},
            {"time_s", s.time_s},
            {"samples", s.samples},
            {"tokens", s.tokens},
            {"targets", s.targets},
            {"evaluations", s.evaluations},
            {"warmup", s.warmup}};
  if (s.energy_j) j["energy_j"] = *s.energy_j;  // timed steps only
  const StepContention& c = s.contention;  // timed steps only, each where it was read
  if (c.involuntary_switches) j["involuntary_switches"] = *c.involuntary_switches;
  if (c.steal_s) j["steal_s"] = *c.steal_s;
  if (c.competing_tasks) j["competing_tasks"] = *c.competing_tasks;
  return j;
}

json contention_to_json(const RunContention& c) {
  return {{"window", "timed steps"},
          {"steps", c.steps},
          {"threads", c.threads},
          {"cpus", c.cpus},
          {"timed_s", c.timed_s},
          {"involuntary_switches", or_null(c.involuntary_switches)},
          {"involuntary_switches_per_s", or_null(c.involuntary_switches_per_s)},
          {"steal_s", or_null(c.steal_s)},
          {"steal_pct", or_null(c.steal_pct)},
          {"competing_tasks_mean", or_null(c.competing_tasks_mean)},
          {"competing_tasks_max", or_null(c.competing_tasks_max)},
          {"excess_tasks_mean", or_null(c.excess_tasks_mean)},
          {"disturbed", c.disturbed},
          {"reasons", c.reasons}};
}

json memory_to_json(const RunMemory& m) {
  json timeline = json::array();
  for (const StepMemory& s : m.timeline) {
    json phases = json::array();
    for (const PhaseMemory& p : s.phases)
      phases.push_back({p.phase, p.entry_bytes, p.peak_bytes, p.exit_bytes});
    timeline.push_back({{"step", s.step}, {"phases", phases}});
  }
  const MemoryBreakdown& b = m.breakdown;
  json j = {
      {"peak_bytes", m.peak_bytes},
      {"breakdown",
       {{"params", b.params},
        {"frozen_params", b.frozen_params},
        {"grads", or_null(b.grads)},
        {"optimizer_state", b.optimizer_state},
        {"activations", or_null(b.activations)},
        {"logits", or_null(b.logits)},
        {"other", b.other}}},
      {"timeline", timeline},
      {"params_bytes", m.params_bytes},
      {"frozen_params_bytes", m.frozen_params_bytes},
      {"grads_bytes", or_null(m.grads_bytes)},
      {"optimizer_state_bytes", m.optimizer_state_bytes},
      {"activations_peak_bytes", or_null(m.activations_peak_bytes)},
      {"logits_bytes", or_null(m.logits_bytes)},
      {"phase_peak_bytes", m.phase_peak_bytes ? json{{"data", m.phase_peak_bytes->data},
                                                     {"forward", m.phase_peak_bytes->forward},
                                                     {"backward", m.phase_peak_bytes->backward},
                                                     {"optimizer", m.phase_peak_bytes->optimizer}}
                                              : json(nullptr)},
      {"reserved_peak_bytes", or_null(m.reserved_peak_bytes)},
      {"peak_rss_bytes", or_null(m.peak_rss_bytes)}};
  // Written when known (with phase timing), so that older records read back as they were.
  if (b.collective_buffers) j["breakdown"]["collective_buffers"] = *b.collective_buffers;
  if (m.phase_peak_bytes && m.phase_peak_bytes->comm)
    j["phase_peak_bytes"]["communication"] = *m.phase_peak_bytes->comm;
  if (m.peak_phase) j["peak_phase"] = *m.peak_phase;
  if (m.peak_step) j["peak_step"] = *m.peak_step;
  return j;
}

json sample_to_json(const TimelineSample& s) {
  return {{"t_s", s.t_s},
          {"allocated_bytes", or_null(s.allocated_bytes)},
          {"util_pct", or_null(s.util_pct)},
          {"cpu_util_pct", or_null(s.cpu_util_pct)},
          {"rss_bytes", or_null(s.rss_bytes)},
          {"gpu_util_pct", or_null(s.gpu_util_pct)},
          {"gpu_memory_used_bytes", or_null(s.gpu_memory_used_bytes)},
          {"power_w", or_null(s.power_w)},
          {"sm_clock_mhz", or_null(s.sm_clock_mhz)},
          {"energy_j", or_null(s.energy_j)}};
}

// ---- parts: from JSON ----

StepEntry step_from_json(const json& j, const std::string& path) {
  const Reader r(j, path);
  StepEntry s;
  s.step = r.required_integer("step");
  s.loss = r.number("loss");
  s.lr = r.number("lr").value_or(0);
  s.grad_norm = r.number("grad_norm");
  s.time_s = r.number("time_s").value_or(0);
  s.samples = r.integer("samples").value_or(0);
  s.tokens = r.integer("tokens").value_or(0);
  s.targets = r.integer("targets").value_or(0);
  s.evaluations = r.integer("evaluations").value_or(1);
  s.warmup = r.boolean("warmup").value_or(false);
  s.energy_j = r.number("energy_j");
  s.contention.involuntary_switches = r.integer("involuntary_switches");
  s.contention.steal_s = r.number("steal_s");
  s.contention.competing_tasks = r.number("competing_tasks");
  return s;
}

RunContention contention_from_json(const Reader& r) {
  RunContention c;
  c.steps = r.integer("steps").value_or(0);
  c.threads = r.integer("threads").value_or(0);
  c.cpus = r.integer("cpus").value_or(0);
  c.timed_s = r.number("timed_s").value_or(0);
  c.involuntary_switches = r.integer("involuntary_switches");
  c.involuntary_switches_per_s = r.number("involuntary_switches_per_s");
  c.steal_s = r.number("steal_s");
  c.steal_pct = r.number("steal_pct");
  c.competing_tasks_mean = r.number("competing_tasks_mean");
  c.competing_tasks_max = r.number("competing_tasks_max");
  c.excess_tasks_mean = r.number("excess_tasks_mean");
  c.disturbed = r.boolean("disturbed").value_or(false);
  c.reasons = r.array<std::string>("reasons", [](const json& v, const std::string& path) {
    if (!v.is_string()) Reader::fail_at(path, "text", v);
    return v.get<std::string>();
  });
  return c;
}

EvalEntry eval_from_json(const json& j, const std::string& path) {
  const Reader r(j, path);
  EvalEntry e;
  e.step = r.required_integer("step");
  e.val_loss = r.number("val_loss");
  e.accuracy = r.number("accuracy");
  return e;
}

json breakdown_to_json(const MemoryBreakdown& b) {
  json j = {{"params", b.params},
            {"frozen_params", b.frozen_params},
            {"grads", or_null(b.grads)},
            {"optimizer_state", b.optimizer_state},
            {"activations", or_null(b.activations)},
            {"logits", or_null(b.logits)},
            {"other", b.other}};
  if (b.collective_buffers) j["collective_buffers"] = *b.collective_buffers;
  return j;
}

MemoryBreakdown breakdown_from_json(const Reader& b) {
  MemoryBreakdown m;
  m.params = b.integer("params").value_or(0);
  m.frozen_params = b.integer("frozen_params").value_or(0);
  m.grads = b.integer("grads");
  m.optimizer_state = b.integer("optimizer_state").value_or(0);
  m.activations = b.integer("activations");
  m.logits = b.integer("logits");
  m.other = b.integer("other").value_or(0);
  m.collective_buffers = b.integer("collective_buffers");
  return m;
}

RunTime time_from_json(const Reader& r) {
  RunTime t;
  t.total_s = r.number("total_s");
  t.wall_s = r.number("wall_s");
  t.step_median_s = r.number("step_median_s");
  t.data_s = r.number("data_s");
  t.forward_s = r.number("forward_s");
  t.backward_s = r.number("backward_s");
  t.optimizer_s = r.number("optimizer_s");
  t.comm_s = r.number("comm_s");
  t.timed_steps = r.integer("timed_steps");
  return t;
}

RunMemory memory_from_json(const Reader& r) {
  RunMemory m;
  m.peak_bytes = r.integer("peak_bytes").value_or(0);
  if (r.has("breakdown")) {
    const Reader b = r.object("breakdown");
    m.breakdown.params = b.integer("params").value_or(0);
    m.breakdown.frozen_params = b.integer("frozen_params").value_or(0);
    m.breakdown.grads = b.integer("grads");
    m.breakdown.optimizer_state = b.integer("optimizer_state").value_or(0);
    m.breakdown.activations = b.integer("activations");
    m.breakdown.logits = b.integer("logits");
    m.breakdown.other = b.integer("other").value_or(0);
    m.breakdown.collective_buffers = b.integer("collective_buffers");
  }
  m.timeline = r.array<StepMemory>("timeline", [](const json& j, const std::string& path) {
    const Reader s(j, path);
    StepMemory step;
    step.step = s.integer("step").value_or(0);
    step.phases = s.array<PhaseMemory>("phases", [](const json& p, const std::string& at) {
      if (!p.is_array() || p.size() != 4 || !p[0].is_string())
        Reader::fail_at(at, "[phase, entry, peak, exit]", p);
      return PhaseMemory{p[0].get<std::string>(), Reader::integer_of(p[1], at + "[1]"),
                         Reader::integer_of(p[2], at + "[2]"),
                         Reader::integer_of(p[3], at + "[3]")};
    });
    return step;
  });
  m.params_bytes = r.integer("params_bytes").value_or(0);
  m.frozen_params_bytes = r.integer("frozen_params_bytes").value_or(0);
  m.grads_bytes = r.integer("grads_bytes");
  m.optimizer_state_bytes = r.integer("optimizer_state_bytes").value_or(0);
  m.activations_peak_bytes = r.integer("activations_peak_bytes");
  m.logits_bytes = r.integer("logits_bytes");
  if (r.has("phase_peak_bytes")) {
    const Reader p = r.object("phase_peak_bytes");
    m.phase_peak_bytes = PhasePeaks{p.integer("data").value_or(0), p.integer("forward").value_or(0),
                                    p.integer("backward").value_or(0),
                                    p.integer("optimizer").value_or(0), p.integer("communication")};
  }
  m.reserved_peak_bytes = r.integer("reserved_peak_bytes");
  m.peak_rss_bytes = r.integer("peak_rss_bytes");
  m.peak_phase = r.text("peak_phase");
  m.peak_step = r.integer("peak_step");
  return m;
}

TimelineSample sample_from_json(const json& j, const std::string& path) {
  const Reader r(j, path);
  TimelineSample s;
  s.t_s = r.number("t_s").value_or(0);
  s.allocated_bytes = r.integer("allocated_bytes");
  s.util_pct = r.number("util_pct");
  s.cpu_util_pct = r.number("cpu_util_pct");
  s.rss_bytes = r.integer("rss_bytes");
  s.gpu_util_pct = r.number("gpu_util_pct");
  s.gpu_memory_used_bytes = r.integer("gpu_memory_used_bytes");
  s.power_w = r.number("power_w");
  s.sm_clock_mhz = r.number("sm_clock_mhz");
  s.energy_j = r.number("energy_j");
  return s;
}

std::vector<double> doubles(const Reader& r, const char* key) {
  std::vector<double> out;
  if (!r.has(key)) return out;
  const json& v = r.at(key);
  if (!v.is_array()) Reader::fail_at(r.name(key), "an array of numbers", v);
  for (const json& x : v) {
    if (!x.is_number()) Reader::fail_at(r.name(key), "an array of numbers", v);
    out.push_back(x.get<double>());
  }
  return out;
}

}  // namespace

json rank_figures_to_json(const RankFigures& f) {
  return {{"rank", f.rank},
          {"peak_bytes", f.peak_bytes},
          {"breakdown", breakdown_to_json(f.breakdown)},
          {"peak_phase", or_null(f.peak_phase)},
          {"params_bytes", f.params_bytes},
          {"grads_bytes", or_null(f.grads_bytes)},
          {"optimizer_state_bytes", f.optimizer_state_bytes},
          {"collective_buffer_peak_bytes", f.collective_buffer_peak_bytes},
          {"step_median_s", or_null(f.step_median_s)},
          {"comm_s", or_null(f.comm_s)},
          {"backward_s", or_null(f.backward_s)},
          {"bytes_sent_per_step", or_null(f.bytes_sent_per_step)},
          {"overlapped_share", or_null(f.overlapped_share)}};
}

RankFigures rank_figures_from_json(const json& j, const std::string& path) {
  const Reader f(j, path);
  RankFigures x;
  x.rank = f.integer("rank").value_or(0);
  x.peak_bytes = f.integer("peak_bytes").value_or(0);
  if (f.has("breakdown")) x.breakdown = breakdown_from_json(f.object("breakdown"));
  x.peak_phase = f.text("peak_phase");
  x.params_bytes = f.integer("params_bytes").value_or(0);
  x.grads_bytes = f.integer("grads_bytes");
  x.optimizer_state_bytes = f.integer("optimizer_state_bytes").value_or(0);
  x.collective_buffer_peak_bytes = f.integer("collective_buffer_peak_bytes").value_or(0);
  x.step_median_s = f.number("step_median_s");
  x.comm_s = f.number("comm_s");
  x.backward_s = f.number("backward_s");
  x.bytes_sent_per_step = f.number("bytes_sent_per_step");
  x.overlapped_share = f.number("overlapped_share");
  return x;
}

namespace {

json distributed_to_json(const RunDistributed& d) {
  json ranks = json::array();
  for (const RankFigures& f : d.ranks) ranks.push_back(rank_figures_to_json(f));
  return {{"world", d.world},
          {"shard", d.shard},
          {"launcher", d.launcher},
          {"backend", d.backend},
          {"flat_params", d.flat_params},
          {"shard_params", d.shard_params},
          {"ranks", ranks}};
}

RunDistributed distributed_from_json(const Reader& r) {
  RunDistributed d;
  d.world = r.integer("world").value_or(1);
  d.shard = r.text("shard").value_or("");
  d.launcher = r.text("launcher").value_or("");
  d.backend = r.text("backend").value_or("");
  d.flat_params = r.integer("flat_params").value_or(0);
  d.shard_params = r.integer("shard_params").value_or(0);
  d.ranks = r.array<RankFigures>("ranks", [](const json& j, const std::string& path) {
    return rank_figures_from_json(j, path);
  });
  return d;
}

}  // namespace

const char* status_name(RunStatus s) {
  for (const auto& [v, name] : kStatuses)
    if (v == s) return name;
  return "?";
}

std::optional<RunStatus> parse_status(const std::string& name) {
  for (const auto& [v, text] : kStatuses)
    if (name == text) return v;
  return std::nullopt;
}

bool is_final_status(RunStatus s) {
  return s == RunStatus::kStatusOk || s == RunStatus::kStatusOom || s == RunStatus::kStatusDiverged;
}

std::optional<double> finite_or_null(double v) {
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

json record_to_json(const RunRecord& r) {
  json j;
  j["schema"] = kRunSchema;
  j["run_id"] = r.run_id;
  if (!r.attempt_uid.empty()) j["attempt_uid"] = r.attempt_uid;
  j["sweep"] = or_null(r.sweep);
  j["config"] = config_to_json(r.config);
  j["config"]["arch"] = r.arch;
  j["status"] = status_name(r.status);
  j["failure"] = r.failure ? json{{"step", or_null(r.failure->step)},
                                  {"phase", or_null(r.failure->phase)},
                                  {"message", r.failure->message}}
                           : json(nullptr);
  j["params"] = or_null(r.params);
  j["trainable_params"] = or_null(r.trainable_params);
  j["data"] = r.data;
  json steps = json::array();
  for (const StepEntry& s : r.steps) steps.push_back(step_to_json(s));
  j["steps"] = steps;
  json evals = json::array();
  for (const EvalEntry& e : r.evals)
    evals.push_back(
        {{"step", e.step}, {"val_loss", or_null(e.val_loss)}, {"accuracy", or_null(e.accuracy)}});
  j["eval"] = evals;
  j["final_loss"] = or_null(r.final_loss);
  j["final_val_loss"] = or_null(r.final_val_loss);
  j["final_accuracy"] = or_null(r.final_accuracy);
  if (r.lr_search) {
    json trials = json::array();
    for (const LrTrial& t : *r.lr_search)
      trials.push_back({{"lr", t.lr},
                        {"steps", t.steps},
                        {"final_loss", or_null(t.final_loss)},
                        {"val_loss", or_null(t.val_loss)},
                        {"status", t.status},
                        {"time_s", or_null(t.time_s)}});
    j["lr_search"] = trials;
  } else {
    j["lr_search"] = nullptr;
  }
  // Only in a resumed run's record: the shape of every other record stays as it was.
  if (!r.resumed_from_steps.empty()) j["resumed_from_steps"] = r.resumed_from_steps;
  if (r.toy) {
    j["final_params"] = r.toy->final_params;
    j["known_minimum"] = {
        {"loss", r.toy->min_loss}, {"params", r.toy->min_params}, {"distance", r.toy->distance}};
  }
  j["estimate"] = r.estimate;
  j["update_rule"] = or_null(r.update_rule);
  j["time"] = r.time ? json{{"total_s", or_null(r.time->total_s)},
                            {"wall_s", or_null(r.time->wall_s)},
                            {"step_median_s", or_null(r.time->step_median_s)},
                            {"data_s", or_null(r.time->data_s)},
                            {"forward_s", or_null(r.time->forward_s)},
                            {"backward_s", or_null(r.time->backward_s)},
                            {"optimizer_s", or_null(r.time->optimizer_s)},
                            {"timed_steps", or_null(r.time->timed_steps)}}
                     : json(nullptr);
  if (r.time && r.time->comm_s) j["time"]["comm_s"] = *r.time->comm_s;
  j["throughput"] = r.throughput ? json{{"samples_per_s", or_null(r.throughput->samples_per_s)},
                                        {"tokens_per_s", or_null(r.throughput->tokens_per_s)}}
                                 : json(nullptr);
  j["memory"] = r.memory ? memory_to_json(*r.memory) : json(nullptr);
  if (r.distributed) j["distributed"] = distributed_to_json(*r.distributed);
  j["utilization"] = r.utilization ? json{{"device", r.utilization->device},
                                          {"mean_pct", or_null(r.utilization->mean_pct)},
                                          {"p50_pct", or_null(r.utilization->p50_pct)},
                                          {"p95_pct", or_null(r.utilization->p95_pct)},
                                          {"samples", r.utilization->samples},
                                          {"source", r.utilization->source}}
                                   : json(nullptr);
  // Only when measured, so that older records read back as they were.
  if (r.contention) j["contention"] = contention_to_json(*r.contention);
  json timeline = json::array();
  for (const TimelineSample& s : r.timeline) timeline.push_back(sample_to_json(s));
  j["timeline"] = timeline;
  j["energy"] = r.energy ? json{{"joules", or_null(r.energy->joules)},
                                {"source", or_null(r.energy->source)},
                                {"co2_g", or_null(r.energy->co2_g)},
                                {"detail", or_null(r.energy->detail)}}
                         : json(nullptr);
  j["sampler"] = r.sampler ? json{{"period_s", r.sampler->period_s},
                                  {"samples", r.sampler->samples},
                                  {"busy_s", r.sampler->busy_s},
                                  {"gpu", r.sampler->gpu},
                                  {"rapl", r.sampler->rapl}}
                           : json(nullptr);
  j["flops"] = r.flops ? json{{"per_step", r.flops->per_step},
                              {"hardware_per_step", r.flops->hardware_per_step},
                              {"achieved_per_s", or_null(r.flops->achieved_per_s)},
                              {"mfu", or_null(r.flops->mfu)},
                              {"hfu", or_null(r.flops->hfu)},
                              {"peak_per_s", or_null(r.flops->peak_per_s)},
                              {"peak_source", or_null(r.flops->peak_source)},
                              {"formula", r.flops->formula}}
                       : json(nullptr);
  j["env"] = r.env ? json{{"gradscope", r.env->gradscope},
                          {"libtorch", r.env->libtorch},
                          {"cuda", or_null(r.env->cuda)},
                          {"device_name", r.env->device_name},
                          {"threads", r.env->threads},
                          {"blas_threads", r.env->blas_threads},
                          {"git_commit", r.env->git_commit},
                          {"host", r.env->host},
                          {"build", r.env->build}}
                   : json(nullptr);
  j["started_at"] = r.started_at.empty() ? json(nullptr) : json(r.started_at);
  j["finished_at"] = r.finished_at.empty() ? json(nullptr) : json(r.finished_at);
  if (r.log) j["log"] = *r.log;
  return j;
}

namespace {

// A UTC time as gradscope writes it, YYYY-MM-DDTHH:MM:SSZ, or "" where the record has none:
// attempts are ordered by comparing these as text, which only this one format makes right.
std::string timestamp(const Reader& r, const char* key) {
  const std::string text = r.text(key).value_or("");
  static const char* const kShape = "dddd-dd-ddTdd:dd:ddZ";
  bool ok = text.empty() || text.size() == std::strlen(kShape);
  for (size_t i = 0; ok && i < text.size(); ++i)
    ok = kShape[i] == 'd' ? std::isdigit(static_cast<unsigned char>(text[i])) != 0
                          : text[i] == kShape[i];
  check_usage(ok,
              fmt::format("run record field {} is '{}', not a UTC time such as "
                          "2026-01-31T12:00:00Z",
                          key, printable_prefix(text)),
              "the record does not follow docs/record.md");
  return text;
}

}  // namespace

RunRecord record_from_json(const json& j) {
  const Reader r(j, "");
  RunRecord out;
  const auto schema = r.text("schema");
  check_usage(
      schema && (*schema == kRunSchema || *schema == kRunSchemaV1),
      fmt::format("not a gradscope run record: schema is {}",
                  schema ? "'" + *schema + "'" : std::string("missing")),
      fmt::format("a run record has \"schema\": \"{}\" (or \"{}\")", kRunSchema, kRunSchemaV1));
  out.schema = *schema;
  const auto run_id = r.text("run_id");
  check_usage(run_id && !run_id->empty(), "run record has no run_id",
              "the record does not follow docs/record.md");
  check_usage(is_record_id(*run_id),
              fmt::format("run record has the run_id '{}'", printable_prefix(*run_id)),
              "a run_id is 1 to 128 letters, digits, '.', '_' or '-'");
  out.run_id = *run_id;
  out.attempt_uid = r.text("attempt_uid").value_or("");
  check_usage(out.attempt_uid.empty() || is_record_id(out.attempt_uid),
              fmt::format("run record {} has the attempt_uid '{}'", out.run_id,
                          printable_prefix(out.attempt_uid)),
              "an attempt_uid is 1 to 128 letters, digits, '.', '_' or '-'");
  out.sweep = r.text("sweep");
  if (out.sweep && out.sweep->empty()) out.sweep.reset();
  check_usage(!out.sweep || is_label_text(*out.sweep, kMaxSweepLabel),
              fmt::format("run record {} has the sweep name '{}'", out.run_id,
                          printable_prefix(out.sweep.value_or(""))),
              fmt::format("a sweep name is at most {} bytes of UTF-8 without control characters",
                          kMaxSweepLabel));
  check_usage(r.has("config"), "run record " + out.run_id + " has no config",
              "the record does not follow docs/record.md");
  out.config = config_from_json(r.at("config"));
  out.arch = r.at("config").value("arch", json(nullptr));
  const auto status_text = r.text("status");
  const auto status = status_text ? parse_status(*status_text) : std::nullopt;
  check_usage(status.has_value(),
              fmt::format("run record {} has status {}", out.run_id,
                          status_text ? "'" + *status_text + "'" : std::string("missing")),
              "statuses: ok, oom, diverged, timeout, error, crashed, interrupted");
  out.status = *status;
  if (r.has("failure")) {
    const Reader f = r.object("failure");
    out.failure = RunFailure{f.integer("step"), f.text("phase"), f.text("message").value_or("")};
  }
  out.params = r.integer("params");
  out.trainable_params = r.integer("trainable_params");
  out.data = j.value("data", json(nullptr));
  out.steps = r.array<StepEntry>("steps", step_from_json);
  out.evals = r.array<EvalEntry>("eval", eval_from_json);
  // Rows are keyed by their step: one entry per step.
  check_unique_steps(out.steps, "steps");
  check_unique_steps(out.evals, "eval");
  out.final_loss = r.number("final_loss");
  out.final_val_loss = r.number("final_val_loss");
  out.final_accuracy = r.number("final_accuracy");
  if (r.has("lr_search"))
    out.lr_search = r.array<LrTrial>("lr_search", [](const json& t, const std::string& path) {
      const Reader tr(t, path);
      return LrTrial{tr.number("lr").value_or(0),    tr.integer("steps").value_or(0),
                     tr.number("final_loss"),        tr.number("val_loss"),
                     tr.text("status").value_or(""), tr.number("time_s")};
    });
  if (r.has("resumed_from_steps")) {
    const json& v = r.at("resumed_from_steps");
    if (!v.is_array()) Reader::fail_at(r.name("resumed_from_steps"), "an array of steps", v);
    for (const json& x : v) {
      if (!x.is_number_integer())
        Reader::fail_at(r.name("resumed_from_steps"), "an array of steps", v);
      out.resumed_from_steps.push_back(x.get<int64_t>());
    }
  }
  if (r.has("known_minimum")) {
    const Reader k = r.object("known_minimum");
    ToyResult toy;
    toy.final_params = doubles(r, "final_params");
    toy.min_loss = k.number("loss").value_or(0);
    toy.min_params = doubles(k, "params");
    toy.distance = k.number("distance").value_or(0);
    out.toy = toy;
  }
  out.estimate = j.value("estimate", json(nullptr));
  out.update_rule = r.text("update_rule");
  if (r.has("time")) out.time = time_from_json(r.object("time"));
  if (r.has("throughput")) {
    const Reader t = r.object("throughput");
    out.throughput = RunThroughput{t.number("samples_per_s"), t.number("tokens_per_s")};
  }
  if (r.has("memory")) out.memory = memory_from_json(r.object("memory"));
  if (r.has("distributed")) out.distributed = distributed_from_json(r.object("distributed"));
  if (r.has("utilization")) {
    const Reader u = r.object("utilization");
    out.utilization = RunUtilization{u.text("device").value_or(""),
                                     u.number("mean_pct"),
                                     u.number("p50_pct"),
                                     u.number("p95_pct"),
                                     u.integer("samples").value_or(0),
                                     u.text("source").value_or("")};
  }
  if (r.has("contention")) out.contention = contention_from_json(r.object("contention"));
  out.timeline = r.array<TimelineSample>("timeline", sample_from_json);
  if (r.has("energy")) {
    const Reader e = r.object("energy");
    out.energy =
        RunEnergy{e.number("joules"), e.text("source"), e.number("co2_g"), e.text("detail")};
  }
  if (r.has("sampler")) {
    const Reader s = r.object("sampler");
    out.sampler = SamplerInfo{s.number("period_s").value_or(0), s.integer("samples").value_or(0),
                              s.number("busy_s").value_or(0), s.text("gpu").value_or(""),
                              s.text("rapl").value_or("")};
  }
  if (r.has("flops")) {
    const Reader f = r.object("flops");
    RunFlops flops;
    flops.per_step = f.number("per_step").value_or(0);
    flops.hardware_per_step = f.number("hardware_per_step").value_or(flops.per_step);
    flops.achieved_per_s = f.number("achieved_per_s");
    flops.mfu = f.number("mfu");
    flops.hfu = f.number("hfu");
    flops.peak_per_s = f.number("peak_per_s");
    flops.peak_source = f.text("peak_source");
    flops.formula = f.text("formula").value_or("");
    out.flops = flops;
  }
  if (r.has("env")) {
    const Reader e = r.object("env");
    RunEnv env;
    env.gradscope = e.text("gradscope").value_or("");
    env.libtorch = e.text("libtorch").value_or("");
    env.cuda = e.text("cuda");
    env.device_name = e.text("device_name").value_or("");
    env.threads = static_cast<int>(e.integer("threads").value_or(0));
    env.blas_threads = static_cast<int>(e.integer("blas_threads").value_or(0));
    env.git_commit = e.text("git_commit").value_or("");
    env.host = e.text("host").value_or("");
    env.build = e.text("build").value_or("");
    out.env = env;
  }
  out.started_at = timestamp(r, "started_at");
  out.finished_at = timestamp(r, "finished_at");
  out.log = r.text("log");
  // A version-1 record the sweep wrote for a run that ended without its own put the
  // attempt's elapsed time in time.total_s (and measured no step): in version 2 that is wall_s.
  if (out.schema == kRunSchemaV1 && out.log && out.time && out.steps.empty() && !out.time->wall_s &&
      !out.time->timed_steps) {
    out.time->wall_s = out.time->total_s;
    out.time->total_s.reset();
  }
  return out;
}

}  // namespace gradscope
