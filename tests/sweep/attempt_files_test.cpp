// Each attempt of a sweep writes its log and result under a name of its own: a resumed sweep
// (whose attempt counter starts again at 1) never overwrites an earlier attempt's files.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "gradscope/sweep/runner.h"
#include "test_util.h"

namespace gradscope {
namespace {

TEST(SweepAttemptFiles, AResumedSweepSkipsTheNamesOfEarlierAttempts) {
  testing::TempDir dir("gradscope-attempt-files");
  int counter = 0;
  EXPECT_EQ(free_attempt_stem(dir.path(), "abc", counter), "abc-1");
  EXPECT_EQ(counter, 1);
  // The files of an earlier invocation: its attempt 1 left a log, its attempt 2 a result.
  std::ofstream(dir.file("abc-1.log")) << "the earlier attempt's output\n";
  std::ofstream(dir.file("abc-2.json")) << "{}\n";
  counter = 0;  // a new invocation
  EXPECT_EQ(free_attempt_stem(dir.path(), "abc", counter), "abc-3");
  EXPECT_EQ(counter, 3);
  EXPECT_EQ(free_attempt_stem(dir.path(), "abc", counter), "abc-4");
  // Another run id shares nothing with it.
  counter = 0;
  EXPECT_EQ(free_attempt_stem(dir.path(), "def", counter), "def-1");
  EXPECT_EQ(testing::slurp(dir.file("abc-1.log")), "the earlier attempt's output\n");
  // Two sweeps sharing the folder (each with its own counter) never take one name.
  int first = 0, second = 0;
  EXPECT_EQ(free_attempt_stem(dir.path(), "xyz", first), "xyz-1");
  EXPECT_EQ(free_attempt_stem(dir.path(), "xyz", second), "xyz-2");
}

}  // namespace
}  // namespace gradscope
