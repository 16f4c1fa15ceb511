#include "gradscope/core/files.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"

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

CheckedFileWriter::CheckedFileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    error_ = errno;
    failed_ = "create";
  }
}

CheckedFileWriter::~CheckedFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

size_t CheckedFileWriter::write(const void* data, size_t size) noexcept {
  if (error_ != 0) return size;
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = n < 0 ? errno : EIO;
      failed_ = "write";
      break;
    }
    done += static_cast<size_t>(n);
  }
  return size;
}

void CheckedFileWriter::finish() {
  if (error_ == 0 && ::fsync(fd_) != 0) {
    error_ = errno;
    failed_ = "flush";
  }
  if (fd_ >= 0) {
    const int closed = ::close(fd_);
    fd_ = -1;
    if (error_ == 0 && closed != 0) {
      error_ = errno;
      failed_ = "close";
    }
  }
  if (error_ != 0)
    fail_runtime(fmt::format("cannot write {}: {}: {}", path_, failed_, std::strerror(error_)),
                 "check the file system and its free space");
}

std::filesystem::path make_sibling_folder(const std::filesystem::path& target,
                                          const std::string& tag) {
  const std::filesystem::path parent = target.has_parent_path() ? target.parent_path() : ".";
  std::string pattern = (parent / ("." + target.filename().string() + tag + "XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr)
    fail_runtime(
        fmt::format("cannot create a folder in {}: {}", parent.string(), std::strerror(errno)),
        fmt::format("the folder that holds {} must be writable", target.string()));
  // The mode a plain mkdir would give, or the folder's it replaces (mkdtemp makes it 0700).
  struct stat old {};
  ::chmod(pattern.c_str(), ::stat(target.c_str(), &old) == 0 && S_ISDIR(old.st_mode)
                               ? (old.st_mode & 07777)
                               : (0777 & ~current_umask()));
  return pattern;
}

std::vector<std::filesystem::path> sibling_folders(const std::filesystem::path& target,
                                                   const std::string& tag) {
  namespace fs = std::filesystem;
  const std::string prefix = "." + target.filename().string() + tag;
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry :
       fs::directory_iterator(target.has_parent_path() ? target.parent_path() : ".", ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code type_error;
    if (name.rfind(prefix, 0) == 0 && entry.is_directory(type_error) &&
        !entry.is_symlink(type_error))
      out.push_back(entry.path());
  }
  return out;
}

void replace_folder(const std::filesystem::path& fresh, const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  const std::string folder = target.has_parent_path() ? target.parent_path().string() : ".";
  const auto fail = [&](int error) {
    fail_runtime(fmt::format("cannot put {} in place: {}", target.string(), std::strerror(error)),
                 "check the file system and its free space");
  };
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(target, ec))) {
    if (::rename(fresh.c_str(), target.c_str()) != 0) fail(errno);
    sync_folder(folder);
    return;
  }
  if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    sync_folder(folder);
    fs::remove_all(fresh, ec);  // now the old folder
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) fail(errno);
  // No exchange on this file system: the old folder goes aside first, so that a kill between
  // the two renames leaves it whole beside `target`.
  const fs::path aside = make_sibling_folder(target, kAsideTag);
  if (::rename(target.c_str(), aside.c_str()) != 0) {
    const int error = errno;
    fs::remove(aside, ec);
    fail(error);
  }
  if (::rename(fresh.c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::rename(aside.c_str(), target.c_str());  // the old folder back
    fail(error);
  }
  sync_folder(folder);
  fs::remove_all(aside, ec);
}

const char* output_kind_name(OutputKind kind) {
  switch (kind) {
    case OutputKind::kRunRecord:
      return "a gradscope run record";
    case OutputKind::kProbeRecord:
      return "a gradscope probe record";
    case OutputKind::kEstimate:
      return "a gradscope estimate";
    case OutputKind::kEvalResult:
      return "a gradscope eval result";
    case OutputKind::kMemorySnapshot:
      return "a memory snapshot (pickle)";
    case OutputKind::kMemoryTimeline:
      return "a gradscope memory timeline";
    case OutputKind::kReportPage:
      return "a gradscope report page";
    case OutputKind::kReportSummary:
      return "a gradscope report summary";
    case OutputKind::kReportTable:
      return "a gradscope report table";
    case OutputKind::kBatchOutputs:
      return "a gradscope outputs file";
  }
  return "a gradscope output";
}

