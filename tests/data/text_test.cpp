// Text corpus: the data stream depends on (seed, sample index) only; windows, shifts, splits,
// the per-epoch permutation, the token cache and its failure modes. Fixture corpus:
// tests/fixtures/text/tiny (two short documents, non-ASCII included), bytes tokenizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/data/bpe.h"
#include "gradscope/data/text.h"
#include "gradscope/data/tokenizer.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = std::string(GRADSCOPE_FIXTURES) + "/text/tiny";
constexpr int64_t kSeq = 8;

using testing::contains;
using testing::expect_usage_error;
using testing::slurp;
using testing::TempDir;

class TextCorpusTest : public ::testing::Test {
 protected:
  TextCorpus corpus(uint64_t seed, int64_t seq = kSeq) {
    return TextCorpus(kTiny, *bytes_, dir_.path(), seq, seed);
  }
  std::unique_ptr<Tokenizer> bytes_ = make_tokenizer("bytes", "");
  TempDir dir_{"gradscope-text"};  // a fresh data directory; token caches land in cache/
};

TEST_F(TextCorpusTest, DocumentsJoinedWithEotInNameOrder) {
  const TextCorpus c = corpus(1);
  std::vector<int32_t> expected = bytes_->encode(slurp(kTiny + "/a.txt"));
  expected.push_back(kBytesEosId);
  const auto b = bytes_->encode(slurp(kTiny + "/b.txt"));
  expected.insert(expected.end(), b.begin(), b.end());
  EXPECT_EQ(c.tokens(), expected);
}

TEST_F(TextCorpusTest, SameSeedSameSamplesWhateverBatchSplit) {
  const TextCorpus c = corpus(7);
  const TextBatch whole = c.train_batch(0, 8);
  const TextBatch head = c.train_batch(0, 3);
  const TextBatch tail = c.train_batch(3, 5);
  EXPECT_TRUE(torch::equal(whole.input_ids, torch::cat({head.input_ids, tail.input_ids})));
  EXPECT_TRUE(torch::equal(whole.targets, torch::cat({head.targets, tail.targets})));
  // Another corpus object (its own permutation cache), reading in another order.
  const TextCorpus d = corpus(7);
  EXPECT_TRUE(torch::equal(d.train_batch(500, 4).input_ids, c.train_batch(500, 4).input_ids));
  EXPECT_TRUE(torch::equal(d.train_batch(0, 8).input_ids, whole.input_ids));
  // Across an epoch boundary too.
  const int64_t w = c.train_windows();
  const TextBatch across = c.train_batch(w - 2, 4);
  EXPECT_TRUE(torch::equal(across.input_ids.slice(0, 2, 4), d.train_batch(w, 2).input_ids));
}

TEST_F(TextCorpusTest, TargetsAreInputsShiftedByOne) {
  const TextCorpus c = corpus(3);
  const TextBatch batch = c.train_batch(10, 6);
  ASSERT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{6, kSeq}));
  ASSERT_EQ(batch.targets.sizes(), (std::vector<int64_t>{6, kSeq}));
  EXPECT_EQ(batch.input_ids.dtype(), torch::kInt64);
  EXPECT_EQ(batch.targets.dtype(), torch::kInt64);
  EXPECT_TRUE(batch.input_ids.device().is_cpu());
  EXPECT_TRUE(torch::equal(batch.targets.slice(1, 0, kSeq - 1), batch.input_ids.slice(1, 1)));
  for (int64_t b = 0; b < 6; ++b) {
    const int64_t start = c.train_window(10 + b) * kSeq;
    for (int64_t t = 0; t < kSeq; ++t) {
      EXPECT_EQ(batch.input_ids[b][t].item<int64_t>(), c.tokens()[start + t]);
      EXPECT_EQ(batch.targets[b][t].item<int64_t>(), c.tokens()[start + t + 1]);
    }
  }
}

