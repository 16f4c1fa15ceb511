// The fuzzers' corpora, replayed in the normal build: every file of fuzz/corpus/<name>/ goes
// through its target (fuzz/targets.h), which must end in a result or a gradscope::Error, never
// in another exception or a crash. The corpora hold the fixtures the fuzzers started from,
// what they found worth keeping (merged, minimized) and the inputs of bugs they found, so a
// bug once fixed stays fixed without a fuzzer (docs/testing.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz/targets.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;

const fs::path kCorpusRoot = fs::path(GRADSCOPE_SOURCE_DIR) / "fuzz" / "corpus";

void replay_corpus(const std::string& name) {
  const auto& targets = fuzz_targets();
  const auto target = std::find_if(targets.begin(), targets.end(),
                                   [&](const FuzzTarget& t) { return name == t.name; });
  ASSERT_NE(target, targets.end()) << "no fuzz target " << name;
  const fs::path folder = kCorpusRoot / name;
  ASSERT_TRUE(fs::is_directory(folder)) << folder << " is missing";
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty()) << folder << " holds no inputs";
  for (const auto& file : files) {
    SCOPED_TRACE(file.string());
    const std::string bytes = testing::slurp(file.string());
    EXPECT_NO_THROW(target->run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  }
}

TEST(FuzzCorpus, EveryTargetHasAFolderAndEveryFolderATarget) {
  std::vector<std::string> names;
  for (const auto& t : fuzz_targets()) names.push_back(t.name);
  for (const auto& name : names)
    EXPECT_TRUE(fs::is_directory(kCorpusRoot / name)) << kCorpusRoot / name << " is missing";
  for (const auto& entry : fs::directory_iterator(kCorpusRoot))
    EXPECT_NE(std::find(names.begin(), names.end(), entry.path().filename().string()), names.end())
        << entry.path() << " belongs to no fuzz target";
}

TEST(FuzzCorpus, TokenizerJson) { replay_corpus("tokenizer_json"); }
TEST(FuzzCorpus, Gpt2Vocab) { replay_corpus("gpt2_vocab"); }
TEST(FuzzCorpus, Idx) { replay_corpus("idx"); }
TEST(FuzzCorpus, Png) { replay_corpus("png"); }
TEST(FuzzCorpus, SweepFile) { replay_corpus("sweep_file"); }
TEST(FuzzCorpus, RunRecord) { replay_corpus("run_record"); }
TEST(FuzzCorpus, Safetensors) { replay_corpus("safetensors"); }
TEST(FuzzCorpus, HfConfig) { replay_corpus("hf_config"); }
TEST(FuzzCorpus, TrainState) { replay_corpus("train_state"); }
TEST(FuzzCorpus, MemoryTimeline) { replay_corpus("memory_timeline"); }

}  // namespace
}  // namespace gradscope
