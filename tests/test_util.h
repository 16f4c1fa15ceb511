// Helpers shared by the tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gradscope/core/config.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/record.h"
#include "gradscope/store/db.h"

namespace gradscope::testing {

inline std::string fixture(const std::string& name) {
  return std::string(GRADSCOPE_FIXTURES) + "/" + name;
}

// True when scripts/fetch-data.sh has put `relative` under the data folder (`make test`
// fetches it; a bare `ctest` without the fetch skips the tests that need it).
inline bool have_data(const std::string& relative) {
  return std::filesystem::exists(std::filesystem::path(data_dir()) / relative);
}

// The tiny Llama on the committed State of the Union excerpt (sequences of 32 bytes), quiet:
// a run configuration that needs no fetched data. Tests set what they exercise on top.
inline RunConfig tiny_llama_config() {
  RunConfig c;
  c.model = "llama";
  c.preset = "tiny";
  c.seq_len = 32;
  c.eval_batches = 1;
  c.dataset = fixture("text/sotu-excerpt.txt");
  c.quiet = true;
  return c;
}

// A record as `gradscope run --json` leaves it (ok, loss 2.5), without training anything.
inline RunRecord result_record(const std::string& run_id) {
  RunRecord r;
  r.schema = kRunSchema;
  r.run_id = run_id;
  r.attempt_uid = new_attempt_uid();
  r.config = tiny_llama_config();
  r.status = RunStatus::kOk;
  r.final_loss = 2.5;
  r.started_at = "2026-01-01T00:00:00Z";
  return r;
}

// A fresh empty folder under the system temp folder, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "gradscope-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (tag + "-XXXXXX")).string();
    char* made = mkdtemp(pattern.data());
    path_ = made ? made : "";
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::filesystem::path fs_path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The whole contents of the file at `path` (empty when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// What a gradscope process left behind.
struct CommandResult {
  int code = -1;  // exit code, or 128 + signal
  std::string out;
  std::string err;
};

#ifdef GRADSCOPE_BINARY
// Runs `gradscope ARGS` (shell words) with optional environment assignments, capturing both
// streams.
inline CommandResult run_gradscope(const std::string& args, const std::string& env = "") {
  TempDir tmp("gradscope-cli");
  const std::string cmd = env + " " + GRADSCOPE_BINARY + " " + args + " >" + tmp.file("out") +
                          " 2>" + tmp.file("err") + " </dev/null";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(tmp.file("out"));
  r.err = slurp(tmp.file("err"));
  return r;
}

// Starts `gradscope ARGS` (shell words) in the background, its output going to `out`; returns
// its pid (the shell execs gradscope, so the pid is gradscope's own, for signals). `setup`, shell
// commands run first (a ulimit, a trap), ends in ';'.
inline pid_t start_gradscope(const std::string& args, const std::string& out,
                             const std::string& setup = "") {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd = setup + " exec " + GRADSCOPE_BINARY + " " + args + " >" + out +
                            " 2>&1 </dev/null";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}
#endif

// Runs `fn`, expects a gradscope::Error of kind usage, and returns it.
template <typename Fn>
Error expect_usage_error(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e;
  }
  ADD_FAILURE() << "expected a gradscope::Error";
  return Error(ErrorKind::kRuntime, "", "");
}

}  // namespace gradscope::testing
