#include "gradscope/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

std::string errno_text() { return std::strerror(errno); }

// fsync of a folder, so that a rename in it survives a power cut. Some file systems refuse
// to open or sync a folder; the data itself is already on the disk then.
void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const std::string folder = target.has_parent_path() ? target.parent_path().string() : ".";
  const std::string hint = "check that the folder exists and is writable, and free disk space";
  std::string pattern =
      (fs::path(folder) / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) fail_runtime("cannot write " + path + ": " + errno_text(), hint);
  const std::string tmp(name.data());
  const auto fail = [&](const std::string& what) {
    const std::string reason = errno_text();
    ::unlink(tmp.c_str());
    fail_runtime("cannot write " + path + ": " + what + ": " + reason, hint);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0) {
    ::close(fd);
    fail("flush");
  }
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
  sync_folder(folder);
}

}  // namespace gradscope
