// The run record's JSON, described once. Each part of the record (core/record.h) has one
// Fields<T>::visit that names its keys in order, with the member each holds; a Writer visitor
// turns it into JSON, a Loader visitor reads it back, so the two directions cannot disagree.
// What is not a plain key (a key written only when set, a fallback for records written
// before a key existed, a memory phase as a four-element array) is a visitor method of its
// own. Internal to core/record*.cpp; everyone else uses record_to_json and record_from_json.
#pragma once

#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/record.h"

namespace gradscope::record_fields {

using json = nlohmann::json;

// Reads one object of a record, naming the path of a bad field in its errors. A missing key
// and null read as "not there"; a value of another type is an error.
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) fail_at(path_.empty() ? "(the record)" : path_, "an object", j_);
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
    if (!v.is_number()) fail_at(name(key), "a number", v);
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
    if (!v.is_string()) fail_at(name(key), "text", v);
    return v.get<std::string>();
  }
  std::optional<bool> boolean(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail_at(name(key), "true or false", v);
    return v.get<bool>();
  }
  // An array's elements, each read by `read(element, "path[i]")`.
  template <typename T, typename F>
  std::vector<T> array(const char* key, F read) const {
    std::vector<T> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    if (!v.is_array()) fail_at(name(key), "an array", v);
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
  const json& j_;
  std::string path_;
};

// The keys of each part, in the order they are read. `S` is the part, const when written.
template <typename T>
struct Fields;

template <>
struct Fields<StepContention> {  // a step's, in the step's own object; timed steps only
  template <typename V, typename S>
  static void visit(V& v, S& c) {
    v.if_set("involuntary_switches", c.involuntary_switches);
    v.if_set("steal_s", c.steal_s);
    v.if_set("competing_tasks", c.competing_tasks);
  }
};

template <>
struct Fields<StepEntry> {
  template <typename V, typename S>
  static void visit(V& v, S& s) {
    v.row_key("step", s.step);
    v("loss", s.loss);
    v("lr", s.lr);
    v("grad_norm", s.grad_norm);
    v("time_s", s.time_s);
    v("samples", s.samples);
    v("tokens", s.tokens);
    v("targets", s.targets);
    v("evaluations", s.evaluations);
    v("warmup", s.warmup);
    v.if_set("energy_j", s.energy_j);  // timed steps only
    Fields<StepContention>::visit(v, s.contention);
  }
};

template <>
struct Fields<EvalEntry> {
  template <typename V, typename S>
  static void visit(V& v, S& e) {
    v.row_key("step", e.step);
    v("val_loss", e.val_loss);
    v("accuracy", e.accuracy);
  }
};

template <>
struct Fields<MemoryMethodFit> {
  template <typename V, typename S>
  static void visit(V& v, S& m) {
    v("method", m.method);
    v("cost", m.cost);
    v("flags", m.flags);
    v("estimated_peak_bytes", m.estimated_peak_bytes);
    v("fits", m.fits);
    v.if_set("recompute_flops_per_step", m.recompute_flops_per_step);
  }
};

template <>
struct Fields<MemoryFit> {
  template <typename V, typename S>
  static void visit(V& v, S& f) {
    v("cap_bytes", f.cap_bytes);
    v("estimated_peak_bytes", f.estimated_peak_bytes);
    v("max_batch", f.max_batch);
    v("cheapest", f.cheapest);
    v("tried", f.tried);
  }
};

template <>
struct Fields<MemoryLabelBytes> {
  template <typename V, typename S>
  static void visit(V& v, S& l) {
    v("component", l.component);
    v("module", l.module);
    v("phase", l.phase);
    v("bytes", l.bytes);
  }
};

template <>
struct Fields<FailureMemory> {
  template <typename V, typename S>
  static void visit(V& v, S& m) {
    v("cap_bytes", m.cap_bytes);
    v("live_bytes", m.live_bytes);
    v("request", m.request);
    v("live", m.live);
    v("live_rest_bytes", m.live_rest_bytes);
    v("live_by_component", m.live_by_component);
    v("reserved_peak_bytes", m.reserved_peak_bytes);
    v("fit", m.fit);
  }
};

