// What a sweep keeps beside its runs: the lock on its database, the names of each attempt's
// log and result files, the result file read back, and the record of an attempt that ended
// without one of its own.
#include "gradscope/sweep/runner.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"

namespace gradscope {

namespace fs = std::filesystem;

RunRecord failure_record(const PlannedRun& run, const std::string& sweep, RunStatus status,
                         const std::string& message, const std::string& log,
                         const std::string& started_at, double elapsed_s, int64_t threads) {
  RunRecord r;
  r.run_id = run.run_id;
  r.attempt_uid = new_attempt_uid();
  r.sweep = sweep;
  r.config = run.resolved.config;
  if (threads > 0) r.config.threads = static_cast<int>(threads);
  r.arch = run.resolved.arch;
  r.status = status;
  r.failure = RunFailure{std::nullopt, std::nullopt, message};
  RunTime time;
  time.wall_s = elapsed_s;
  r.time = time;
  r.log = log;
  r.started_at = started_at;
  r.finished_at = utc_now_iso8601();
  return r;
}

std::optional<RunRecord> read_result_file(const std::string& path, std::string* why) {
  const auto refuse = [why](const std::string& reason) -> std::optional<RunRecord> {
    if (why) *why = reason;
    return std::nullopt;
  };
  try {
    const std::string text = read_input_file(path, "result file", kMaxRecordBytes);
    std::optional<nlohmann::json> j = try_parse_json(text, why);
    if (!j) return std::nullopt;
    // A parser keeps one of two equal keys: a record with a repeated key is ambiguous.
    const std::string repeated = repeated_key_problem(text);
    if (!repeated.empty()) return refuse(repeated);
    RunRecord record = record_from_json(*j);
    if (record.attempt_uid.empty()) return refuse("it has no attempt_uid");
    return record;
  } catch (const Error& e) {
    return refuse(e.what());
  } catch (const std::exception& e) {  // a record that breaks an assumption of the reader
    return refuse(std::string("it does not follow the run record: ") + e.what());
  }
}

SweepLock::SweepLock(const std::string& db_path) {
  // Beside the file the path resolves to, so that two spellings of one database (a
  // symbolic link, a relative path) take one lock. Not through a link at the lock's own
  // name: the holder's note is written into the file.
  std::error_code ec;
  const fs::path real = fs::weakly_canonical(db_path, ec);
  const std::string path = (ec ? fs::path(db_path) : real).string() + ".sweep-lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd_ < 0)
    fail_usage(fmt::format("cannot open the sweep lock {}: {}", path, std::strerror(errno)),
               "the database's folder must be writable");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (error != EWOULDBLOCK)
      fail_usage(fmt::format("cannot lock {}: {}", path, std::strerror(error)),
                 "the database's file system must support flock");
    fail_usage(fmt::format("another sweep is running on {}{}", db_path,
                           who.empty() ? "" : " (" + who + ")"),
               "one sweep at a time per database, and a sweep's runs hold its lock until they "
               "end (a killed sweep's runs save their state and stop): wait for them, or pass "
               "another --db (`gradscope sweep --dry-run` shows the plan meanwhile)");
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  const std::string holder =
      fmt::format("pid {} on {}, since {}\n", getpid(), host, utc_now_iso8601());
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t written = ::pwrite(fd_, holder.data(), holder.size(), 0);
    (void)written;  // the note is for people; the lock is what counts
  }
}

SweepLock::~SweepLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

SelfExecutable::SelfExecutable() { fd_ = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC); }

SelfExecutable::~SelfExecutable() {
  if (fd_ >= 0) ::close(fd_);
}

std::string free_attempt_stem(const std::string& log_dir, const std::string& run_id, int& counter) {
  while (true) {
    const std::string stem = fmt::format("{}-{}", run_id, ++counter);
    std::error_code ec;
    if (fs::exists(fs::path(log_dir) / (stem + ".json"), ec)) continue;
    // The log is claimed by creating it, so that two sweeps sharing a log folder (on two
    // databases) never take one name; the child's output is then written into it.
    const std::string log = (fs::path(log_dir) / (stem + ".log")).string();
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return stem;
    }
    if (errno != EEXIST)
      fail_runtime(fmt::format("cannot write the run log {}: {}", log, std::strerror(errno)),
                   "check that the log folder is writable");
  }
}

}  // namespace gradscope