namespace {

// The largest JSON output read back to check its kind (a run record's limit).
constexpr int64_t kMaxOutputJsonBytes = int64_t{1} << 30;

// The first `size` bytes of an open file (fewer when it is shorter).
std::string read_head(int fd, size_t size) {
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, bytes.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

bool starts_with(const std::string& text, std::string_view prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// Whether the JSON text is an object that an output of `kind` would be.
bool json_output_of(const std::string& text, OutputKind kind) {
  std::string why;
  const std::optional<nlohmann::json> j = try_parse_json(text, &why);
  if (!j || !j->is_object()) return false;
  const auto schema = [&](std::string_view prefix) {
    const auto it = j->find("schema");
    return it != j->end() && it->is_string() && starts_with(it->get<std::string>(), prefix);
  };
  switch (kind) {
    case OutputKind::kRunRecord:
      return schema("gradscope.run/");
    case OutputKind::kProbeRecord:
      return schema("gradscope.probe/");
    case OutputKind::kEstimate:
      return j->contains("config") && j->contains("estimate") && !j->contains("schema");
    case OutputKind::kEvalResult:
      return j->contains("loss_nats") && j->contains("split") && j->contains("model") &&
             !j->contains("schema");
    default:
      return false;
  }
}

}  // namespace

void check_output_file(const std::string& flag, const std::string& path, OutputKind kind) {
  namespace fs = std::filesystem;
  check_usage(!path.empty(), flag + " needs a file name");
  const std::string hint =
      fmt::format("{} writes {} there: choose a new file name, or move the file away", flag,
                  output_kind_name(kind));
  const auto refuse = [&](const std::string& what) {
    fail_usage(fmt::format("{} {}: {}, which this command would overwrite", flag, path, what),
               hint);
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;  // a new file (its folder is checked by check_output_path)
    fail_usage(fmt::format("{} {}: {}", flag, path, std::strerror(errno)), hint);
  }
  if (S_ISDIR(st.st_mode)) refuse("it is a folder");
  if (!S_ISREG(st.st_mode)) refuse("it is not a regular file");
  if (st.st_size == 0) return;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    fail_usage(fmt::format("{} {}: cannot read it to check what it holds: {}", flag, path,
                           std::strerror(errno)),
               hint);
  const std::string head = read_head(fd, 4096);
  ::close(fd);
  bool same_kind = false;
  switch (kind) {
    case OutputKind::kMemorySnapshot:
      same_kind = head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x80 &&
                  static_cast<unsigned char>(head[1]) >= 2;
      break;
    case OutputKind::kMemoryTimeline:
      same_kind = starts_with(head, "GSMEMTL1");
      break;
    case OutputKind::kReportPage:
      same_kind = starts_with(head, "<!DOCTYPE html>") &&
                  head.find("<title>gradscope report</title>") != std::string::npos;
      break;
    case OutputKind::kReportSummary:
      same_kind = starts_with(head, "# gradscope report\n");
      break;
    case OutputKind::kReportTable:
      same_kind = starts_with(head, "run_id,") || starts_with(head, "claim_id,");
      break;
    case OutputKind::kBatchOutputs:  // the header opens with its metadata, as gradscope writes
      same_kind = head.size() > 8 && starts_with(head.substr(8), "{\"__metadata__\":{") &&
                  head.find("\"content\":\"gradscope.outputs/") != std::string::npos;
      break;
    default:
      // JSON: only text that opens an object can be one; the whole file is parsed then.
      if (head.find_first_not_of(" \t\r\n") != std::string::npos &&
          head[head.find_first_not_of(" \t\r\n")] == '{' && st.st_size <= kMaxOutputJsonBytes)
        same_kind = json_output_of(read_input_file(path, "output file", kMaxOutputJsonBytes), kind);
  }
  if (same_kind) return;
  if (starts_with(head, std::string("SQLite format 3\0", 16))) refuse("it is an SQLite database");
  refuse(fmt::format("it is not {}", output_kind_name(kind)));
}

namespace {

// Where a path leads, for comparing outputs: the absolute, normal path with the symbolic
// links of its existing part resolved.
std::filesystem::path resolved(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  if (ec) p = std::filesystem::absolute(path, ec).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

// Whether `inner` is `outer` or lies inside it.
bool within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

}  // namespace

void check_distinct_outputs(const std::vector<OutputPath>& outputs) {
  for (size_t a = 0; a < outputs.size(); ++a)
    for (size_t b = a + 1; b < outputs.size(); ++b) {
      const OutputPath& x = outputs[a];
      const OutputPath& y = outputs[b];
      if (x.path.empty() || y.path.empty()) continue;
      const std::filesystem::path px = resolved(x.path), py = resolved(y.path);
      struct stat sx {}, sy {};
      const bool one_file = px == py || (::stat(x.path.c_str(), &sx) == 0 &&
                                         ::stat(y.path.c_str(), &sy) == 0 &&
                                         sx.st_dev == sy.st_dev && sx.st_ino == sy.st_ino);
      check_usage(!one_file,
                  fmt::format("{} {} and {} {} name the same file", x.flag, x.path, y.flag, y.path),
                  "give each output its own path: one would overwrite the other");
      const bool y_in_x = x.folder && within(py, px);
      const bool x_in_y = y.folder && within(px, py);
      const OutputPath& inner = y_in_x ? y : x;
      const OutputPath& outer = y_in_x ? x : y;
      check_usage(!y_in_x && !x_in_y,
                  fmt::format("{} {} lies inside {} {}", inner.flag, inner.path, outer.flag,
                              outer.path),
                  "that folder is replaced whole when it is written: put the output elsewhere");
    }
}

}  // namespace gradscope
