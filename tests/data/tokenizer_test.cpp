// Tokenizers: the bytes tokenizer, byte-level BPE on small committed fixtures (HF and GPT-2
// formats), error handling, and the real Llama 3 / GPT-2 files when fetched.
//
// Fixture vocabularies (tests/fixtures/tokenizer): ids 0-255 are the bytes, then
//   HF   (merge ranks):  0 Ġ+t 1 h+e 2 Ġt+he 3 l+l 4 he+ll 5 hell+o 6 b+c 7 a+b 8 ab+c 9 Ã+©
//                        10 Ġ+w 11 o+r 12 Ġw+or 13 l+d 14 Ġwor+ld 15 Ċ+Ċ; ignore_merges true;
//                        ids 256 Ġt 257 he 258 Ġthe 259 ll 260 hell 261 hello 262 bc 263 ab
//                        264 abc 265 é 266 Ġw 267 or 268 Ġwor 269 ld 270 Ġworld 271 ĊĊ
//                        272 <|begin_of_text|> 273 <|end_of_text|>; Llama 3's regex.
//   GPT-2: the same merges with a+b ranked before b+c, so ids 262 ab 263 bc; 272 <|endoftext|>.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/data/bpe.h"
#include "gradscope/data/tokenizer.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

using testing::contains;
using testing::expect_usage_error;
using testing::slurp;
using testing::TempDir;

const std::string kFixtures = std::string(GRADSCOPE_FIXTURES) + "/tokenizer";
const std::string kHfPath = kFixtures + "/tiny_hf_tokenizer.json";
const std::string kGpt2Encoder = kFixtures + "/tiny_gpt2_encoder.json";
const std::string kGpt2Merges = kFixtures + "/tiny_gpt2_vocab.bpe";

