// Whole files and folders written so that nothing is ever half there, and the check that an
// output path holds nothing but an earlier output of the same kind.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace gradscope {

// Every file gradscope reads from outside is checked by one of these before it is opened for
// reading, so that a FIFO cannot block a read forever, a device cannot feed it without end and
// a folder or a dangling link is not taken for a missing file.

// A usage error naming `path` (`what` says what it should be, "tokenizer file") unless it is a
// regular file once symbolic links are followed: missing, a dangling link, a folder, a FIFO,
// a socket or a device.
void check_input_file(const std::string& path, const std::string& what);

// Whether an optional input is there: false when nothing at all is at `path` (not even a
// symbolic link), true when it is a regular file (links followed), and a usage error naming it
// when something else is there (a folder, a FIFO, a device, a dangling link): an input that
// exists in another form is refused, never taken as absent.
bool optional_input_file(const std::string& path, const std::string& what);

// The bytes of a file from outside, read whole after checking its size: a usage error naming
// the file when it cannot be read, is not a regular file (check_input_file) or is larger than
// max_bytes, before anything that size is allocated.
std::string read_input_file(const std::string& path, const std::string& what, int64_t max_bytes);

// Writes `bytes` to `path` so that a reader sees either the old file or the whole new one, and
// a crash or a full disk leaves no half file: the bytes go to a temporary file of a unique
// name in the same folder, which is flushed to the disk (fsync) and closed with every error
// checked, then renamed over `path`, and the folder is flushed too. The file keeps the old
// file's mode, or gets 0666 less the umask, as a plain write would; where `path` is a
// symbolic link, the file it points at is written and the link stays.
// A runtime error naming the path when any step fails; the temporary file is removed then.
void write_file_atomically(const std::string& path, const std::string& bytes);
// The same for a file made of pieces written one after another (a header, then each tensor's
// bytes), so that large data need not be copied into one string first.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces);

// A file written piece by piece by code that must not see an error: LibTorch's archive writer
// (OutputArchive::save_to with a writer function) throws from its destructor when a write
// fails, which ends the process. write() never fails: it keeps the first error and drops what
// follows. finish() flushes the file to the disk (fsync) and closes it, every error checked,
// and throws a runtime error naming the file and the OS error of the first step that failed.
class CheckedFileWriter {
 public:
  explicit CheckedFileWriter(const std::string& path);  // creates or truncates the file
  ~CheckedFileWriter();
  CheckedFileWriter(const CheckedFileWriter&) = delete;
  CheckedFileWriter& operator=(const CheckedFileWriter&) = delete;
  // Returns `size` whatever happens, so that the caller goes on (and its archive stays whole).
  size_t write(const void* data, size_t size) noexcept;
  void finish();

 private:
  std::string path_;
  int fd_ = -1;
  int error_ = 0;             // errno of the first failure, 0 while none
  const char* failed_ = "";  // the step that failed
};

// A new folder of a unique name beside `target`: ".NAME" + `tag` + "XXXXXX" (tag e.g.
// ".saving-"), with the mode of the folder `target` (or 0777 less the umask when there is
// none). A runtime error naming the folder above when it cannot be made.
std::filesystem::path make_sibling_folder(const std::filesystem::path& target,
                                          const std::string& tag);
// The folders beside `target` whose names start with ".NAME" + `tag`.
std::vector<std::filesystem::path> sibling_folders(const std::filesystem::path& target,
                                                   const std::string& tag);

// Puts the complete folder `fresh` (a sibling of `target`, made by make_sibling_folder) at
// `target` so that a reader sees the old folder or the new one, each whole, never a mix: a
// new target is one rename; an existing one is exchanged with `fresh` in one
// renameat2(RENAME_EXCHANGE) and the old folder, now at `fresh`, removed. On a file system
// without the exchange the old folder is first renamed aside to ".NAME.old-XXXXXX" and then
// `fresh` into place: a kill between the two leaves no `target` and the old folder whole
// aside, which the caller may look for (and which a later replace removes). The parent
// folder is flushed to the disk. A runtime error naming `target` when a step fails; the old
// folder is then where it was.
void replace_folder(const std::filesystem::path& fresh, const std::filesystem::path& target);
// The tag of the folders replace_folder moves aside: ".old-".
inline constexpr const char* kAsideTag = ".old-";

// What a command writes, for check_output_file: each kind is recognized by its contents.
enum class OutputKind {
  kRunRecord,     // `run --json`: a JSON object whose "schema" is gradscope.run/N
  kProbeRecord,   // `probe --json`: "schema" gradscope.probe/N
  kEstimate,      // `estimate --json`: an object with "config" and "estimate"
  kEvalResult,     // `eval --json`: an object with "loss_nats", "split" and "model"
  kMemorySnapshot,  // `run --memory-snapshot`: a pickle (protocol 2 or later)
  kMemoryTimeline,  // `run --memory-timeline`: begins with the magic "GSMEMTL1"
  kReportPage,      // report.html: "<!DOCTYPE html>" with the title "gradscope report"
  kReportSummary,   // summary.md: begins "# gradscope report"
  kReportTable,     // runs.csv, steps.csv, claims.csv: a header that begins "run_id," or
                    // "claim_id,"
  kBatchOutputs,    // `outputs --out`: a safetensors file whose metadata "content" is
                    // gradscope.outputs/N
};
// What `kind` is, for messages ("a gradscope run record").
const char* output_kind_name(OutputKind kind);

// Refuses (a usage error naming `flag` and the file) an output path that holds something a
// write would lose: `path` may be new, an empty file, or a file an earlier command wrote as
// output of `kind`. A folder, a device or a file of any other content (a results database,
// another kind of record, the user's own file) is refused. Read with a size limit; nothing is
// written.
void check_output_file(const std::string& flag, const std::string& path, OutputKind kind);

// One output of a command: its flag, its path, and whether it is a folder the command replaces
// whole (--save-state, --save-weights, report --out).
struct OutputPath {
  std::string flag;
  std::string path;
  bool folder = false;
};
// Refuses (a usage error naming both flags and the path) two outputs that are one file (the
// same path, however spelled, or two names of one file), or an output inside an output folder,
// which the folder's next write would remove. Empty paths are left out.
void check_distinct_outputs(const std::vector<OutputPath>& outputs);

}  // namespace gradscope
