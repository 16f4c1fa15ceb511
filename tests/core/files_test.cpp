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
  write_file_atomically(path, std::string(1 << 20, 'x'));  // larger than one write
  EXPECT_EQ(testing::slurp(path), std::string(1 << 20, 'x'));
  write_file_atomically(path, "");
  EXPECT_EQ(testing::slurp(path), "");
  EXPECT_EQ(entries(dir.path()), 1);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
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

TEST(AtomicFile, AFailedWriteNamesThePathAndLeavesTheOldFile) {
  testing::TempDir dir("gradscope-atomic");
  const std::string missing = dir.file("no-such-folder/run.json");
  try {
    write_file_atomically(missing, "{}\n");
    FAIL() << "wrote into a missing folder";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kErrorKindRuntime);
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