TEST_F(TextCorpusTest, PermutationCoversEveryWindowOncePerEpoch) {
  const TextCorpus c = corpus(11);
  const int64_t w = c.train_windows();
  ASSERT_EQ(w, (c.train_tokens() - 1) / kSeq);
  std::vector<int64_t> orders[3];
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    for (int64_t i = epoch * w; i < (epoch + 1) * w; ++i) {
      const int64_t window = c.train_window(i);
      ASSERT_GE(window, 0);
      ASSERT_LT(window, w);
      seen.insert(window);
      orders[epoch].push_back(window);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), w) << "epoch " << epoch;
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  // Training windows never read validation tokens.
  EXPECT_LE((w - 1) * kSeq + kSeq + 1, c.split_index());
}

TEST_F(TextCorpusTest, DifferentSeedsDiffer) {
  const TextCorpus a = corpus(1);
  const TextCorpus b = corpus(2);
  EXPECT_FALSE(torch::equal(a.train_batch(0, 16).input_ids, b.train_batch(0, 16).input_ids));
  EXPECT_EQ(a.tokens(), b.tokens());  // the seed changes the order, not the data
}

TEST_F(TextCorpusTest, ValidationIsTheLastTwoPercent) {
  const TextCorpus c = corpus(5);
  const auto n = static_cast<int64_t>(c.tokens().size());
  EXPECT_EQ(c.split_index(), n - n / 50);
  EXPECT_EQ(c.train_tokens() + c.val_tokens(), n);
  EXPECT_EQ(c.val_windows(), (c.val_tokens() - 1) / kSeq);
  ASSERT_GE(c.val_windows(), 1);
  const TextBatch val = c.val_batch(0, c.val_windows());
  for (int64_t k = 0; k < c.val_windows(); ++k)
    for (int64_t t = 0; t < kSeq; ++t) {
      EXPECT_EQ(val.input_ids[k][t].item<int64_t>(), c.tokens()[c.split_index() + k * kSeq + t]);
      EXPECT_EQ(val.targets[k][t].item<int64_t>(), c.tokens()[c.split_index() + k * kSeq + t + 1]);
    }
  // In order and wrapping around; independent of the seed.
  EXPECT_TRUE(
      torch::equal(c.val_batch(c.val_windows(), 1).input_ids, val.input_ids.slice(0, 0, 1)));
  EXPECT_TRUE(torch::equal(corpus(99).val_batch(0, 2).input_ids, c.val_batch(0, 2).input_ids));
}

TEST_F(TextCorpusTest, SingleFileDatasetAndRegistry) {
  const TextCorpus c(kTiny + "/a.txt", *bytes_, dir_.path(), kSeq, 1);
  EXPECT_EQ(c.tokens(), bytes_->encode(slurp(kTiny + "/a.txt")));
  const auto& reg = text_dataset_registry();
  EXPECT_EQ(reg.names(), (std::vector<std::string>{"sotu", "moby-dick", "brown"}));
  EXPECT_EQ(reg.get("moby-dick"), "text/moby-dick");
}

TEST_F(TextCorpusTest, CacheIsReusedAndADamagedCacheIsRebuilt) {
  const TextCorpus first = corpus(1);
  EXPECT_FALSE(first.loaded_from_cache());
  ASSERT_TRUE(fs::exists(first.cache_path())) << first.cache_path();
  EXPECT_EQ(fs::path(first.cache_path()).parent_path(), dir_.fs_path() / "cache");
  const TextCorpus second = corpus(2);
  EXPECT_TRUE(second.loaded_from_cache());
  EXPECT_EQ(second.cache_path(), first.cache_path());
  EXPECT_EQ(second.tokens(), first.tokens());

  // Flip one token byte: the checksum catches it.
  {
    std::fstream f(first.cache_path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24 + 4 * 10);
    f.put('\x7f');
  }
  const TextCorpus third = corpus(3);
  EXPECT_FALSE(third.loaded_from_cache());
  EXPECT_EQ(third.tokens(), first.tokens());
  // Truncate it: the size check catches it.
  fs::resize_file(first.cache_path(), 30);
  const TextCorpus fourth = corpus(4);
  EXPECT_FALSE(fourth.loaded_from_cache());
  EXPECT_EQ(fourth.tokens(), first.tokens());
  EXPECT_TRUE(corpus(5).loaded_from_cache());  // rebuilt whole

  // Another tokenizer or other contents use another cache file.
  auto other = std::make_unique<TempDir>("gradscope-text");
  fs::copy(kTiny, other->fs_path() / "tiny");
  { std::ofstream(other->fs_path() / "tiny" / "b.txt", std::ios::app) << "one more line\n"; }
  const TextCorpus changed((other->fs_path() / "tiny").string(), *bytes_, dir_.path(), kSeq, 1);
  EXPECT_FALSE(changed.loaded_from_cache());
  EXPECT_NE(changed.cache_path(), first.cache_path());
  EXPECT_EQ(changed.tokens().size(), first.tokens().size() + 14);
}

