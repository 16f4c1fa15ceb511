#define PCRE2_CODE_UNIT_WIDTH 8
#include "gradscope/data/regex.h"

#include <pcre2.h>

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

// Per-thread match state: the JIT stack may not be shared between threads.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(16, nullptr);
    context = pcre2_match_context_create(nullptr);
    // The default 32 KiB JIT stack overflows on long runs of whitespace or punctuation.
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

MatchScratch& match_scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

constexpr char kPatternHint[] =
    "the pattern backtracks without bound (a repeated group over characters another part also "
    "matches, such as [\\p{L}\\s]* several times in a row): write it so that each character "
    "can be matched one way only; the shipped tokenizers' patterns need less than a hundredth "
    "of these limits";

}  // namespace

struct PretokenizerRegex::Code {
  pcre2_code* code = nullptr;
};

std::string shown_pattern(const std::string& pattern) {
  std::string out;
  for (const char c : pattern.substr(0, 200))
    out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (pattern.size() > 200) out += "...";
  return out;
}

RegexBudget::RegexBudget(size_t text_bytes, std::string source)
    : RegexBudget(text_bytes, std::move(source),
                  kRegexBudgetBaseSeconds +
                      kRegexBudgetSecondsPerMiB * static_cast<double>(text_bytes) / (1 << 20)) {}

RegexBudget::RegexBudget(size_t text_bytes, std::string source, double seconds)
    : start_(std::chrono::steady_clock::now()),
      seconds_(seconds),
      bytes_(text_bytes),
      source_(std::move(source)) {}

void RegexBudget::check(const std::string& pattern) const {
  const double spent =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (spent <= seconds_) return;
  fail_usage(fmt::format("tokenizer {}: pre-tokenizing a text of {} bytes took more than the "
                         "{:.1f} s allowed it ({:.0f} s, and {:.0f} s per MiB of text), in "
                         "pre-tokenizer regex '{}'",
                         source_, bytes_, seconds_, kRegexBudgetBaseSeconds,
                         kRegexBudgetSecondsPerMiB, shown_pattern(pattern)),
             kPatternHint);
}

PretokenizerRegex::PretokenizerRegex(std::string pattern, std::string source)
    : code_(new Code), pattern_(std::move(pattern)), source_(std::move(source)) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!code_->code) {
    delete code_;
    code_ = nullptr;
    fail_usage(fmt::format("{}: pre-tokenizer regex does not compile at offset {}: {}", source_,
                           offset, pcre2_message(error)),
               "the pre-tokenizer's Split patterns are PCRE2 regular expressions");
  }
  // Without JIT (an unsupported CPU) the interpreter gives the same matches, only slower.
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);
}

PretokenizerRegex::~PretokenizerRegex() {
  if (code_) pcre2_code_free(code_->code);
  delete code_;
}

bool PretokenizerRegex::try_find(std::string_view text, size_t pos, size_t* start, size_t* end,
                                 const RegexLimits& limits, bool* limit_hit) const {
  *limit_hit = false;
  MatchScratch& scratch = match_scratch();
  if (!scratch.data || !scratch.context) fail_runtime("out of memory for PCRE2 match data");
  pcre2_set_match_limit(scratch.context, limits.match);
  pcre2_set_depth_limit(scratch.context, limits.depth);
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             pos, limits.jit ? 0 : PCRE2_NO_JIT, scratch.data, scratch.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
      rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    *limit_hit = true;
    return false;
  }
  if (rc < 0)
    fail_runtime(fmt::format("tokenizer {}: regex match failed: {}", source_, pcre2_message(rc)));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
  *start = ovector[0];
  *end = ovector[1];
  return true;
}

bool PretokenizerRegex::find(std::string_view text, size_t pos, size_t* start, size_t* end,
                             const RegexLimits& limits) const {
  bool limit_hit = false;
  if (try_find(text, pos, start, end, limits, &limit_hit)) return true;
  if (limit_hit)
    fail_usage(fmt::format("tokenizer {}: pre-tokenizer regex '{}' passed PCRE2's limits (a "
                           "match limit of {}, a depth limit of {}) at byte {} of a text of {} "
                           "bytes",
                           source_, shown_pattern(pattern_), limits.match, limits.depth, pos,
                           text.size()),
               kPatternHint);
  return false;
}

}  // namespace gradscope