template <>
struct Fields<RunFailure> {
  template <typename V, typename S>
  static void visit(V& v, S& f) {
    v("step", f.step);
    v("phase", f.phase);
    v("message", f.message);
    // Only for an oom the run recorded itself: every other failure reads back as it was.
    v.if_set("memory", f.memory);
  }
};

template <>
struct Fields<LrTrial> {
  template <typename V, typename S>
  static void visit(V& v, S& t) {
    v("lr", t.lr);
    v("steps", t.steps);
    v("final_loss", t.final_loss);
    v("val_loss", t.val_loss);
    v("status", t.status);
    v("time_s", t.time_s);
  }
};

template <>
struct Fields<RunTime> {
  template <typename V, typename S>
  static void visit(V& v, S& t) {
    v("total_s", t.total_s);
    v("wall_s", t.wall_s);
    v("step_median_s", t.step_median_s);
    v("data_s", t.data_s);
    v("forward_s", t.forward_s);
    v("backward_s", t.backward_s);
    v("optimizer_s", t.optimizer_s);
    v.if_set("comm_s", t.comm_s);  // with --shard
    v("timed_steps", t.timed_steps);
  }
};

template <>
struct Fields<RunThroughput> {
  template <typename V, typename S>
  static void visit(V& v, S& t) {
    v("samples_per_s", t.samples_per_s);
    v("tokens_per_s", t.tokens_per_s);
  }
};

template <>
struct Fields<MemoryBreakdown> {
  template <typename V, typename S>
  static void visit(V& v, S& b) {
    v("params", b.params);
    v("frozen_params", b.frozen_params);
    v("grads", b.grads);
    v("optimizer_state", b.optimizer_state);
    v("activations", b.activations);
    v("logits", b.logits);
    v("other", b.other);
    // Written when known (with --shard), so that older records read back as they were.
    v.if_set("collective_buffers", b.collective_buffers);
  }
};

template <>
struct Fields<PhasePeaks> {
  template <typename V, typename S>
  static void visit(V& v, S& p) {
    v("data", p.data);
    v("forward", p.forward);
    v("backward", p.backward);
    v("optimizer", p.optimizer);
    v.if_set("communication", p.comm);
  }
};

template <>
struct Fields<StepMemory> {
  template <typename V, typename S>
  static void visit(V& v, S& s) {
    v("step", s.step);
    v("phases", s.phases);  // each [phase, entry, peak, exit]
  }
};

template <>
struct Fields<MemoryFigure> {
  template <typename V, typename S>
  static void visit(V& v, S& f) {
    v("figure", f.figure);
    v("counts", f.counts);
    v("bytes", f.bytes);
    v("over_live_bytes", f.over_live_bytes);
  }
};

template <>
struct Fields<MemoryWindow> {
  template <typename V, typename S>
  static void visit(V& v, S& w) {
    v("first_step", w.first_step);
    v("last_step", w.last_step);
    v("peak_bytes", w.peak_bytes);
  }
};

template <>
struct Fields<RunMemory> {
  template <typename V, typename S>
  static void visit(V& v, S& m) {
    v("peak_bytes", m.peak_bytes);
    v("breakdown", m.breakdown);
    v("timeline", m.timeline);
    v("params_bytes", m.params_bytes);
    v("frozen_params_bytes", m.frozen_params_bytes);
    v("grads_bytes", m.grads_bytes);
    v("optimizer_state_bytes", m.optimizer_state_bytes);
    v("activations_peak_bytes", m.activations_peak_bytes);
    v("logits_bytes", m.logits_bytes);
    v("phase_peak_bytes", m.phase_peak_bytes);
    v("reserved_peak_bytes", m.reserved_peak_bytes);
    v("peak_rss_bytes", m.peak_rss_bytes);
    v.if_set("peak_phase", m.peak_phase);  // with phase timing
    v.if_set("peak_step", m.peak_step);
    v.if_set("window", m.window);  // with a memory timeline
    v("figures", m.figures);  // absent in older records: none
  }
};

