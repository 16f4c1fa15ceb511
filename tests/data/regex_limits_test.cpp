// Pre-tokenizer regexes under limits (data/regex.h): a pattern that backtracks without bound is
// bad input naming the tokenizer file and the pattern, whether one search passes PCRE2's
// limits or many searches pass the text's time budget; and the shipped tokenizers stay far
// inside the limits on the corpora.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/data/bpe.h"
#include "gradscope/data/regex.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::expect_usage_error;
using testing::slurp;

const std::string kHfFixture =
    std::string(GRADSCOPE_FIXTURES) + "/tokenizer/tiny_hf_tokenizer.json";

std::unique_ptr<BpeTokenizer> with_pattern(const std::string& pattern) {
  nlohmann::json j = nlohmann::json::parse(slurp(kHfFixture));
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}};
  return parse_hf_tokenizer(j.dump(), "dir/tokenizer.json", "t", "<|end_of_text|>");
}

TEST(RegexLimits, AnExponentialPatternIsBadInputNamingTheFileAndThePattern) {
  auto tok = with_pattern("(a+)+$");
  const Error e = expect_usage_error([&] { tok->encode(std::string(40, 'a') + "!"); });
  EXPECT_TRUE(contains(e.what(), "tokenizer dir/tokenizer.json: pre-tokenizer regex '(a+)+$' "
                                 "passed PCRE2's limits"))
      << e.what();
  EXPECT_TRUE(contains(e.hint(), "the pattern backtracks")) << e.hint();
  // The same pattern on text it matches at once is fine.
  EXPECT_EQ(tok->decode(tok->encode("aaa")), "aaa");
}

TEST(RegexLimits, WithoutJitTheLimitsHoldToo) {
  const PretokenizerRegex regex("(a|b?)+$", "t.json");
  const std::string text = std::string(5000, 'a') + "!";
  size_t start = 0, end = 0;
  RegexLimits limits;
  limits.jit = false;
  const Error e = expect_usage_error([&] { regex.find(text, 0, &start, &end, limits); });
  EXPECT_TRUE(contains(e.what(), "t.json: pre-tokenizer regex '(a|b?)+$' passed")) << e.what();
}

TEST(RegexLimits, ASpentTimeBudgetNamesTheFileAndThePattern) {
  const RegexBudget generous(1000, "t.json");
  generous.check("x+");  // 10 s at least: not spent yet
  const RegexBudget none(1000, "t.json", 0.0);
  const Error e = expect_usage_error([&] { none.check("[a-z]*[a-z]*Q|."); });
  EXPECT_TRUE(contains(e.what(), "tokenizer t.json: pre-tokenizing a text of 1000 bytes took more "
                                 "than the 0.0 s allowed it"))
      << e.what();
  EXPECT_TRUE(contains(e.what(), "in pre-tokenizer regex '[a-z]*[a-z]*Q|.'")) << e.what();
}

TEST(RegexLimits, ACorruptTokenizerFileHintNeverSaysToDeleteIt) {
  const Error e = expect_usage_error(
      [] { parse_hf_tokenizer("{\"model\": ", "mine/tokenizer.json", "t", "<|end_of_text|>"); });
  EXPECT_FALSE(contains(e.hint(), "delete")) << e.hint();
  EXPECT_TRUE(contains(e.hint(), "pass a whole byte-level BPE tokenizer file")) << e.hint();
}

// Whether every search of a split of `texts` by `regex` passes under `limits`.
bool passes(const PretokenizerRegex& regex, const std::vector<std::string>& texts,
            const RegexLimits& limits, size_t window = 0) {
  for (const std::string& text : texts) {
    size_t pos = 0, start = 0, end = 0;
    while (pos < text.size()) {
      bool hit = false;
      // The interpreter scans to the subject's end on every search: it runs on a window.
      const std::string_view subject =
          window ? std::string_view(text).substr(pos, window) : std::string_view(text);
      const size_t at = window ? 0 : pos;
      if (!regex.try_find(subject, at, &start, &end, limits, &hit)) {
        if (hit) return false;
        break;
      }
      const size_t offset = window ? pos : 0;
      pos = offset + (end > start ? end : start + 1);
    }
  }
  return true;
}

// The shipped tokenizers' patterns pass every search of the corpora under a hundredth of each
// limit (the margin docs/input-safety.md states): JIT's match limit over the whole corpora,
// the interpreter's match and depth limits over the first MiB of each.
TEST(RegexLimitsCorpus, ShippedTokenizersStayAHundredfoldInsideTheLimits) {
  std::vector<std::string> corpus;
  for (const char* name : {"sotu", "moby-dick", "brown"}) {
    const fs::path dir = data_dir() + "/text/" + name;
    if (!fs::is_directory(dir)) continue;
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".txt") files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) corpus.push_back(slurp(f));
  }
  const std::string llama3 = data_dir() + "/tokenizers/llama3/tokenizer.json";
  if (corpus.empty() || !fs::exists(llama3))
    GTEST_SKIP() << "needs the text corpora and the Llama 3 tokenizer (scripts/fetch-data.sh)";
  const nlohmann::json j = nlohmann::json::parse(slurp(llama3));
  const std::string llama3_pattern =
      j.at("pre_tokenizer").at("pretokenizers").at(0).at("pattern").at("Regex");
  std::vector<std::string> head;  // about the first MiB of the corpora
  size_t bytes = 0;
  for (const std::string& text : corpus) {
    if (bytes > (size_t{1} << 20)) break;
    head.push_back(text);
    bytes += text.size();
  }
  constexpr uint32_t kMargin = 100;
  for (const std::string& pattern : {std::string(kGpt2Pattern), llama3_pattern}) {
    SCOPED_TRACE(pattern);
    const PretokenizerRegex regex(pattern, "shipped");
    RegexLimits jit;
    jit.match = kRegexMatchLimit / kMargin;
    EXPECT_TRUE(passes(regex, corpus, jit));
    RegexLimits interpreter;
    interpreter.jit = false;
    interpreter.match = kRegexMatchLimit / kMargin;
    EXPECT_TRUE(passes(regex, head, interpreter, 1024));
    interpreter.match = kRegexMatchLimit;
    interpreter.depth = kRegexDepthLimit / kMargin;
    EXPECT_TRUE(passes(regex, head, interpreter, 1024));
  }
}

}  // namespace
}  // namespace gradscope
