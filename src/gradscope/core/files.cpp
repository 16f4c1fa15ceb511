#include "gradscope/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

// fsync of a folder, so that a rename in it survives a power cut. Some file systems refuse
// to open or sync a folder; the data itself is already on the disk then.
void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// The process's umask, from /proc (reading it with umask() would change it for a moment, for
// every thread); 022 where /proc does not say.
mode_t current_umask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("Umask:", 0) == 0)
      return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
  return 022;
}

// What is at a path that is not a regular file, for a message.
std::string kind_of(const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return "a folder";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  return "something other than a file";
}

constexpr char kRegularHint[] = "pass a regular file, not a folder, a pipe or a device";

}  // namespace

void check_input_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    struct stat link {};
    if (error == ENOENT && ::lstat(path.c_str(), &link) == 0)
      fail_usage(fmt::format("{} {} is a symbolic link to nothing", what, path),
                 "point the link at an existing file, or pass the file itself");
    fail_usage(fmt::format("cannot read {} {}: {}", what, path, std::strerror(error)),
               error == ENOENT ? "check the path" : "check the file's permissions");
  }
  if (!S_ISREG(st.st_mode))
    fail_usage(fmt::format("{} {} is {}, not a regular file", what, path, kind_of(st)),
               kRegularHint);
}

bool optional_input_file(const std::string& path, const std::string& what) {
  struct stat link {};
  if (::lstat(path.c_str(), &link) != 0) {
    const int error = errno;
    if (error == ENOENT) return false;
    fail_usage(fmt::format("cannot read {} {}: {}", what, path, std::strerror(error)),
               "check the permissions of its folder");
  }
  check_input_file(path, what);
  return true;
}

std::string read_input_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  // Non-blocking, so that a FIFO is refused below instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    fail_usage(fmt::format("cannot read {} {}: {}", what, path, std::strerror(error)),
               error == ENOENT ? "check the path" : "check the file's permissions");
  }
  std::string bytes;
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const auto fail = [&](const std::string& why, const std::string& hint) {
    ::close(fd);
    fail_usage(fmt::format("{} {} {}", what, path, why), hint);
  };
  if (!regular)
    fail(fmt::format("is {}, not a regular file", kind_of(st)), kRegularHint);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (st.st_size > max_bytes)
    fail(fmt::format("has {} bytes, more than the {} a {} may have", st.st_size, max_bytes, what),
         "check that it is the right file");
  bytes.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(fmt::format("cannot be read: {}", std::strerror(errno)), "");
    if (n == 0) break;  // shorter than it was a moment ago: read what is there
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  ::close(fd);
  return bytes;
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  write_file_atomically(path, std::vector<std::string_view>{bytes});
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  namespace fs = std::filesystem;
  // Through a symbolic link, as a plain write goes: the file it points at is replaced, the
  // link stays.
  fs::path target(path);
  std::error_code link_error;
  int hops = 0;
  for (; hops < 40 && fs::is_symlink(target, link_error); ++hops) {
    const fs::path to = fs::read_symlink(target, link_error);
    if (link_error) break;
    target = to.is_absolute() ? to : target.parent_path() / to;
  }
  if (hops == 40)
    fail_runtime("cannot write " + path + ": " + std::strerror(ELOOP),
                 "the path is a loop of symbolic links");
  const std::string folder = target.has_parent_path() ? target.parent_path().string() : ".";
  const std::string hint = "check that the folder exists and is writable, and free disk space";
  const std::string pattern =
      (fs::path(folder) / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) fail_runtime("cannot write " + path + ": " + std::strerror(errno), hint);
  const std::string tmp(name.data());
  // errno of the step that failed, read before the cleanup can change it.
  const auto fail = [&](const std::string& what, int error, bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(tmp.c_str());
    fail_runtime("cannot write " + path + ": " + what + ": " + std::strerror(error), hint);
  };
  for (const std::string_view bytes : pieces) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("write", errno, true);
      done += static_cast<size_t>(n);
    }
  }
  // The mode the file would get from a plain write: the old file's, or 0666 less the umask
  // (mkostemp makes it 0600). Where the file system keeps no modes, the write still counts.
  struct stat old {};
  ::fchmod(fd,
           ::stat(target.c_str(), &old) == 0 ? (old.st_mode & 07777) : (0666 & ~current_umask()));
  if (::fsync(fd) != 0) fail("flush", errno, true);
  if (::close(fd) != 0) fail("close", errno, false);
  if (::rename(tmp.c_str(), target.c_str()) != 0) fail("rename", errno, false);
  sync_folder(folder);
}

}  // namespace gradscope
