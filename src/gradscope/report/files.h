// The report's file system access: whole files in and out, and its folders.
#pragma once

#include <filesystem>
#include <string>

namespace gradscope {

// The file's bytes, "" when it cannot be read.
std::string read_file(const std::filesystem::path& path);
// Writes the bytes whole or not at all (core/files.h); a runtime error when that fails.
void write_file(const std::filesystem::path& path, const std::string& text);
// Creates the folder and its parents; a usage error naming it when that fails.
void make_folder(const std::filesystem::path& path);

}  // namespace gradscope