void spit(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::unique_ptr<BpeTokenizer> hf_fixture() {
  return load_hf_tokenizer(kHfPath, "tiny-hf", "<|end_of_text|>");
}
std::unique_ptr<BpeTokenizer> gpt2_fixture() {
  return load_gpt2_tokenizer(kGpt2Encoder, kGpt2Merges, "tiny-gpt2", "<|endoftext|>");
}

// Non-ASCII, CRLF, tabs, runs of spaces and newlines, and bytes that are not valid UTF-8.
const std::string kTricky =
    "Hello world!\n\nnaïve café — 日本語 🙂 I'LL say it's 1234567.\r\n"
    "\t tabs  and   spaces \n"
    "\xff\xfe invalid bytes \xc3 cut";

// ---------------------------------------------------------------------------------------------
// bytes

TEST(BytesTokenizer, RoundTripUtf8AndNewlines) {
  auto tok = make_tokenizer("bytes", "/nonexistent");
  EXPECT_EQ(tok->vocab_size(), 260);
  EXPECT_EQ(tok->eot_id(), 257);
  EXPECT_EQ(tok->encode("hé\n"), (Ids{104, 0xc3, 0xa9, 10}));
  EXPECT_EQ(tok->decode(tok->encode(kTricky)), kTricky);
  // BOS/EOS/PAD/MASK have no text.
  EXPECT_EQ(tok->decode({kBytesBosId, 'a', kBytesEosId, kBytesPadId, kBytesMaskId, 'b'}), "ab");
  expect_usage_error([&] { tok->decode({260}); });
}

TEST(TokenizerRegistry, NamesAndVocabSizes) {
  const auto& reg = tokenizer_registry();
  EXPECT_EQ(reg.names(), (std::vector<std::string>{"bytes", "gpt2", "llama3"}));
  EXPECT_EQ(reg.get("bytes").vocab_size, 260);
  EXPECT_EQ(reg.get("gpt2").vocab_size, 50257);
  EXPECT_EQ(reg.get("llama3").vocab_size, 128256);
  const Error e = expect_usage_error([] { make_tokenizer("sentencepiece", "/nonexistent"); });
  EXPECT_TRUE(contains(e.hint(), "bytes, gpt2, llama3")) << e.hint();
}

// ---------------------------------------------------------------------------------------------
// fixtures

TEST(BpeFixture, ByteToUnicodeIsGpt2s) {
  const auto& table = byte_to_unicode();
  EXPECT_EQ(table['A'], uint32_t{'A'});
  EXPECT_EQ(table[' '], 0x120u);   // Ġ
  EXPECT_EQ(table['\n'], 0x10au);  // Ċ
  EXPECT_EQ(table[0xad], 0x143u);  // the last of the remapped bytes
  EXPECT_EQ(table[0xe9], 0xe9u);   // é stays itself
}

TEST(BpeFixture, HfVocabularyAndSpecials) {
  auto tok = hf_fixture();
  EXPECT_EQ(tok->vocab_size(), 274);
  EXPECT_EQ(tok->eot_id(), 273);
  EXPECT_EQ(tok->token_id("hello"), 261);
  EXPECT_EQ(tok->token_id("\xc3\xa9"), 265);
  EXPECT_EQ(tok->token_id("<|begin_of_text|>"), 272);
  EXPECT_EQ(tok->decode({273}), "<|end_of_text|>");
}

TEST(BpeFixture, HfKnownEncodings) {
  auto tok = hf_fixture();
  EXPECT_EQ(tok->encode("hello"), (Ids{261}));
  EXPECT_EQ(tok->encode(" the"), (Ids{258}));
  EXPECT_EQ(tok->encode(" world"), (Ids{270}));
  EXPECT_EQ(tok->encode("Hello"), (Ids{'H', 'e', 259, 'o'}));  // no merge for "H e"
  EXPECT_EQ(tok->encode("café"), (Ids{'c', 'a', 'f', 265}));
  EXPECT_EQ(tok->encode("hello world\n\n"), (Ids{261, 270, 271}));
  EXPECT_EQ(tok->encode(""), Ids{});
}

TEST(BpeFixture, HfRegexSplitsLikeLlama3) {
  auto tok = hf_fixture();
  EXPECT_EQ(tok->pre_tokenize("Hello world 12345\n\n  x"),
            (std::vector<std::string>{"Hello", " world", " ", "123", "45", "\n\n", " ", " x"}));
  // (?i:'s|...) makes contractions case-insensitive; punctuation takes trailing newlines.
  EXPECT_EQ(tok->pre_tokenize("I'LL go...\nnow"),
            (std::vector<std::string>{"I", "'LL", " go", "...\n", "now"}));
}

TEST(BpeFixture, MergesAppliedInRankOrder) {
  // The same bytes "abc" under two rank orders: HF ranks b+c (6) before a+b (7), GPT-2 the
  // other way round. Merging by rank gives a|bc in one and ab -> abc in the other.
  TempDir dir("gradscope-tok");
  std::string text = slurp(kHfPath);
  const std::string flag = "\"ignore_merges\": true";
  ASSERT_TRUE(contains(text, flag));
  text.replace(text.find(flag), flag.size(), "\"ignore_merges\": false");
  spit(dir.file("no_ignore.json"), text);
  auto hf = load_hf_tokenizer(dir.file("no_ignore.json"), "tiny-hf", "<|end_of_text|>");
  EXPECT_EQ(hf->encode("abc"), (Ids{'a', 262}));
  EXPECT_EQ(hf->encode("abcab"), (Ids{'a', 262, 263}));
  auto gpt2 = gpt2_fixture();
  EXPECT_EQ(gpt2->encode("abc"), (Ids{264}));
  EXPECT_EQ(gpt2->encode("bcab"), (Ids{263, 262}));
  // Overlapping pairs merge leftmost first: l l l -> ll l.
  EXPECT_EQ(gpt2->encode("lll"), (Ids{259, 'l'}));
}

TEST(BpeFixture, IgnoreMergesTakesWholeWordTokens) {
  // "abc" is a token (made by ab+c) that rank order never reaches from a|bc; with
  // ignore_merges a piece that is a token maps to it directly, as HF tokenizers does.
  auto tok = hf_fixture();
  EXPECT_EQ(tok->encode("abc"), (Ids{264}));
  EXPECT_EQ(tok->encode("abcab"), (Ids{'a', 262, 263}));  // not a whole token: merges apply
}

TEST(BpeFixture, Gpt2RegexSplitsContractionsAndSpaces) {
  auto tok = gpt2_fixture();
  EXPECT_EQ(tok->pre_tokenize("I'm here  now\n"),
            (std::vector<std::string>{"I", "'m", " here", " ", " now", "\n"}));
  EXPECT_EQ(tok->pre_tokenize("abc123 ?!"), (std::vector<std::string>{"abc", "123", " ?!"}));
  EXPECT_EQ(tok->encode("hello world"), (Ids{261, 270}));
  EXPECT_EQ(tok->eot_id(), 272);
  EXPECT_EQ(tok->vocab_size(), 273);
}

TEST(BpeFixture, RoundTripNonAsciiNewlinesAndInvalidUtf8) {
  std::vector<std::unique_ptr<BpeTokenizer>> toks;
  toks.push_back(hf_fixture());
  toks.push_back(gpt2_fixture());
  for (const auto& tok : toks) {
    EXPECT_EQ(tok->decode(tok->encode(kTricky)), kTricky) << tok->name();
    for (size_t cut = 0; cut < kTricky.size(); cut += 7) {
      const std::string part = kTricky.substr(cut, 13);
      EXPECT_EQ(tok->decode(tok->encode(part)), part) << tok->name() << " at " << cut;
    }
  }
}

TEST(BpeFixture, SpecialTokenTextIsPlainText) {
  // A document that contains "<|end_of_text|>" must not produce the document separator.
  auto tok = hf_fixture();
  const std::string text = "a<|end_of_text|>b";
  const Ids ids = tok->encode(text);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->eot_id()), 0);
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(BpeFixture, FingerprintFollowsContent) {
  TempDir dir("gradscope-tok");
  std::string merges = slurp(kGpt2Merges);
  spit(dir.file("vocab.bpe"), merges);
  auto a = gpt2_fixture();
  auto b = load_gpt2_tokenizer(kGpt2Encoder, dir.file("vocab.bpe"), "tiny-gpt2", "<|endoftext|>");
  EXPECT_EQ(a->fingerprint(), b->fingerprint());
  // Swapping two merge lines changes the tokenizer, and so its fingerprint.
  const std::string ab = "a b\n", bc = "b c\n";
  merges.replace(merges.find(ab), ab.size(), "b C\n");
  merges.replace(merges.find(bc), bc.size(), ab);
  merges.replace(merges.find("b C\n"), 4, bc);
  spit(dir.file("vocab.bpe"), merges);
  auto c = load_gpt2_tokenizer(kGpt2Encoder, dir.file("vocab.bpe"), "tiny-gpt2", "<|endoftext|>");
  EXPECT_NE(a->fingerprint(), c->fingerprint());
  EXPECT_EQ(c->encode("abc"), (Ids{'a', 263}));
}