template <>
struct Fields<RankFigures> {
  template <typename V, typename S>
  static void visit(V& v, S& f) {
    v("rank", f.rank);
    v("peak_bytes", f.peak_bytes);
    v("breakdown", f.breakdown);
    v("peak_phase", f.peak_phase);
    v("params_bytes", f.params_bytes);
    v("grads_bytes", f.grads_bytes);
    v("optimizer_state_bytes", f.optimizer_state_bytes);
    v("collective_buffer_peak_bytes", f.collective_buffer_peak_bytes);
    v("step_median_s", f.step_median_s);
    v("comm_s", f.comm_s);
    v("backward_s", f.backward_s);
    v("bytes_sent_per_step", f.bytes_sent_per_step);
    v("comm_wait_per_step_s", f.comm_wait_per_step_s);
    v("overlapped_share", f.overlapped_share);
  }
};

template <>
struct Fields<RunLink> {
  template <typename V, typename S>
  static void visit(V& v, S& l) {
    v("probe_bytes", l.probe_bytes);
    v("repeats", l.repeats);
    v("best_s", l.best_s);
    v("bus_bytes_per_s", l.bus_bytes_per_s);
  }
};

template <>
struct Fields<RunDistributed> {
  template <typename V, typename S>
  static void visit(V& v, S& d) {
    v("world", d.world);
    v("shard", d.shard);
    v("launcher", d.launcher);
    v("backend", d.backend);
    v("flat_params", d.flat_params);
    v("shard_params", d.shard_params);
    v("ranks", d.ranks);
    v("nnodes", d.nnodes);
    v("hosts", d.hosts);
    v.if_set("interface", d.interface);
    v.if_set("link", d.link);
  }
};

template <>
struct Fields<RunUtilization> {
  template <typename V, typename S>
  static void visit(V& v, S& u) {
    v("device", u.device);
    v("mean_pct", u.mean_pct);
    v("p50_pct", u.p50_pct);
    v("p95_pct", u.p95_pct);
    v("samples", u.samples);
    v("source", u.source);
  }
};

template <>
struct Fields<RunContention> {
  template <typename V, typename S>
  static void visit(V& v, S& c) {
    v.constant("window", "timed steps");
    v("steps", c.steps);
    v("threads", c.threads);
    v("cpus", c.cpus);
    v("timed_s", c.timed_s);
    v("involuntary_switches", c.involuntary_switches);
    v("involuntary_switches_per_s", c.involuntary_switches_per_s);
    v("steal_s", c.steal_s);
    v("steal_pct", c.steal_pct);
    v("competing_tasks_mean", c.competing_tasks_mean);
    v("competing_tasks_max", c.competing_tasks_max);
    v("excess_tasks_mean", c.excess_tasks_mean);
    v("disturbed", c.disturbed);
    v("reasons", c.reasons);
  }
};

template <>
struct Fields<TimelineSample> {
  template <typename V, typename S>
  static void visit(V& v, S& s) {
    v("t_s", s.t_s);
    v("allocated_bytes", s.allocated_bytes);
    v("util_pct", s.util_pct);
    v("cpu_util_pct", s.cpu_util_pct);
    v("rss_bytes", s.rss_bytes);
    v("gpu_util_pct", s.gpu_util_pct);
    v("gpu_memory_used_bytes", s.gpu_memory_used_bytes);
    v("power_w", s.power_w);
    v("sm_clock_mhz", s.sm_clock_mhz);
    v("energy_j", s.energy_j);
  }
};

template <>
struct Fields<RunEnergy> {
  template <typename V, typename S>
  static void visit(V& v, S& e) {
    v("joules", e.joules);
    v("source", e.source);
    v("co2_g", e.co2_g);
    v("detail", e.detail);
  }
};

template <>
struct Fields<SamplerInfo> {
  template <typename V, typename S>
  static void visit(V& v, S& s) {
    v("period_s", s.period_s);
    v("samples", s.samples);
    v("busy_s", s.busy_s);
    v("gpu", s.gpu);
    v("rapl", s.rapl);
  }
};

