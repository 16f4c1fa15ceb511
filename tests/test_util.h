// Helpers shared by the tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gradscope/core/config.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"

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

// Runs `fn`, expects a gradscope::Error of kind usage, and returns it.
template <typename Fn>
Error expect_usage_error(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kErrorKindUsage) << e.what();
    return e;
  }
  ADD_FAILURE() << "expected a gradscope::Error";
  return Error(ErrorKind::kErrorKindRuntime, "", "");
}

}  // namespace gradscope::testing