// ---------------------------------------------------------------------------------------------
// errors

TEST(BpeErrors, TruncatedJsonNamesTheFile) {
  TempDir dir("gradscope-tok");
  const std::string text = slurp(kHfPath);
  spit(dir.file("tokenizer.json"), text.substr(0, text.size() / 2));
  const Error e = expect_usage_error(
      [&] { load_hf_tokenizer(dir.file("tokenizer.json"), "t", "<|end_of_text|>"); });
  EXPECT_TRUE(contains(e.what(), dir.file("tokenizer.json"))) << e.what();
  EXPECT_TRUE(contains(e.what(), "not valid JSON")) << e.what();
  EXPECT_TRUE(contains(e.hint(), "scripts/fetch-data.sh tokenizers")) << e.hint();

  spit(dir.file("encoder.json"), slurp(kGpt2Encoder).substr(0, 100));
  const Error g = expect_usage_error(
      [&] { load_gpt2_tokenizer(dir.file("encoder.json"), kGpt2Merges, "t", "<|endoftext|>"); });
  EXPECT_TRUE(contains(g.what(), dir.file("encoder.json"))) << g.what();
}

TEST(BpeErrors, CorruptMergesNameFileAndEntry) {
  TempDir dir("gradscope-tok");
  std::string text = slurp(kHfPath);
  const std::string merge = "\"l l\"";
  ASSERT_TRUE(contains(text, merge));
  text.replace(text.find(merge), merge.size(), "\"l q9\"");
  spit(dir.file("tokenizer.json"), text);
  const Error e = expect_usage_error(
      [&] { load_hf_tokenizer(dir.file("tokenizer.json"), "t", "<|end_of_text|>"); });
  EXPECT_TRUE(contains(e.what(), dir.file("tokenizer.json"))) << e.what();
  EXPECT_TRUE(contains(e.what(), "model.merges[3]")) << e.what();

  spit(dir.file("vocab.bpe"), "#version: 0.2\n\xc4\xa0 t\nhe\n");
  const Error g = expect_usage_error(
      [&] { load_gpt2_tokenizer(kGpt2Encoder, dir.file("vocab.bpe"), "t", "<|endoftext|>"); });
  EXPECT_TRUE(contains(g.what(), dir.file("vocab.bpe"))) << g.what();
  EXPECT_TRUE(contains(g.what(), "line 3")) << g.what();
}