template <>
struct Fields<RunFlops> {
  template <typename V, typename S>
  static void visit(V& v, S& f) {
    v("per_step", f.per_step);
    // Records written before hardware FLOPs were counted: the model's.
    v.or_else("hardware_per_step", f.hardware_per_step, f.per_step);
    v("achieved_per_s", f.achieved_per_s);
    v("mfu", f.mfu);
    v("hfu", f.hfu);
    v("peak_per_s", f.peak_per_s);
    v("peak_source", f.peak_source);
    v("formula", f.formula);
  }
};

template <>
struct Fields<RunEnv> {
  template <typename V, typename S>
  static void visit(V& v, S& e) {
    v("gradscope", e.gradscope);
    v("libtorch", e.libtorch);
    v("cuda", e.cuda);
    v("device_name", e.device_name);
    v("threads", e.threads);
    v("blas_threads", e.blas_threads);
    v("git_commit", e.git_commit);
    v("host", e.host);
    v("build", e.build);
  }
};

// The record's measured parts, after its identity, configuration and status (which
// record_from_json checks one by one).
template <>
struct Fields<RunRecord> {
  template <typename V, typename S>
  static void visit(V& v, S& r) {
    v("failure", r.failure);
    v("params", r.params);
    v("trainable_params", r.trainable_params);
    v("data", r.data);
    v("steps", r.steps);
    v("eval", r.evals);
    v("final_loss", r.final_loss);
    v("final_val_loss", r.final_val_loss);
    v("final_accuracy", r.final_accuracy);
    v("lr_search", r.lr_search);
    // Only in a resumed run's record: the shape of every other record stays as it was.
    v.step_list("resumed_from_steps", r.resumed_from_steps);
    v.toy(r.toy);  // final_params and known_minimum, toy problems only
    v("estimate", r.estimate);
    v("update_rule", r.update_rule);
    v("time", r.time);
    v("throughput", r.throughput);
    v("memory", r.memory);
    v.if_set("distributed", r.distributed);
    v("utilization", r.utilization);
    // Only when measured, so that older records read back as they were.
    v.if_set("contention", r.contention);
    v("timeline", r.timeline);
    v("energy", r.energy);
    v("sampler", r.sampler);
    v("flops", r.flops);
    v("env", r.env);
    v.timestamp("started_at", r.started_at);
    v.timestamp("finished_at", r.finished_at);
    v.if_set("log", r.log);  // the output of a run the sweep recorded
  }
};

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};
template <typename T>
constexpr bool kIsPlain = std::is_arithmetic_v<T> || std::is_same_v<T, std::string> ||
                          std::is_same_v<T, json>;

// ---- writing ----

class Writer {
 public:
  explicit Writer(json& out) : out_(out) {}

  template <typename T>
  void operator()(const char* key, const T& v) {
    out_[key] = value(v);
  }
  void row_key(const char* key, int64_t v) { out_[key] = v; }
  // A key written only when it has a value.
  template <typename T>
  void if_set(const char* key, const std::optional<T>& v) {
    if (v) out_[key] = value(*v);
  }
  template <typename T>
  void or_else(const char* key, const T& v, const T&) {
    out_[key] = v;
  }
  void constant(const char* key, const char* text) { out_[key] = text; }
  void step_list(const char* key, const std::vector<int64_t>& steps) {
    if (!steps.empty()) out_[key] = steps;
  }
  void toy(const std::optional<ToyResult>& toy) {
    if (!toy) return;
    out_["final_params"] = toy->final_params;
    out_["known_minimum"] = {
        {"loss", toy->min_loss}, {"params", toy->min_params}, {"distance", toy->distance}};
  }
  void timestamp(const char* key, const std::string& text) {
    out_[key] = text.empty() ? json(nullptr) : json(text);
  }

  template <typename T>
  static json value(const T& v) {
    if constexpr (IsOptional<T>::value) {
      return v ? value(*v) : json(nullptr);
    } else if constexpr (IsVector<T>::value) {
      json out = json::array();
      for (const auto& e : v) out.push_back(value(e));
      return out;
    } else if constexpr (std::is_same_v<T, PhaseMemory>) {
      return json::array({v.phase, v.entry_bytes, v.peak_bytes, v.exit_bytes});
    } else if constexpr (kIsPlain<T>) {
      return json(v);
    } else {
      json out = json::object();
      Writer w(out);
      Fields<T>::visit(w, v);
      return out;
    }
  }

