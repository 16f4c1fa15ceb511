// Input from outside, read with limits: file sizes checked before reading, JSON depth checked
// before parsing, and text from files made harmless for the terminal.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/log.h"
#include "test_util.h"

namespace gradscope {
namespace {

TEST(JsonInput, DepthCountsArraysAndObjectsButNotStrings) {
  EXPECT_EQ(json_depth("1"), 0);
  EXPECT_EQ(json_depth(R"({"a": [1, {"b": []}]})"), 4);
  EXPECT_EQ(json_depth(R"(["[[[[", "\"[[[", {"k]": "}}"}])"), 2);
  EXPECT_EQ(json_depth(std::string(10, '['), 9), -1);
  EXPECT_EQ(json_depth(std::string(9, '['), 9), 9);
}

TEST(JsonInput, DeepNestingIsAUsageErrorNotACrash) {
  // A million brackets parse (nlohmann's parser keeps its own stack) but dump() and copies
  // recurse once per level: this used to end in SIGSEGV.
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  std::string why;
  EXPECT_FALSE(try_parse_json(deep, &why).has_value());
  EXPECT_TRUE(testing::contains(why, "deeper than 64")) << why;
  const Error e = testing::expect_usage_error([&] { parse_json_input(deep, "rows.json"); });
  EXPECT_TRUE(testing::contains(e.what(), "rows.json")) << e.what();
  // As deep as allowed is fine, and round-trips.
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_EQ(parse_json_input(ok, "ok").dump(), ok);
}

TEST(JsonInput, NotJsonNamesTheSource) {
  const Error e = testing::expect_usage_error([] { parse_json_input("{\"a\": ", "task-3.json"); });
  EXPECT_TRUE(testing::contains(e.what(), "task-3.json: it is not valid JSON")) << e.what();
}

TEST(JsonInput, ARepeatedKeyIsRefusedNamingItAndWhereItIs) {
  EXPECT_EQ(repeated_key_problem(R"({"a": 1, "b": [{"a": 2}, {"a": 3}]})"), "");
  EXPECT_EQ(repeated_key_problem(R"({"a": 1, "a": 2})"), "key 'a' appears twice");
  EXPECT_EQ(repeated_key_problem(R"({"x": {"y": {"k": 1, "k": 1}}})"),
            "key 'k' appears twice in 'x.y'");
  EXPECT_EQ(repeated_json_key(R"({"x": {"k": 1, "k": 2}})"),
            (std::vector<std::string>{"x", "k"}));
  const Error e = testing::expect_usage_error([] {
    parse_json_input_unique(R"({"vocab_size": 320, "vocab_size": 4000000})", "config.json");
  });
  EXPECT_TRUE(testing::contains(e.what(), "config.json: key 'vocab_size' appears twice"))
      << e.what();
  EXPECT_EQ(parse_json_input_unique(R"({"a": {"b": 1}})", "x")["a"]["b"], 1);
}

TEST(InputFile, OnlyRegularFilesAreInputs) {
  testing::TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  ASSERT_EQ(::symlink("file", dir.file("link").c_str()), 0);
  ASSERT_EQ(::symlink("none", dir.file("dangling").c_str()), 0);
  check_input_file(dir.file("file"), "data file");
  check_input_file(dir.file("link"), "data file");  // a link to a file is the file
  EXPECT_TRUE(optional_input_file(dir.file("link"), "data file"));
  EXPECT_FALSE(optional_input_file(dir.file("none"), "data file"));
  const auto refused = [&](const std::string& name, const std::string& what) {
    for (bool optional : {false, true}) {
      const Error e = testing::expect_usage_error([&] {
        if (optional)
          optional_input_file(dir.file(name), "data file");
        else
          check_input_file(dir.file(name), "data file");
      });
      EXPECT_TRUE(testing::contains(e.what(), "data file " + dir.file(name) + " " + what))
          << e.what();
    }
  };
  refused("fifo", "is a FIFO (named pipe), not a regular file");
  refused(".", "is a folder, not a regular file");
  refused("dangling", "is a symbolic link to nothing");
  // Refused without blocking: opened non-blocking, then checked.
  const Error e =
      testing::expect_usage_error([&] { read_input_file(dir.file("fifo"), "data file", 100); });
  EXPECT_TRUE(testing::contains(e.what(), "is a FIFO (named pipe), not a regular file"))
      << e.what();
}

TEST(InputFile, ASizeOverTheLimitIsRefusedBeforeReading) {
  testing::TempDir dir;
  const std::string big = dir.file("big.json");
  { std::ofstream(big) << ""; }
  // A sparse file: 2 GiB on paper, nothing on the disk.
  ASSERT_EQ(::truncate(big.c_str(), int64_t{2} << 30), 0);
  const Error e =
      testing::expect_usage_error([&] { read_input_file(big, "result file", int64_t{1} << 30); });
  EXPECT_TRUE(testing::contains(e.what(), "more than the 1073741824")) << e.what();
  EXPECT_TRUE(testing::contains(e.what(), big)) << e.what();
}

TEST(InputFile, ReadsWholeFilesAndRefusesFoldersAndMissingFiles) {
  testing::TempDir dir;
  std::ofstream(dir.file("a")) << std::string(100000, 'x');
  EXPECT_EQ(read_input_file(dir.file("a"), "file", 100000).size(), 100000u);
  testing::expect_usage_error([&] { read_input_file(dir.file("a"), "file", 99999); });
  testing::expect_usage_error([&] { read_input_file(dir.path(), "file", 1 << 20); });
  testing::expect_usage_error([&] { read_input_file(dir.file("none"), "file", 1 << 20); });
}

TEST(TerminalText, ControlCharactersCannotDriveTheTerminal) {
  EXPECT_EQ(terminal_text("a\x1b]0;title\x07z"), "a?]0;title?z");
  EXPECT_EQ(terminal_text("line\nnext\tcol"), "line\nnext\tcol");
  EXPECT_EQ(terminal_text("\xc2\x9b"
                          "31m"),
            "?31m");  // C1 CSI in UTF-8
  EXPECT_EQ(terminal_text("caf\xc3\xa9 \xe2\x9c\x93"),
            "caf\xc3\xa9 \xe2\x9c\x93");  // plain UTF-8 kept
  EXPECT_EQ(terminal_text(std::string("a\0b", 3)), "a?b");
  // Bidirectional controls: a right-to-left override and an isolate would reorder the line.
  EXPECT_EQ(terminal_text("file\xe2\x80\xaetxt.exe"), "file?txt.exe");
  EXPECT_EQ(terminal_text("a\xe2\x81\xa6"
                          "b\xe2\x81\xa9"
                          "c"),
            "a?b?c");
  EXPECT_EQ(terminal_text("\xe2\x80\x94 dash"), "\xe2\x80\x94 dash");  // U+2014 kept
  EXPECT_EQ(terminal_text("x\xd8\x9c"
                          "y"),
            "x?y");  // U+061C
}

}  // namespace
}  // namespace gradscope
