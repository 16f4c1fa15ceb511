// A pre-tokenizer's regular expression from a tokenizer file, run by PCRE2 (UTF + UCP, JIT
// where the CPU has it) under limits, so that a pattern that backtracks without bound is a
// usage error naming the file and the pattern, never a hang (docs/input-safety.md):
// - PCRE2's match limit caps the work of one search (kRegexMatchLimit) and its depth limit
//   the backtracking depth without JIT (kRegexDepthLimit; JIT's depth is bounded by its
//   8 MiB stack);
// - a time budget caps one text's whole pre-tokenization, for a pattern whose searches each
//   stay under the match limit but are many (RegexBudget).
// The limits were derived from the shipped tokenizers (GPT-2, Llama 3) on the text corpora
// (docs/input-safety.md, "Regular expressions"); RegexLimits.* checks the margin.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gradscope {

inline constexpr uint32_t kRegexMatchLimit = 100'000;
inline constexpr uint32_t kRegexDepthLimit = 10'000;
// One text's pre-tokenization may take kRegexBudgetBaseSeconds plus kRegexBudgetSecondsPerMiB
// for each MiB of the text.
inline constexpr double kRegexBudgetBaseSeconds = 10.0;
inline constexpr double kRegexBudgetSecondsPerMiB = 10.0;

struct RegexLimits {
  uint32_t match = kRegexMatchLimit;
  uint32_t depth = kRegexDepthLimit;
  bool jit = true;  // false: PCRE2's interpreter even where JIT compiled the pattern
};

// One text's time budget: a usage error from check() once it is spent.
class RegexBudget {
 public:
  RegexBudget(size_t text_bytes, std::string source);
  // A budget of `seconds` (for tests).
  RegexBudget(size_t text_bytes, std::string source, double seconds);
  // A usage error naming the source and `pattern` (the one being run) when the budget is
  // spent; cheap enough to call after every match.
  void check(const std::string& pattern) const;

 private:
  std::chrono::steady_clock::time_point start_;
  double seconds_;
  size_t bytes_;
  std::string source_;
};

class PretokenizerRegex {
 public:
  // Compiles `pattern`; a usage error naming `source` (the tokenizer file) when it does not.
  PretokenizerRegex(std::string pattern, std::string source);
  ~PretokenizerRegex();
  PretokenizerRegex(const PretokenizerRegex&) = delete;
  PretokenizerRegex& operator=(const PretokenizerRegex&) = delete;

  // The first match in `text` at or after `pos`: true with its bytes [*start, *end), false
  // when there is none. A usage error naming the source and the pattern when a search passes
  // a limit; a runtime error for PCRE2's other failures (out of memory).
  bool find(std::string_view text, size_t pos, size_t* start, size_t* end,
            const RegexLimits& limits = {}) const;
  // The same, false with *limit_hit set where a limit was passed, instead of an error: for
  // measuring what a pattern needs.
  bool try_find(std::string_view text, size_t pos, size_t* start, size_t* end,
                const RegexLimits& limits, bool* limit_hit) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  Code* code_ = nullptr;
  std::string pattern_;
  std::string source_;
};

// A pattern cut to 200 characters, control characters shown as ?, for messages.
std::string shown_pattern(const std::string& pattern);

}  // namespace gradscope