 private:
  json& out_;
};

// ---- reading ----

// A UTC time as gradscope writes it, YYYY-MM-DDTHH:MM:SSZ, or "" where the record has none.
std::string read_timestamp(const Reader& r, const char* key);

class Loader {
 public:
  explicit Loader(Reader r) : r_(std::move(r)) {}

  template <typename T>
  void operator()(const char* key, T& v) {
    if constexpr (IsOptional<T>::value) {
      using Inner = typename T::value_type;
      if constexpr (kIsPlain<Inner>) {
        v = optional_value<Inner>(key);
      } else if (r_.has(key)) {
        Inner inner{};
        (*this)(key, inner);
        v = std::move(inner);
      }
    } else if constexpr (std::is_same_v<T, json>) {
      v = r_.has(key) ? r_.at(key) : json(nullptr);
    } else if constexpr (kIsPlain<T>) {
      if (const auto x = optional_value<T>(key)) v = *x;
    } else if constexpr (IsVector<T>::value) {
      using E = typename T::value_type;
      v = r_.array<E>(key, [](const json& j, const std::string& path) {
        return element<E>(j, path);
      });
      check_unique_steps(v, key);
    } else if (r_.has(key)) {
      Loader part(r_.object(key));
      Fields<T>::visit(part, v);
    }
  }
  // A step's number: rows are keyed by it, so it must be there.
  void row_key(const char* key, int64_t& v) { v = r_.required_integer(key); }
  template <typename T>
  void if_set(const char* key, T& v) {
    (*this)(key, v);
  }
  template <typename T>
  void or_else(const char* key, T& v, const T& otherwise) {
    v = otherwise;
    (*this)(key, v);
  }
  void constant(const char*, const char*) {}
  void step_list(const char* key, std::vector<int64_t>& steps);
  void toy(std::optional<ToyResult>& toy);
  void timestamp(const char* key, std::string& text) { text = read_timestamp(r_, key); }

  template <typename E>
  static E element(const json& j, const std::string& path) {
    if constexpr (std::is_same_v<E, std::string>) {
      if (!j.is_string()) Reader::fail_at(path, "text", j);
      return j.get<std::string>();
    } else if constexpr (std::is_same_v<E, PhaseMemory>) {
      if (!j.is_array() || j.size() != 4 || !j[0].is_string())
        Reader::fail_at(path, "[phase, entry, peak, exit]", j);
      return PhaseMemory{j[0].get<std::string>(), Reader::integer_of(j[1], path + "[1]"),
                         Reader::integer_of(j[2], path + "[2]"),
                         Reader::integer_of(j[3], path + "[3]")};
    } else {
      E e{};
      Loader part(Reader(j, path));
      Fields<E>::visit(part, e);
      return e;
    }
  }

 private:
  template <typename T>
  std::optional<T> optional_value(const char* key) const {
    if constexpr (std::is_same_v<T, double>) {
      return r_.number(key);
    } else if constexpr (std::is_same_v<T, bool>) {
      return r_.boolean(key);
    } else if constexpr (std::is_same_v<T, std::string>) {
      return r_.text(key);
    } else {
      const auto x = r_.integer(key);
      return x ? std::optional<T>(static_cast<T>(*x)) : std::nullopt;
    }
  }
  // Entries keyed by their "step" (steps, evaluations) must not repeat one.
  template <typename E>
  static void check_unique_steps(const std::vector<E>& entries, const char* key) {
    if constexpr (std::is_same_v<E, StepEntry> || std::is_same_v<E, EvalEntry>) {
      std::set<int64_t> seen;
      for (const E& e : entries)
        check_usage(seen.insert(e.step).second,
                    fmt::format("run record field {} lists step {} twice", key, e.step),
                    "the record does not follow docs/record.md");
    }
  }

  Reader r_;
};

}  // namespace gradscope::record_fields
