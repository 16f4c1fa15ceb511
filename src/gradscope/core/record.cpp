#include "gradscope/core/record.h"

#include <cctype>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/plain_text.h"
#include "gradscope/core/record_fields.h"
#include "gradscope/core/settings.h"

namespace gradscope {

using record_fields::Fields;
using record_fields::Loader;
using record_fields::Reader;
using record_fields::Writer;

namespace {

using json = nlohmann::json;

constexpr std::pair<RunStatus, const char*> kStatuses[] = {
    {RunStatus::kOk, "ok"},
    {RunStatus::kOom, "oom"},
    {RunStatus::kDiverged, "diverged"},
    {RunStatus::kTimeout, "timeout"},
    {RunStatus::kError, "error"},
    {RunStatus::kCrashed, "crashed"},
    {RunStatus::kInterrupted, "interrupted"}};

constexpr const char* kNotARecord = "the record does not follow docs/record.md";

// Ids name rows and travel into reports and file listings: plain characters only.
bool is_record_id(const std::string& id) { return is_plain_name(id, 128); }

// The first characters of a refused value, with anything unprintable as '?', for a message.
std::string printable_prefix(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 40; ++i)
    out += text[i] >= 0x20 && text[i] < 0x7f ? text[i] : '?';
  return text.size() > 40 ? out + "..." : out;
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

// The record's identity (schema, run_id, attempt_uid, sweep), each checked.
void read_identity(const Reader& r, RunRecord& out) {
  const auto schema = r.text("schema");
  check_usage(
      schema && (*schema == kRunSchema || *schema == kRunSchemaV1),
      fmt::format("not a gradscope run record: schema is {}",
                  schema ? "'" + *schema + "'" : std::string("missing")),
      fmt::format("a run record has \"schema\": \"{}\" (or \"{}\")", kRunSchema, kRunSchemaV1));
  out.schema = *schema;
  const auto run_id = r.text("run_id");
  check_usage(run_id && !run_id->empty(), "run record has no run_id", kNotARecord);
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
}

}  // namespace

namespace record_fields {

// Attempts are ordered by comparing these as text, which only this one format makes right.
std::string read_timestamp(const Reader& r, const char* key) {
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
              kNotARecord);
  return text;
}

void Loader::step_list(const char* key, std::vector<int64_t>& steps) {
  if (!r_.has(key)) return;
  const json& v = r_.at(key);
  if (!v.is_array()) Reader::fail_at(r_.name(key), "an array of steps", v);
  for (const json& x : v) {
    if (!x.is_number_integer()) Reader::fail_at(r_.name(key), "an array of steps", v);
    steps.push_back(x.get<int64_t>());
  }
}

void Loader::toy(std::optional<ToyResult>& toy) {
  if (!r_.has("known_minimum")) return;
  const Reader k = r_.object("known_minimum");
  ToyResult t;
  t.final_params = doubles(r_, "final_params");
  t.min_loss = k.number("loss").value_or(0);
  t.min_params = doubles(k, "params");
  t.distance = k.number("distance").value_or(0);
  toy = t;
}

}  // namespace record_fields

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
  return s == RunStatus::kOk || s == RunStatus::kOom || s == RunStatus::kDiverged;
}

std::optional<double> finite_or_null(double v) {
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

json rank_figures_to_json(const RankFigures& f) { return Writer::value(f); }

RankFigures rank_figures_from_json(const json& j, const std::string& path) {
  return Loader::element<RankFigures>(j, path);
}

json record_to_json(const RunRecord& r) {
  json j;
  j["schema"] = kRunSchema;
  j["run_id"] = r.run_id;
  if (!r.attempt_uid.empty()) j["attempt_uid"] = r.attempt_uid;
  j["sweep"] = Writer::value(r.sweep);
  j["config"] = config_to_json(r.config);
  j["config"]["arch"] = r.arch;
  j["status"] = status_name(r.status);
  Writer w(j);
  Fields<RunRecord>::visit(w, r);
  return j;
}

namespace {

// A record's failure.memory is read as typed; what it says must also hold together: sizes
// within what a run writes, no negative bytes, a cheapest method that fits and was tried.
void check_failure_memory(const FailureMemory& m, const std::string& run_id) {
  const auto refuse = [&](const std::string& what) {
    fail_usage(fmt::format("run record {}: failure.memory {}", run_id, what), kNotARecord);
  };
  constexpr size_t kMostTried = 256, kMostFlags = 32;
  const auto non_negative = [&](const std::optional<int64_t>& v, const char* key) {
    if (v && *v < 0) refuse(fmt::format("has a negative {}", key));
  };
  non_negative(m.cap_bytes, "cap_bytes");
  non_negative(m.live_bytes, "live_bytes");
  non_negative(m.live_rest_bytes, "live_rest_bytes");
  non_negative(m.reserved_peak_bytes, "reserved_peak_bytes");
  if (m.live.size() > kFailureLiveLabels) refuse("lists more labels than a run keeps");
  if (m.live_by_component.size() > 16) refuse("lists more components than there are");
  for (const auto* list : {&m.live, &m.live_by_component})
    for (const MemoryLabelBytes& l : *list)
      if (l.bytes < 0) refuse("has a label with negative bytes");
  if (!m.fit) return;
  const MemoryFit& f = *m.fit;
  if (f.cap_bytes < 0 || f.estimated_peak_bytes < 0 || f.max_batch < 0)
    refuse("fit has a negative figure");
  if (f.tried.size() > kMostTried) refuse("fit lists more methods than gradscope has");
  for (const MemoryMethodFit& t : f.tried)
    if (t.flags.size() > kMostFlags || t.estimated_peak_bytes < 0)
      refuse("fit has a method with too many flags or a negative peak");
  if (f.cheapest && (!f.cheapest->fits || f.cheapest->estimated_peak_bytes > f.cap_bytes))
    refuse("fit names as cheapest a method that does not fit");
}

}  // namespace

RunRecord record_from_json(const json& j) {
  const Reader r(j, "");
  RunRecord out;
  read_identity(r, out);
  check_usage(r.has("config"), "run record " + out.run_id + " has no config", kNotARecord);
  out.config = config_from_json(r.at("config"));
  out.arch = r.at("config").value("arch", json(nullptr));
  const auto status_text = r.text("status");
  const auto status = status_text ? parse_status(*status_text) : std::nullopt;
  check_usage(status.has_value(),
              fmt::format("run record {} has status {}", out.run_id,
                          status_text ? "'" + *status_text + "'" : std::string("missing")),
              "statuses: ok, oom, diverged, timeout, error, crashed, interrupted");
  out.status = *status;
  Loader loader(r);
  Fields<RunRecord>::visit(loader, out);
  if (out.failure && out.failure->memory) check_failure_memory(*out.failure->memory, out.run_id);
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