TEST(BpeErrors, TruncatedMergesAreDetected) {
  // A vocab.bpe cut short still parses; the tokens no merge makes give it away.
  TempDir dir("gradscope-tok");
  const std::string merges = slurp(kGpt2Merges);
  spit(dir.file("vocab.bpe"), merges.substr(0, merges.find("Ġ w")));
  const Error e = expect_usage_error(
      [&] { load_gpt2_tokenizer(kGpt2Encoder, dir.file("vocab.bpe"), "t", "<|endoftext|>"); });
  EXPECT_TRUE(contains(e.what(), dir.file("vocab.bpe"))) << e.what();
  EXPECT_TRUE(contains(e.what(), "produced by no merge")) << e.what();
}

TEST(BpeErrors, MissingEotAndBadRegex) {
  TempDir dir("gradscope-tok");
  expect_usage_error([&] { load_hf_tokenizer(kHfPath, "t", "<|no_such_token|>"); });
  std::string text = slurp(kHfPath);
  const std::string regex = "\"Regex\": \"";
  text.insert(text.find(regex) + regex.size(), "(");
  spit(dir.file("tokenizer.json"), text);
  const Error e = expect_usage_error(
      [&] { load_hf_tokenizer(dir.file("tokenizer.json"), "t", "<|end_of_text|>"); });
  EXPECT_TRUE(contains(e.what(), "regex")) << e.what();
}

// ---------------------------------------------------------------------------------------------
// limits: what a hostile or corrupt file may not make the loader do

nlohmann::json hf_json() { return nlohmann::json::parse(slurp(kHfPath)); }

Error hf_error(const nlohmann::json& j) {
  return expect_usage_error(
      [&] { parse_hf_tokenizer(j.dump(), "bad/tokenizer.json", "t", "<|end_of_text|>"); });
}

TEST(BpeLimits, TheFixtureLoadsFromItsText) {
  auto tok = parse_hf_tokenizer(slurp(kHfPath), kHfPath, "tiny-hf", "<|end_of_text|>");
  EXPECT_EQ(tok->vocab_size(), hf_fixture()->vocab_size());
  EXPECT_EQ(tok->fingerprint(), hf_fixture()->fingerprint());
  auto gpt2 = parse_gpt2_tokenizer(slurp(kGpt2Encoder), slurp(kGpt2Merges), kGpt2Encoder,
                                   kGpt2Merges, "tiny-gpt2", "<|endoftext|>");
  EXPECT_EQ(gpt2->fingerprint(), gpt2_fixture()->fingerprint());
}

