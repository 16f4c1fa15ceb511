// --save-weights replaces its folder whole or not at all: a process killed at any rename of a
// save (each simulated here: the test binary's own rename and renameat2 end the process at the
// N-th call) leaves the folder holding the earlier save or the new one, file for file, never
// new weights beside an old config.json. With and without RENAME_EXCHANGE (whose absence the
// test makes renameat2 report, as a file system without it does).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <map>
#include <string>

#include "gradscope/train/session.h"
#include "gradscope/train/weights_io.h"
#include "test_util.h"

namespace gradscope::weights_kill {

// Renames to let through before the process ends itself (-1: never), and whether renameat2
// refuses RENAME_EXCHANGE. Set in a forked child only.
std::atomic<int> renames_left{-1};
std::atomic<bool> refuse_exchange{false};
constexpr int kKilledAtRename = 87;

int before_rename() {
  const int left = renames_left.load();
  if (left == 0) _exit(kKilledAtRename);
  if (left > 0) renames_left.store(left - 1);
  return 0;
}

}  // namespace gradscope::weights_kill

// The binary's rename and renameat2 (gradscope's code links against these), each a call of
// the system call after the test's hook.
extern "C" int rename(const char* from, const char* to) __THROW {
  gradscope::weights_kill::before_rename();
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, 0));
}
extern "C" int renameat2(int from_dir, const char* from, int to_dir, const char* to,
                         unsigned int flags) __THROW {
  gradscope::weights_kill::before_rename();
  if ((flags & RENAME_EXCHANGE) != 0 && gradscope::weights_kill::refuse_exchange.load()) {
    errno = EINVAL;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_renameat2, from_dir, from, to_dir, to, flags));
}

namespace gradscope::weights_kill {
namespace {

namespace fs = std::filesystem;

// A folder's files and their bytes.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    out[entry.path().filename().string()] = testing::slurp(entry.path().string());
  return out;
}

RunConfig config(int64_t seed, double dropout) {
  RunConfig c = testing::tiny_llama_config();
  c.seed = seed;
  c.dropout = dropout;
  return c;
}

SessionOptions model_only() {
  SessionOptions options;
  options.updater = false;
  return options;
}

// Saves the session's model into `dir`.
void save_model(Session& session, const std::string& dir) {
  save_weights(session.config().model, session.model(), session.arch(), dir);
}

TEST(WeightsSaveKilled, TheFolderHoldsTheEarlierSaveOrTheNewOneWhole) {
  for (const bool exchange : {true, false}) {
    testing::TempDir tmp("gradscope-weights-kill");
    const std::string dir = tmp.file("weights");
    // Built before any fork: the child only writes.
    Session older(config(1, 0.0), model_only()), newer(config(2, 0.1), model_only());
    save_model(older, dir);
    const auto earlier = files_of(dir);
    {
      testing::TempDir reference_dir("gradscope-weights-new");
      save_model(newer, reference_dir.file("weights"));
      const auto reference = files_of(reference_dir.file("weights"));
      ASSERT_NE(earlier.at("config.json"), reference.at("config.json"));
      ASSERT_NE(earlier.at("model.safetensors"), reference.at("model.safetensors"));
      bool finished = false;
      for (int kill_at = 0; kill_at < 20 && !finished; ++kill_at) {
        ASSERT_EQ(files_of(dir), earlier) << "before a save killed at rename " << kill_at;
        const pid_t child = fork();
        ASSERT_GE(child, 0);
        if (child == 0) {
          refuse_exchange.store(!exchange);
          renames_left.store(kill_at);
          try {
            save_model(newer, dir);
          } catch (...) {
            _exit(1);
          }
          _exit(0);
        }
        int status = 0;
        ASSERT_EQ(waitpid(child, &status, 0), child);
        ASSERT_TRUE(WIFEXITED(status));
        ASSERT_NE(WEXITSTATUS(status), 1) << "the save failed";
        finished = WEXITSTATUS(status) == 0;
        const auto now = files_of(dir);
        if (finished) {
          EXPECT_EQ(now, reference);
          break;
        }
        if (!fs::exists(dir)) {
          // Only without the exchange, killed between its two renames: the earlier save is
          // whole aside (and --init-from DIR finds no folder). Put it back for the next point.
          EXPECT_FALSE(exchange) << "killed at rename " << kill_at << ": the folder is gone";
          bool found = false;
          for (const auto& entry : fs::directory_iterator(tmp.path()))
            if (entry.path().filename().string().rfind(".weights.old-", 0) == 0) {
              EXPECT_EQ(files_of(entry.path()), earlier);
              fs::rename(entry.path(), dir);
              found = true;
            }
          EXPECT_TRUE(found) << "killed at rename " << kill_at << ": no earlier save left";
        } else {
          EXPECT_TRUE(now == earlier || now == reference)
              << (exchange ? "with" : "without") << " RENAME_EXCHANGE, killed at rename "
              << kill_at << ": the folder mixes the two saves";
        }
        if (now == reference) {  // killed after the new folder was in place
          fs::remove_all(dir);
          save_model(older, dir);
        }
        // What a kill left behind is removed by the next save.
        for (const auto& entry : fs::directory_iterator(tmp.path()))
          if (entry.path() != fs::path(dir)) fs::remove_all(entry.path());
      }
      EXPECT_TRUE(finished) << "the save never completed";
    }
  }
}

}  // namespace
}  // namespace gradscope::weights_kill
