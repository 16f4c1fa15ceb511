// Whole files written so that nothing is ever half there.
#pragma once

#include <string>

namespace gradscope {

// Writes `bytes` to `path` so that a reader sees either the old file or the whole new one, and
// a crash or a full disk leaves no half file: the bytes go to a temporary file of a unique
// name in the same folder, which is flushed to the disk (fsync) and closed with every error
// checked, then renamed over `path`, and the folder is flushed too. The file keeps the old
// file's mode, or gets 0666 less the umask, as a plain write would.
// A runtime error naming the path when any step fails; the temporary file is removed then.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace gradscope