TEST(BpeLimits, AHugeIdSizesNoTable) {
  // An id of 2^30 - 1 once sized a table of 2^30 tokens (32 GB) before any check.
  for (const int64_t id : {(int64_t{1} << 30) - 1, int64_t{275}, int64_t{1} << 40}) {
    SCOPED_TRACE(id);
    nlohmann::json j = hf_json();
    j["model"]["vocab"]["zzz"] = id;
    const Error e = hf_error(j);
    EXPECT_TRUE(contains(e.what(), "bad/tokenizer.json")) << e.what();
    EXPECT_TRUE(contains(e.what(), "model.vocab entry 'zzz' has id")) << e.what();
    EXPECT_TRUE(contains(e.what(), "outside 0..274")) << e.what();
  }
  nlohmann::json j = hf_json();
  j["added_tokens"][0]["id"] = int64_t{1} << 29;
  EXPECT_TRUE(contains(hf_error(j).what(), "added_tokens[0] has id 536870912, outside"));
  // The same in encoder.json.
  nlohmann::json encoder = nlohmann::json::parse(slurp(kGpt2Encoder));
  encoder["zzz"] = int64_t{1} << 30;
  const Error g = expect_usage_error([&] {
    parse_gpt2_tokenizer(encoder.dump(), slurp(kGpt2Merges), "bad/encoder.json", "bad/vocab.bpe",
                         "t", "<|endoftext|>");
  });
  EXPECT_TRUE(contains(g.what(), "bad/encoder.json: encoder.json entry 'zzz' has id 1073741824"))
      << g.what();
}

TEST(BpeLimits, NegativeNonIntegerAndRepeatedIds) {
  nlohmann::json j = hf_json();
  j["model"]["vocab"]["zzz"] = -1;
  EXPECT_TRUE(contains(hf_error(j).what(), "has id -1, outside"));
  j = hf_json();
  j["model"]["vocab"]["zzz"] = 1.5;
  EXPECT_TRUE(contains(hf_error(j).what(), "entry 'zzz' has no integer id"));
  j = hf_json();
  j["added_tokens"][1]["id"] = j["added_tokens"][0]["id"];
  EXPECT_TRUE(contains(hf_error(j).what(), "added_tokens has two tokens with id 272"));
  j = hf_json();
  j["added_tokens"][1]["id"] = "273";
  EXPECT_TRUE(contains(hf_error(j).what(), "added_tokens[1] has no integer id"));
}

TEST(BpeLimits, FieldsOfTheWrongTypeAreUsageErrors) {
  // nlohmann's value() throws its own type_error for these; the loader names the file instead.
  nlohmann::json j = hf_json();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = 5;
  EXPECT_TRUE(contains(hf_error(j).what(), "pre_tokenizer Split.behavior is not a string"));
  j = hf_json();
  j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = "yes";
  EXPECT_TRUE(contains(hf_error(j).what(), "ByteLevel.use_regex is not true or false"));
  j = hf_json();
  j["model"]["ignore_merges"] = 1;
  EXPECT_TRUE(contains(hf_error(j).what(), "model.ignore_merges is not true or false"));
  j = hf_json();
  j["model"]["byte_fallback"] = "no";
  hf_error(j);
  j = hf_json();
  j["model"]["end_of_word_suffix"] = 7;
  hf_error(j);
}

TEST(BpeLimits, PreTokenizerNestingAndStagesAreBounded) {
  const nlohmann::json base = hf_json();
  // Sequences nested 8 deep still load; 9 do not.
  auto nested = [&](int levels) {
    nlohmann::json node = base["pre_tokenizer"]["pretokenizers"][0];
    for (int i = 0; i < levels; ++i)
      node = nlohmann::json{{"type", "Sequence"}, {"pretokenizers", {node}}};
    nlohmann::json j = base;
    j["pre_tokenizer"] = node;
    return j;
  };
  EXPECT_EQ(parse_hf_tokenizer(nested(8).dump(), "t.json", "t", "<|end_of_text|>")
                ->pre_tokenize("Hello world")
                .size(),
            2u);
  const Error e = hf_error(nested(9));
  EXPECT_TRUE(contains(e.what(), "pre_tokenizer Sequences nest deeper than 8 levels")) << e.what();
  // Each stage is a level of recursion when text is split: at most 16 (ByteLevel without
  // its regex adds none).
  nlohmann::json wide = base;
  auto& list = wide["pre_tokenizer"]["pretokenizers"];
  while (list.size() < 18) list.push_back(base["pre_tokenizer"]["pretokenizers"][0]);
  EXPECT_TRUE(contains(hf_error(wide).what(), "more than 16 regex stages"));
}

