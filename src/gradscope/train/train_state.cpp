#include "gradscope/train/train_state.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/settings.h"
#include "gradscope/strategy/rng_state.h"

namespace gradscope {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kStateJson = "state.json";
constexpr const char* kModelFile = "model.pt";
constexpr const char* kOptimizerFile = "optimizer.pt";
constexpr const char* kGeneratorsFile = "generators.pt";

// The folder a --save-state or --resume path names, without a trailing '/'.
fs::path state_path(const std::string& dir) {
  fs::path p = fs::absolute(fs::path(dir)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

// A save writes into ".NAME.saving-XXXXXX" beside the state; replace_folder (core/files.h)
// may leave the previous state aside as ".NAME.old-XXXXXX" (kAsideTag).
constexpr const char* kSavingTag = ".saving-";

void fsync_path(const fs::path& path, bool folder) {
  const int fd = ::open(path.c_str(), (folder ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    fail_runtime(
        fmt::format("cannot flush {} to the disk: {}", path.string(), std::strerror(error)),
        "check the file system and its free space");
  }
  ::close(fd);
}

// Writes an archive to `path` through a writer that keeps its errors (CheckedFileWriter): the
// archive's own file writer throws from its destructor on a full disk, which would end the
// process. The file is flushed to the disk; a runtime error naming it when any write failed.
void save_archive(torch::serialize::OutputArchive& archive, const fs::path& path) {
  CheckedFileWriter file(path.string());
  archive.save_to([&file](const void* data, size_t size) { return file.write(data, size); });
  file.finish();
}

// A double as JSON, NaN and infinities as null (JSON has none), and back.
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
double number_of(const json& v) {
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}
json numbers(const std::vector<double>& v) {
  json out = json::array();
  for (double x : v) out.push_back(number(x));
  return out;
}
std::vector<double> numbers_of(const json& v) {
  std::vector<double> out;
  for (const json& x : v) out.push_back(number_of(x));
  return out;
}

Phase phase_of(const std::string& name) {
  for (int p = 0; p < static_cast<int>(Phase::kCount); ++p)
    if (name == phase_name(static_cast<Phase>(p))) return static_cast<Phase>(p);
  fail_usage("the training state names an unknown phase '" + name + "'",
             "the state was written by another version of gradscope");
}

// What a state keeps of the run record, each part at its place in state.json (a JSON pointer)
// and in the record: the record's own mapping (record_to_json, record_from_json) writes and
// reads them, so that they come back as a record written at the end would hold them.
struct CarriedPart {
  const char* state;
  const char* record;
};
constexpr CarriedPart kCarriedParts[] = {{"/tally/steps", "/steps"},
                                         {"/tally/eval", "/eval"},
                                         {"/tally/timeline", "/timeline"},
                                         {"/tally/memory_timeline", "/memory/timeline"},
                                         {"/lr_search", "/lr_search"}};

// The record that carries those parts of `p`, and back.
RunRecord carrier_of(const TrainProgress& p, const std::string& run_id) {
  RunRecord r;
  r.run_id = run_id;
  r.steps = p.tally.steps;
  r.evals = p.tally.evals;
  r.timeline = p.tally.timeline;
  r.memory = RunMemory{};
  r.memory->timeline = p.tally.memory_timeline;
  r.lr_search = p.lr_search;
  return r;
}
void take_carried(RunRecord&& r, TrainProgress& p) {
  p.tally.steps = std::move(r.steps);
  p.tally.evals = std::move(r.evals);
  p.tally.timeline = std::move(r.timeline);
  if (r.memory) p.tally.memory_timeline = std::move(r.memory->timeline);
  p.lr_search = std::move(r.lr_search);
}

// The loop's tally and the timer's peaks, and the record's parts above.
json progress_to_json(const TrainProgress& p, const std::string& run_id) {
  const json r = record_to_json(carrier_of(p, run_id));
  const RunTally& t = p.tally;
  json tally = {{"step_times", numbers(t.step_times)},
                {"step_utils", numbers(t.step_utils)},
                {"step_cpus", numbers(t.step_cpus)},
                {"phase_totals", numbers({t.phase_totals.begin(), t.phase_totals.end()})},
                {"timed_s", number(t.timed_s)},
                {"timed_samples", number(t.timed_samples)},
                {"timed_tokens", number(t.timed_tokens)},
                {"timed_evaluations", t.timed_evaluations},
                {"tokens_per_step", t.tokens_per_step},
                {"state_bytes", t.state_bytes},
                {"training_peak_bytes", t.training_peak_bytes},
                {"logits_bytes", t.logits_bytes ? json(*t.logits_bytes) : json(nullptr)}};
  const PhaseTimer::Carried& c = p.timer;
  json moment = nullptr;
  if (c.peak_moment) {
    const PeakMoment& m = *c.peak_moment;
    moment = {{"step", m.step},
              {"phase", phase_name(m.phase)},
              {"peak_bytes", m.peak_bytes},
              {"forward_start_bytes", m.forward_start_bytes},
              {"grads_exist", m.grads_exist},
              {"state_exists", m.state_exists}};
  }
  json timer = {{"phase_peak", std::vector<int64_t>(c.phase_peak.begin(), c.phase_peak.end())},
                {"activations_peak", c.activations_peak},
                {"peak_moment", moment},
                {"steps", c.steps},
                {"optimizer_done", c.optimizer_done}};
  json state = {{"wall_s", p.wall_s},
                {"timed_elapsed_s", p.timed_elapsed_s ? json(*p.timed_elapsed_s) : json(nullptr)},
                {"resumed_from_steps", p.resumed_from_steps},
                {"tally", tally},
                {"timer", timer}};
  for (const CarriedPart& part : kCarriedParts)
    state[json::json_pointer(part.state)] = r.at(json::json_pointer(part.record));
  return state;
}

TrainProgress progress_from_json(const json& state) {
  TrainProgress p;
  p.step = state.at("step").get<int64_t>();
  p.wall_s = state.at("wall_s").get<double>();
  if (state.at("timed_elapsed_s").is_number())
    p.timed_elapsed_s = state.at("timed_elapsed_s").get<double>();
  p.resumed_from_steps = state.at("resumed_from_steps").get<std::vector<int64_t>>();
  const json& t = state.at("tally");
  // The record's own reader for what its mapping wrote.
  json carrier = {{"schema", kRunSchema},
                  {"run_id", state.at("run_id")},
                  {"config", state.at("config")},
                  {"status", "ok"}};
  for (const CarriedPart& part : kCarriedParts)
    carrier[json::json_pointer(part.record)] = state.at(json::json_pointer(part.state));
  take_carried(record_from_json(carrier), p);
  RunTally& tally = p.tally;
  tally.step_times = numbers_of(t.at("step_times"));
  tally.step_utils = numbers_of(t.at("step_utils"));
  tally.step_cpus = numbers_of(t.at("step_cpus"));
  const std::vector<double> phases = numbers_of(t.at("phase_totals"));
  for (size_t i = 0; i < phases.size() && i < tally.phase_totals.size(); ++i)
    tally.phase_totals[i] = phases[i];
  tally.timed_s = number_of(t.at("timed_s"));
  tally.timed_samples = number_of(t.at("timed_samples"));
  tally.timed_tokens = number_of(t.at("timed_tokens"));
  tally.timed_evaluations = t.at("timed_evaluations").get<int64_t>();
  tally.tokens_per_step = t.at("tokens_per_step").get<int64_t>();
  tally.state_bytes = t.at("state_bytes").get<int64_t>();
  tally.training_peak_bytes = t.at("training_peak_bytes").get<int64_t>();
  if (t.at("logits_bytes").is_number()) tally.logits_bytes = t.at("logits_bytes").get<int64_t>();

  const json& c = state.at("timer");
  const auto peaks = c.at("phase_peak").get<std::vector<int64_t>>();
  for (size_t i = 0; i < peaks.size() && i < p.timer.phase_peak.size(); ++i)
    p.timer.phase_peak[i] = peaks[i];
  p.timer.activations_peak = c.at("activations_peak").get<int64_t>();
  if (const json& m = c.at("peak_moment"); m.is_object()) {
    PeakMoment at;
    at.step = m.at("step").get<int64_t>();
    at.phase = phase_of(m.at("phase").get<std::string>());
    at.peak_bytes = m.at("peak_bytes").get<int64_t>();
    at.forward_start_bytes = m.at("forward_start_bytes").get<int64_t>();
    at.grads_exist = m.at("grads_exist").get<bool>();
    at.state_exists = m.at("state_exists").get<bool>();
    p.timer.peak_moment = at;
  }
  p.timer.steps = c.at("steps").get<int64_t>();
  p.timer.optimizer_done = c.at("optimizer_done").get<bool>();
  return p;
}

// The model's parameters and buffers by name, in the model's order.
std::vector<std::pair<std::string, torch::Tensor>> named_weights(Model& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters(true)) out.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers(true))
    out.emplace_back("buffer:" + item.key(), item.value());
  return out;
}

std::string weight_key(size_t i) { return "w" + std::to_string(i); }

json read_state_json(const fs::path& dir) {
  const std::string text =
      read_input_file((dir / kStateJson).string(), "training state", kMaxRecordBytes);
  json j = parse_json_input_unique(text, (dir / kStateJson).string(),
                            "the folder holds a damaged training state: start the run afresh");
  check_usage(
      j.is_object() && j.value("schema", "") == kTrainStateSchema,
      fmt::format("{} is not a gradscope training state (schema {})", (dir / kStateJson).string(),
                  j.is_object() ? json_preview(j.value("schema", json(nullptr))) : "?"),
      fmt::format("a state written by --save-state has \"schema\": \"{}\"", kTrainStateSchema));
  return j;
}

// The step a state.json names, -1 when it cannot be read.
int64_t step_of_state(const fs::path& folder) {
  try {
    const json j = read_state_json(folder);
    const json& step = j.at("step");
    return step.is_number_integer() ? step.get<int64_t>() : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

// The folder that holds the state `dir` names: `dir` itself, or, when a save on a file system
// without RENAME_EXCHANGE was killed between its two renames, the previous state it had moved
// aside (of the highest step, when several are there); empty when there is none.
fs::path find_state_folder(const std::string& dir) {
  const fs::path target = state_path(dir);
  std::error_code ec;
  if (fs::exists(target / kStateJson, ec)) return target;
  fs::path best;
  int64_t best_step = -1;
  for (const fs::path& aside : sibling_folders(target, kAsideTag)) {
    if (!fs::exists(aside / kStateJson, ec)) continue;
    const int64_t step = step_of_state(aside);
    if (best.empty() || step > best_step) {
      best = aside;
      best_step = step;
    }
  }
  return best;
}

fs::path state_folder_of(const std::string& dir) {
  const fs::path target = state_path(dir);
  const fs::path found = find_state_folder(dir);
  if (!found.empty()) return found;
  fail_usage(fmt::format("--resume {}: no training state there ({} is missing)", dir,
                         (target / kStateJson).string()),
             "pass the folder a run wrote with --save-state (it keeps state.json, model.pt, "
             "optimizer.pt and generators.pt)");
}

// The record keys of two configurations whose values differ, as "--flag A (state) / B (now)".
std::vector<std::string> config_differences(const json& saved, const json& now) {
  std::vector<std::string> out;
  std::vector<std::string> keys;
  for (const auto& [k, v] : saved.items()) keys.push_back(k);
  for (const auto& [k, v] : now.items())
    if (!saved.contains(k)) keys.push_back(k);
  for (const std::string& key : keys) {
    const json a = saved.value(key, json(nullptr)), b = now.value(key, json(nullptr));
    if (a == b) continue;
    std::string name = key;
    for (const Setting& s : run_settings())
      if (s.key == key) name = s.flag();
    out.push_back(
        fmt::format("{} is {} in the state and {} now", name, json_preview(a), json_preview(b)));
  }
  return out;
}

}  // namespace

std::string train_state_build() {
  const EnvInfo env = current_env("cpu");
  return fmt::format("gradscope {} (commit {}), LibTorch {}", env.gradscope_version,
                     env.git_commit.empty() ? "unknown" : env.git_commit, env.libtorch);
}

std::string find_train_state(const std::string& dir) {
  if (dir.empty()) return "";
  return find_state_folder(dir).string();
}

std::string rank_state_folder(const std::string& dir, int64_t nproc, int64_t rank) {
  if (nproc <= 1) return dir;
  return (fs::path(dir) / ("rank-" + std::to_string(rank))).string();
}

std::optional<TrainStateInfo> resumable_state(const std::string& dir, int64_t nproc,
                                              const std::string& run_id, std::string* why) {
  std::optional<TrainStateInfo> first;
  why->clear();
  for (int64_t r = 0; r < std::max<int64_t>(1, nproc); ++r) {
    const std::string part = rank_state_folder(dir, nproc, r);
    if (find_train_state(part).empty()) {
      if (r > 0) *why = fmt::format("rank {} has no state", r);
      return std::nullopt;
    }
    try {
      TrainStateInfo info = read_train_state_info(part);
      check_state_build(info);
      if (!run_id.empty() && info.run_id != run_id) {
        *why = fmt::format("the state is of run {}, not {}", info.run_id, run_id);
        return std::nullopt;
      }
      if (first && first->step != info.step) {
        *why = fmt::format("rank {} is at step {}, rank 0 at step {}", r, info.step, first->step);
        return std::nullopt;
      }
      if (!first) first = std::move(info);
    } catch (const Error& e) {
      *why = e.what();
      return std::nullopt;
    }
  }
  return first;
}

bool remove_train_state(const std::string& dir) {
  if (dir.empty()) return true;
  const fs::path target = state_path(dir);
  bool removed = true;
  std::error_code ec;
  fs::remove_all(target, ec);
  removed = removed && !ec;
  for (const char* tag : {kSavingTag, kAsideTag})
    for (const fs::path& leftover : sibling_folders(target, tag)) {
      fs::remove_all(leftover, ec);
      removed = removed && !ec;
    }
  return removed;
}

void check_state_folder(const std::string& dir, const std::string& resume) {
  check_usage(!dir.empty(), "--save-state needs a folder", "e.g. --save-state runs/state");
  const fs::path target = state_path(dir);
  const fs::path parent = target.parent_path();
  std::error_code ec;
  check_usage(fs::is_directory(parent, ec),
              fmt::format("--save-state {}: folder {} does not exist", dir, parent.string()),
              "create it, or choose another folder");
  check_usage(::access(parent.c_str(), W_OK) == 0,
              fmt::format("--save-state {}: folder {} is not writable", dir, parent.string()),
              "a save writes a sibling folder and renames it: choose a writable place");
  // A state there (or one a save left aside) is kept for --resume: a fresh run would
  // overwrite it.
  if (!find_state_folder(dir).empty())
    check_usage(
        !resume.empty() && state_path(resume) == target,
        fmt::format("--save-state {}: the folder holds a training state{}, which this run "
                    "would overwrite",
                    dir, resume.empty() ? "" : " and --resume names another folder"),
        fmt::format("add --resume {} to continue it, or remove the folder to start afresh", dir));
  if (!fs::exists(target, ec)) return;
  check_usage(fs::is_directory(target, ec) && !fs::is_symlink(target, ec),
              fmt::format("--save-state {}: {} is not a folder", dir, target.string()),
              "pass a new or empty folder, or one a run wrote with --save-state");
  const bool empty = fs::is_empty(target, ec);
  check_usage(
      empty || fs::exists(target / kStateJson, ec),
      fmt::format("--save-state {}: the folder holds files that are not a training state", dir),
      "a save replaces the whole folder: pass a new or empty folder");
}

void save_train_state(const std::string& dir, Session& session, const TrainProgress& progress) {
  const fs::path target = state_path(dir);
  std::error_code ec;
  // What a save killed part-way left behind (the previous state is whole beside it).
  for (const fs::path& stale : sibling_folders(target, kSavingTag)) fs::remove_all(stale, ec);
  // Sharded parameters (--shard fsdp) are gathered whole for the save, by every rank, before
  // anything that can fail on one rank alone; each takes its share back however the save ends.
  session.updater()->gather_parameters();
  struct Scatter {
    Updater& updater;
    ~Scatter() { updater.scatter_parameters(); }
  } scatter{*session.updater()};
  const fs::path fresh = make_sibling_folder(target, kSavingTag);
  try {
    {
      torch::serialize::OutputArchive model;
      size_t i = 0;
      for (const auto& [name, tensor] : named_weights(session.model()))
        model.write(weight_key(i++), tensor.detach().cpu(), /*is_buffer=*/true);
      // The archive refers to the parameters' storage, which stays until the save ends.
      save_archive(model, fresh / kModelFile);
    }
    {
      torch::serialize::OutputArchive optimizer;
      session.updater()->save(optimizer);
      save_archive(optimizer, fresh / kOptimizerFile);
    }
    {
      const RngState rng = RngState::capture(session.device());
      torch::serialize::OutputArchive generators;
      generators.write("cpu", rng.cpu, /*is_buffer=*/true);
      if (rng.cuda.defined()) generators.write("cuda", rng.cuda, /*is_buffer=*/true);
      save_archive(generators, fresh / kGeneratorsFile);
    }
    const ResolvedRun& run = session.resolved();
    json state = progress_to_json(progress, run.run_id);
    state["schema"] = kTrainStateSchema;
    state["run_id"] = run.run_id;
    state["config"] = config_to_json(run.given);
    state["device"] = run.config.device;
    state["step"] = progress.step;
    state["total_steps"] = run.config.warmup_steps + run.config.steps;
    state["lr"] = session.lr();
    state["build"] = train_state_build();
    std::vector<std::string> names;
    for (const auto& [name, tensor] : named_weights(session.model())) names.push_back(name);
    state["weights"] = names;
    state["saved_at"] = utc_now_iso8601();
    // Written last, and flushed with its folder: a folder with state.json is complete.
    write_file_atomically((fresh / kStateJson).string(), state.dump() + "\n");
    fsync_path(fresh, true);
    replace_folder(fresh, target);
    // Older states a save left aside (the new one is whole in `target` now).
    for (const fs::path& aside : sibling_folders(target, kAsideTag)) fs::remove_all(aside, ec);
  } catch (const std::exception& e) {
    fs::remove_all(fresh, ec);
    const Error* error = dynamic_cast<const Error*>(&e);
    fail_runtime(fmt::format("cannot save the training state in {}: {}", dir, e.what()),
                 error && !error->hint().empty() ? error->hint()
                                                 : "check the file system and its free space");
  }
}

TrainStateInfo read_train_state_info(const std::string& dir) {
  const fs::path folder = state_folder_of(dir);
  const json j = read_state_json(folder);
  TrainStateInfo info;
  info.dir = folder.string();
  try {
    info.run_id = j.at("run_id").get<std::string>();
    info.config = j.at("config");
    info.device = j.at("device").get<std::string>();
    info.step = j.at("step").get<int64_t>();
    info.total_steps = j.at("total_steps").get<int64_t>();
    info.lr = j.at("lr").get<double>();
    info.build = j.value("build", "");
  } catch (const json::exception& e) {
    fail_usage(fmt::format("{} is not a whole training state: {}", (folder / kStateJson).string(),
                           e.what()),
               "start the run afresh without --resume");
  }
  check_usage(info.config.is_object() && info.step >= 0,
              fmt::format("{} is not a whole training state", (folder / kStateJson).string()),
              "start the run afresh without --resume");
  return info;
}

TrainProgress read_train_progress(const std::string& dir) {
  const fs::path folder = state_folder_of(dir);
  const json state = read_state_json(folder);
  try {
    return progress_from_json(state);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string message = e.what();
    fail_usage(fmt::format("{} is not a whole training state: {}", (folder / kStateJson).string(),
                           message.substr(0, message.find('\n'))),
               "start the run afresh without --resume");
  }
}

void check_state_build(const TrainStateInfo& info) {
  const std::string now = train_state_build();
  check_usage(info.build == now,
              fmt::format("--resume {}: the state was written by {}, and this is {}", info.dir,
                          info.build.empty() ? "an unnamed build" : info.build, now),
              "resume with the build that wrote the state (its optimizer and data code must be "
              "the same for the run to continue as it began), or start the run afresh without "
              "--resume");
}

void check_resumable(const TrainStateInfo& info, const ResolvedRun& run) {
  check_state_build(info);
  const std::vector<std::string> differences =
      config_differences(info.config, config_to_json(run.given));
  if (!differences.empty()) {
    std::string list;
    for (const auto& d : differences) list += (list.empty() ? "" : "; ") + d;
    fail_usage(fmt::format("--resume {}: the state is of other settings: {}", info.dir, list),
               "resume with the settings the state was saved with (its state.json lists them), "
               "or start the run afresh without --resume");
  }
  check_usage(info.run_id == run.run_id,
              fmt::format("--resume {}: the state is of run {}, and these settings are run {} "
                          "(the architecture resolves otherwise)",
                          info.dir, info.run_id, run.run_id),
              "resume with the gradscope version and files the state was saved with, or start "
              "the run afresh without --resume");
  const int64_t total = run.config.warmup_steps + run.config.steps;
  check_usage(info.step <= total,
              fmt::format("--resume {}: the state is at step {}, past the run's {} steps", info.dir,
                          info.step, total),
              "start the run afresh without --resume");
}

// Each archive of a state checked to be a regular file before LibTorch opens it (a FIFO would
// block the open forever).
void check_state_files(const fs::path& folder) {
  for (const char* name : {kModelFile, kOptimizerFile, kGeneratorsFile})
    check_input_file((folder / name).string(), "training state file");
}

TrainProgress load_train_state(const TrainStateInfo& info, Session& session) {
  const fs::path folder = info.dir;
  const json state = read_state_json(folder);
  check_state_files(folder);
  TrainProgress progress;
  try {
    progress = progress_from_json(state);
    const auto names = state.at("weights").get<std::vector<std::string>>();
    const auto weights = named_weights(session.model());
    check_usage(names.size() == weights.size(),
                fmt::format("--resume {}: the state holds {} weights, the model {}", info.dir,
                            names.size(), weights.size()),
                "start the run afresh without --resume");
    torch::serialize::InputArchive model;
    model.load_from((folder / kModelFile).string());
    torch::NoGradGuard no_grad;
    // Sharded parameters take the saved values whole, then each rank keeps its share.
    session.updater()->gather_parameters();
    for (size_t i = 0; i < weights.size(); ++i) {
      const auto& [name, tensor] = weights[i];
      check_usage(names[i] == name,
                  fmt::format("--resume {}: the state's weight {} is {}, the model's {}", info.dir,
                              i, names[i], name),
                  "start the run afresh without --resume");
      torch::Tensor saved;
      model.read(weight_key(i), saved, /*is_buffer=*/true);
      check_usage(saved.sizes() == tensor.sizes() && saved.scalar_type() == tensor.scalar_type(),
                  fmt::format("--resume {}: weight {} has another shape or type in the state",
                              info.dir, name),
                  "start the run afresh without --resume");
      torch::Tensor target = tensor;
      target.copy_(saved);
    }
    session.updater()->scatter_parameters();
    torch::serialize::InputArchive optimizer;
    optimizer.load_from((folder / kOptimizerFile).string(), session.device());
    session.updater()->load(optimizer);
    torch::serialize::InputArchive generators;
    generators.load_from((folder / kGeneratorsFile).string());
    RngState rng;
    generators.read("cpu", rng.cpu, /*is_buffer=*/true);
    if (session.device().is_cuda()) {
      generators.read("cuda", rng.cuda, /*is_buffer=*/true);
      rng.cuda_device = session.device();
    }
    rng.restore();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string message = e.what();
    fail_usage(fmt::format("--resume {}: cannot read the training state: {}", info.dir,
                           message.substr(0, message.find('\n'))),
               "the state is damaged or of another version: start the run afresh without "
               "--resume");
  }
  return progress;
}

std::vector<std::pair<std::string, torch::Tensor>> read_state_weights(const std::string& dir) {
  const fs::path folder = state_folder_of(dir);
  const json state = read_state_json(folder);
  const auto names = state.at("weights").get<std::vector<std::string>>();
  check_input_file((folder / kModelFile).string(), "training state file");
  torch::serialize::InputArchive model;
  model.load_from((folder / kModelFile).string());
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < names.size(); ++i) {
    torch::Tensor t;
    model.read(weight_key(i), t, /*is_buffer=*/true);
    out.emplace_back(names[i], t);
  }
  return out;
}

namespace {

// The signal that asked the run to stop: 0 none, -1 request_stop(). Written by the handler,
// read by the loop: a lock-free atomic is what a handler may set.
std::atomic<int> stop_flag{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler needs a lock-free flag");

void on_stop_signal(int signal_number) { stop_flag.store(signal_number); }

void install_stop_handler(int signal_number, bool once, struct sigaction* before) {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // `once`: a second signal of the kind ends the process as it would without the handler;
  // the last saved state stays whole whenever that happens.
  action.sa_flags = once ? SA_RESETHAND : 0;
  sigaction(signal_number, &action, before);
}


// How many StopSignals live (they are made on the main thread).
std::atomic<int> stop_signal_scopes{0};

sigset_t stop_signal_set() {
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  return stops;
}

}  // namespace

void block_stop_signals() {
  const sigset_t stops = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
}

StopSignals::StopSignals(Scope scope) : scope_(scope) {
  outermost_ = stop_signal_scopes.fetch_add(1) == 0;
  if (!outermost_) return;
  stop_flag.store(0);
  install_stop_handler(SIGTERM, /*once=*/false, &term_before_);
  install_stop_handler(SIGINT, /*once=*/true, &int_before_);
  // A command (and a rank started by gradscope run --nproc) begins with them blocked, so that
  // a stop sent while it starts waits for the handlers instead of killing it.
  const sigset_t stops = stop_signal_set();
  pthread_sigmask(SIG_UNBLOCK, &stops, nullptr);
}

StopSignals::~StopSignals() {
  stop_signal_scopes.fetch_sub(1);
  if (!outermost_ || scope_ == Scope::kUntilExit) return;
  sigaction(SIGTERM, &term_before_, nullptr);
  sigaction(SIGINT, &int_before_, nullptr);
}

bool stop_requested() { return stop_flag.load() != 0; }
int stop_signal() {
  const int sig = stop_flag.load();
  return sig > 0 ? sig : 0;
}
void request_stop() { stop_flag.store(-1); }
void clear_stop_request() { stop_flag.store(0); }

}  // namespace gradscope
