#include "gradscope/report/files.h"

#include <fstream>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"

namespace gradscope {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  write_file_atomically(path.string(), text);
}

void make_folder(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  check_usage(!ec && std::filesystem::is_directory(path),
              fmt::format("cannot create {}: {}", path.string(), ec.message()),
              "choose a writable --out folder");
}

}  // namespace gradscope