TEST(BpeLimits, AnEmptyMatchAtTheEndReadsNothingPastTheText) {
  // A pattern that matches the empty string at the end of the text ("$") once made split()
  // read the byte after the text; in a buffer of exactly the text's size, AddressSanitizer
  // (make test-sanitize) sees that.
  nlohmann::json j = hf_json();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "$|l+"}}}, {"behavior", "Isolated"}};
  auto tok = parse_hf_tokenizer(j.dump(), "t.json", "t", "<|end_of_text|>");
  const std::string text = "hello";
  auto exact = std::make_unique<char[]>(text.size());
  std::memcpy(exact.get(), text.data(), text.size());
  const std::string_view view(exact.get(), text.size());
  EXPECT_EQ(tok->pre_tokenize(view), (std::vector<std::string>{"he", "ll", "o"}));
  EXPECT_EQ(tok->decode(tok->encode(view)), text);
}

TEST(BpeLimits, DeepJsonAndLargeFilesAreRefusedBeforeParsing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const Error e = expect_usage_error(
      [&] { parse_hf_tokenizer(deep, "deep/tokenizer.json", "t", "<|end_of_text|>"); });
  EXPECT_TRUE(contains(e.what(), "deep/tokenizer.json")) << e.what();
  EXPECT_TRUE(contains(e.what(), "deeper than")) << e.what();
  // A sparse file larger than any tokenizer: refused by its size, unread.
  TempDir dir("gradscope-tok");
  { std::ofstream(dir.file("huge.json")) << "{"; }
  fs::resize_file(dir.file("huge.json"), (uint64_t{256} << 20) + 1);
  const Error big =
      expect_usage_error([&] { load_hf_tokenizer(dir.file("huge.json"), "t", "<|end_of_text|>"); });
  EXPECT_TRUE(contains(big.what(), dir.file("huge.json"))) << big.what();
  EXPECT_TRUE(contains(big.what(), "more than the 268435456")) << big.what();
}

TEST(MakeTokenizer, MissingFilesGiveTheFetchHint) {
  TempDir dir("gradscope-tok");
  for (const char* name : {"gpt2", "llama3"}) {
    const Error e = expect_usage_error([&] { make_tokenizer(name, dir.path()); });
    EXPECT_TRUE(contains(e.what(), dir.path())) << e.what();
    EXPECT_TRUE(contains(e.hint(), "scripts/fetch-data.sh tokenizers")) << e.hint();
  }
}

// ---------------------------------------------------------------------------------------------
// the real files (scripts/fetch-data.sh tokenizers text)

std::unique_ptr<Tokenizer> real_tokenizer(const std::string& name) {
  const std::string probe =
      name == "gpt2" ? "/tokenizers/gpt2/vocab.bpe" : "/tokenizers/llama3/tokenizer.json";
  if (!fs::exists(data_dir() + probe)) return nullptr;
  return make_tokenizer(name, data_dir());
}

#define REQUIRE_REAL_TOKENIZER(tok, name)                                      \
  auto tok = real_tokenizer(name);                                             \
  if (!tok)                                                                    \
    GTEST_SKIP() << "tokenizer " << name << " not fetched into " << data_dir() \
                 << " (run scripts/fetch-data.sh tokenizers)";

