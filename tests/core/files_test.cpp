// Whole files: a writer leaves the old file or the whole new one, never half of either, and no
// temporary file behind.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;

int entries(const std::string& folder) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(folder)) ++n;
  return n;
}

TEST(AtomicFile, WritesReplacesAndLeavesNothingElse) {
  testing::TempDir dir("gradscope-atomic");
  const std::string path = dir.file("record.json");
  write_file_atomically(path, "first\n");
  EXPECT_EQ(testing::slurp(path), "first\n");
  write_file_atomically(path, std::string(1 << 20, 'x'));
  EXPECT_EQ(testing::slurp(path), std::string(1 << 20, 'x'));
  write_file_atomically(path, "");
  EXPECT_EQ(testing::slurp(path), "");
  EXPECT_EQ(entries(dir.path()), 1);
}

TEST(AtomicFile, WritesThroughASymbolicLinkAsAPlainWriteWould) {
  testing::TempDir dir("gradscope-atomic");
  fs::create_directory(dir.file("store"));
  write_file_atomically(dir.file("store/real.json"), "old");
  fs::create_symlink("store/real.json", dir.file("link.json"));
  write_file_atomically(dir.file("link.json"), "new");
  EXPECT_TRUE(fs::is_symlink(dir.file("link.json")));
  EXPECT_EQ(testing::slurp(dir.file("store/real.json")), "new");
  EXPECT_EQ(entries(dir.path()), 2);
  EXPECT_EQ(entries(dir.file("store")), 1);
}

// The mode a plain write would give: the old file's, or 0666 less the umask.
TEST(AtomicFile, KeepsTheModeAPlainWriteWouldGive) {
  testing::TempDir dir("gradscope-atomic");
  const auto mode = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(stat(path.c_str(), &st), 0);
    return st.st_mode & 0777;
  };
  const mode_t before = umask(077);
  write_file_atomically(dir.file("private"), "x");
  umask(022);
  write_file_atomically(dir.file("shared"), "x");
  umask(before);
  EXPECT_EQ(mode(dir.file("private")), 0600u);
  EXPECT_EQ(mode(dir.file("shared")), 0644u);
  chmod(dir.file("shared").c_str(), 0640);
  write_file_atomically(dir.file("shared"), "y");  // replacing keeps the old file's mode
  EXPECT_EQ(mode(dir.file("shared")), 0640u);
}

// A fixed temporary name could be taken (a folder, another writer's file); each write has
// its own.
TEST(AtomicFile, ATakenTemporaryNameDoesNotStopTheWrite) {
  testing::TempDir dir("gradscope-atomic");
  const std::string path = dir.file("run.json");
  fs::create_directory(path + ".tmp");
  write_file_atomically(path, "{}\n");
  EXPECT_EQ(testing::slurp(path), "{}\n");
  EXPECT_TRUE(fs::is_directory(path + ".tmp"));
  EXPECT_EQ(entries(dir.path()), 2);
}

TEST(AtomicFile, AFailedWriteNamesThePathAndLeavesNothingBehind) {
  testing::TempDir dir("gradscope-atomic");
  const std::string missing = dir.file("no-such-folder/run.json");
  try {
    write_file_atomically(missing, "{}\n");
    FAIL() << "wrote into a missing folder";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_TRUE(testing::contains(e.what(), missing)) << e.what();
  }
  // A folder where the file should be: the rename fails, the folder and the rest stay.
  const std::string taken = dir.file("taken");
  fs::create_directory(taken);
  std::ofstream(taken + "/inside") << "kept\n";
  EXPECT_THROW(write_file_atomically(taken, "new\n"), Error);
  EXPECT_EQ(testing::slurp(taken + "/inside"), "kept\n");
  EXPECT_EQ(entries(dir.path()), 1);  // no temporary file left behind
}

}  // namespace
}  // namespace gradscope
