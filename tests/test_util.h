// Helpers shared by the tests.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gradscope/core/env.h"

namespace gradscope::testing {

inline std::string fixture(const std::string& name) {
  return std::string(GRADSCOPE_FIXTURES) + "/" + name;
}

// True when scripts/fetch-data.sh has put `relative` under the data folder (`make test`
// fetches it; a bare `ctest` without the fetch skips the tests that need it).
inline bool have_data(const std::string& relative) {
  return std::filesystem::exists(std::filesystem::path(data_dir()) / relative);
}

// A fresh empty folder under the system temp folder, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "gradscope-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (tag + "-XXXXXX")).string();
    char* made = mkdtemp(pattern.data());
    path_ = made ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace gradscope::testing