// Rewrites the cache at `path` with these tokens and a matching checksum (the layout of
// text.cpp: magic, key, count, tokens, checksum), as a corrupt writer could leave it.
void rewrite_cache(const std::string& path, const std::vector<int32_t>& tokens,
                   uint64_t count_field) {
  const std::string old = slurp(path);
  const uint64_t checksum = content_hash(
      std::string_view(reinterpret_cast<const char*>(tokens.data()), 4 * tokens.size()),
      0x746f6b73);
  std::string bytes = old.substr(0, 16);
  bytes.append(reinterpret_cast<const char*>(&count_field), 8);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), 4 * tokens.size());
  bytes.append(reinterpret_cast<const char*>(&checksum), 8);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST_F(TextCorpusTest, CacheIdsOutsideTheVocabularyAreRebuilt) {
  const TextCorpus first = corpus(1);
  // A whole cache with a right checksum whose ids the model could not embed: tokenized again.
  std::vector<int32_t> bad = first.tokens();
  bad[3] = 260;  // the bytes tokenizer's ids are 0..259
  rewrite_cache(first.cache_path(), bad, bad.size());
  const TextCorpus second = corpus(2);
  EXPECT_FALSE(second.loaded_from_cache());
  EXPECT_EQ(second.tokens(), first.tokens());
  bad[3] = -7;
  rewrite_cache(first.cache_path(), bad, bad.size());
  EXPECT_FALSE(corpus(3).loaded_from_cache());
  EXPECT_TRUE(corpus(4).loaded_from_cache());
}

TEST_F(TextCorpusTest, ACacheCountBeyondTheFileIsNotAllocated) {
  const TextCorpus first = corpus(1);
  // The count says 2^39 tokens (2 TiB); the file holds a few hundred bytes. The count is checked
  // against the file's size before anything is sized by it.
  for (const uint64_t count :
       {uint64_t{1} << 39, ~uint64_t{0}, uint64_t{first.tokens().size() + 1}}) {
    SCOPED_TRACE(count);
    rewrite_cache(first.cache_path(), first.tokens(), count);
    const TextCorpus again = corpus(2);
    EXPECT_FALSE(again.loaded_from_cache());
    EXPECT_EQ(again.tokens(), first.tokens());
  }
}

TEST_F(TextCorpusTest, CacheIsWrittenWholeWithNoTemporaryLeft) {
  const TextCorpus first = corpus(1);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_.fs_path() / "cache"))
    names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{fs::path(first.cache_path()).filename().string()});
  // A cache folder that cannot be written costs only the cache.
  fs::remove_all(dir_.fs_path() / "cache");
  { std::ofstream(dir_.fs_path() / "cache") << "a file where the folder should be"; }
  const TextCorpus second = corpus(2);
  EXPECT_FALSE(second.loaded_from_cache());
  EXPECT_EQ(second.tokens(), first.tokens());
}

TEST_F(TextCorpusTest, MissingDataGivesTheFetchHint) {
  for (const char* name : {"sotu", "moby-dick", "brown"}) {
    const Error e = expect_usage_error([&] { TextCorpus(name, *bytes_, dir_.path(), kSeq, 1); });
    EXPECT_TRUE(contains(e.what(), name)) << e.what();
    EXPECT_TRUE(contains(e.hint(), "scripts/fetch-data.sh text")) << e.hint();
  }
}

TEST_F(TextCorpusTest, UnknownDatasetListsTheValidOnes) {
  const Error e =
      expect_usage_error([&] { TextCorpus("wikipedia", *bytes_, dir_.path(), kSeq, 1); });
  EXPECT_TRUE(contains(e.what(), "wikipedia")) << e.what();
  EXPECT_TRUE(contains(e.hint(), "sotu, moby-dick, brown")) << e.hint();
}

