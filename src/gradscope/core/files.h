// Whole files written so that nothing is ever half there.
#pragma once

#include <cstdint>
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

}  // namespace gradscope