// FNV-1a over the ids' little-endian bytes: a reference-independent digest of a long encoding.
uint64_t fnv1a(const Ids& ids) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int32_t id : ids)
    for (int k = 0; k < 4; ++k) {
      h ^= (static_cast<uint32_t>(id) >> (8 * k)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  return h;
}

std::string real_text(const std::string& relative) {
  const std::string path = data_dir() + "/" + relative;
  return fs::exists(path) ? slurp(path) : std::string();
}

TEST(RealTokenizers, Llama3KnownIds) {
  REQUIRE_REAL_TOKENIZER(tok, "llama3");
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->eot_id(), 128001);
  EXPECT_EQ(tok->encode("Hello"), (Ids{9906}));
  EXPECT_EQ(tok->encode(" world"), (Ids{1917}));
  EXPECT_EQ(tok->encode(" the"), (Ids{279}));
  EXPECT_EQ(tok->decode({128000, 9906, 128001}), "<|begin_of_text|>Hello<|end_of_text|>");
  // As HF tokenizers and transformers.js encode it.
  EXPECT_EQ(tok->encode("Hello world! It's 12345 \n\n  x"),
            (Ids{9906, 1917, 0, 1102, 596, 220, 4513, 1774, 4815, 220, 865}));
}

TEST(RealTokenizers, Gpt2KnownIds) {
  REQUIRE_REAL_TOKENIZER(tok, "gpt2");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eot_id(), 50256);
  EXPECT_EQ(tok->encode("Hello"), (Ids{15496}));
  EXPECT_EQ(tok->encode(" world"), (Ids{995}));
  EXPECT_EQ(tok->decode({50256}), "<|endoftext|>");
  // As OpenAI's encoder.py (and gpt-3-encoder) encode it.
  EXPECT_EQ(tok->encode("Hello world! It's 12345 \n\n  x"),
            (Ids{15496, 995, 0, 632, 338, 17031, 2231, 220, 628, 220, 2124}));
}

// Counts and digests of the whole of Moby-Dick as the reference implementations encode it
// (transformers.js for Llama 3, gpt-3-encoder for GPT-2).
TEST(RealTokenizers, MobyDickRoundTripAndReferenceIds) {
  const std::string text = real_text("text/moby-dick/data.txt");
  if (text.empty()) GTEST_SKIP() << "Moby-Dick not fetched (run scripts/fetch-data.sh text)";
  struct Expected {
    const char* name;
    size_t count;
    uint64_t digest;
  };
  for (const Expected& x : {Expected{"llama3", 298553, 0x7010c4295596286bULL},
                            Expected{"gpt2", 317756, 0x869e01de69469109ULL}}) {
    auto tok = real_tokenizer(x.name);
    if (!tok) GTEST_SKIP() << "tokenizer " << x.name << " not fetched";
    const auto start = std::chrono::steady_clock::now();
    const Ids ids = tok->encode(text);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("[          ] %s: Moby-Dick %zu bytes -> %zu tokens in %.2f s\n", x.name,
                text.size(), ids.size(), seconds);
    EXPECT_EQ(ids.size(), x.count) << x.name;
    EXPECT_EQ(fnv1a(ids), x.digest) << x.name;
    EXPECT_TRUE(tok->decode(ids) == text) << x.name << ": decode(encode(text)) != text";
  }
}

TEST(RealTokenizers, SotuThroughput) {
  const fs::path dir = data_dir() + "/text/sotu";
  if (!fs::is_directory(dir)) GTEST_SKIP() << "SOTU not fetched (run scripts/fetch-data.sh text)";
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".txt") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  std::string all;
  for (const auto& f : files) all += slurp(f);
  for (const char* name : {"bytes", "gpt2", "llama3"}) {
    auto tok = std::string(name) == "bytes" ? make_tokenizer("bytes", "") : real_tokenizer(name);
    if (!tok) continue;
    const auto start = std::chrono::steady_clock::now();
    const Ids ids = tok->encode(all);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("[          ] %s: SOTU %zu bytes -> %zu tokens in %.2f s (%.1f MB/s)\n", name,
                all.size(), ids.size(), seconds, all.size() / seconds / 1e6);
    EXPECT_LT(seconds, 30.0) << name << " is far slower than expected";
    if (std::string(name) == "llama3") {
      // The concatenated addresses, as transformers.js encodes them.
      EXPECT_EQ(ids.size(), 2085319u);
      EXPECT_EQ(fnv1a(ids), 0x51de1e99f4b18235ULL);
    }
  }
}

}  // namespace
}  // namespace gradscope