TEST_F(TextCorpusTest, TooFewTokensNamesTheCounts) {
  const auto n = static_cast<int64_t>(corpus(1).tokens().size());
  // Enough for a training window but not for a validation one.
  const int64_t seq = n / 50;
  const Error e = expect_usage_error([&] { corpus(1, seq); });
  EXPECT_TRUE(contains(e.what(), kTiny)) << e.what();
  EXPECT_TRUE(contains(e.what(), std::to_string(n) + " tokens")) << e.what();
  EXPECT_TRUE(contains(e.what(), std::to_string(n / 50) + " for validation")) << e.what();
  expect_usage_error([&] { corpus(1, 0); });
}

// ---------------------------------------------------------------------------------------------

TEST(EpochPermutation, IsAPermutationAndDependsOnSeedAndEpochOnly) {
  for (int64_t n : {1, 2, 10, 1000}) {
    auto p = epoch_permutation(42, 3, n);
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
    EXPECT_EQ(p, epoch_permutation(42, 3, n));
  }
  EXPECT_NE(epoch_permutation(42, 0, 100), epoch_permutation(42, 1, 100));
  EXPECT_NE(epoch_permutation(42, 0, 100), epoch_permutation(43, 0, 100));
}

TEST(UnigramEntropy, KnownDistributions) {
  EXPECT_DOUBLE_EQ(unigram_entropy_nats({5, 5, 5}, 0, 3), 0.0);
  EXPECT_NEAR(unigram_entropy_nats({0, 1, 0, 1}, 0, 4), std::log(2.0), 1e-12);
  EXPECT_NEAR(unigram_entropy_nats({0, 1, 2, 3}, 0, 4), std::log(4.0), 1e-12);
  // p = (3/4, 1/4)
  EXPECT_NEAR(unigram_entropy_nats({9, 7, 7, 7}, 0, 4),
              -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
  // Only the range counts.
  EXPECT_NEAR(unigram_entropy_nats({1, 2, 3, 3, 4, 4}, 2, 6), std::log(2.0), 1e-12);
  EXPECT_EQ(unigram_entropy_nats({1, 2}, 1, 1), 0.0);
  expect_usage_error([] { unigram_entropy_nats({1, 2}, 1, 3); });
}

// ---------------------------------------------------------------------------------------------
// the real SOTU corpus: cold (tokenize + write cache) and warm (read cache) load times

TEST(RealTextCorpus, SotuColdAndWarm) {
  const fs::path text = data_dir() + "/text";
  if (!fs::is_directory(text / "sotu"))
    GTEST_SKIP() << "SOTU not fetched into " << data_dir() << " (run scripts/fetch-data.sh text)";
  // A scratch data directory that sees the real text but has its own (empty) cache.
  TempDir scratch("gradscope-text");
  fs::create_directory_symlink(fs::absolute(text), scratch.fs_path() / "text");
  std::vector<std::string> names{"bytes"};
  if (fs::exists(data_dir() + "/tokenizers/gpt2/vocab.bpe")) names.push_back("gpt2");
  if (fs::exists(data_dir() + "/tokenizers/llama3/tokenizer.json")) names.push_back("llama3");
  for (const auto& name : names) {
    auto tok = make_tokenizer(name, data_dir());
    double seconds[2];
    size_t count = 0;
    for (int pass = 0; pass < 2; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      const TextCorpus c("sotu", *tok, scratch.path(), 128, 1);
      seconds[pass] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_EQ(c.loaded_from_cache(), pass == 1) << name;
      if (pass == 0) count = c.tokens().size();
      EXPECT_EQ(c.tokens().size(), count) << name;
      // 233 addresses, joined by 232 end-of-text ids.
      EXPECT_EQ(std::count(c.tokens().begin(), c.tokens().end(), tok->eot_id()), 232) << name;
      const double h = unigram_entropy_nats(c.tokens(), 0, c.split_index());
      EXPECT_GT(h, 1.0);
      EXPECT_LT(h, std::log(static_cast<double>(tok->vocab_size())));
    }
    std::printf("[          ] %s: SOTU corpus %zu tokens, cold %.2f s, warm (cache) %.2f s\n",
                name.c_str(), count, seconds[0], seconds[1]);
  }
}

}  // namespace
}  // namespace gradscope
