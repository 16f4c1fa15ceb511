// Errors that reach the user. Library code throws; only cli/ catches, prints
//   error: WHAT
//   hint: HOW TO FIX
// and picks the exit code (2 for bad usage or bad input, 1 for a failed run).
#pragma once

#include <stdexcept>
#include <string>

namespace gradscope {

enum class ErrorKind {
  kUsage,    // bad command line, config value or input file: exit 2
  kRuntime,  // the run itself failed: exit 1
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what, std::string hint)
      : std::runtime_error(what), kind_(kind), hint_(std::move(hint)) {}
  ErrorKind kind() const { return kind_; }
  const std::string& hint() const { return hint_; }

 private:
  ErrorKind kind_;
  std::string hint_;
};

// Bad usage or bad input (exit code 2).
[[noreturn]] inline void fail_usage(const std::string& what, const std::string& hint = "") {
  throw Error(ErrorKind::kUsage, what, hint);
}
// A failure while running (exit code 1).
[[noreturn]] inline void fail_runtime(const std::string& what, const std::string& hint = "") {
  throw Error(ErrorKind::kRuntime, what, hint);
}

inline void check_usage(bool ok, const std::string& what, const std::string& hint = "") {
  if (!ok) fail_usage(what, hint);
}

}  // namespace gradscope
