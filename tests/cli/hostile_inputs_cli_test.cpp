// Input files that claim more than they hold, or are not files at all: sizes in config.json
// and in a safetensors header are checked before anything of their size is allocated or read,
// a pre-tokenizer regex runs under limits, and a FIFO, a folder or a dangling link where a
// file is read is refused by name. Each gradscope here runs bounded (address space, time),
// and the peak resident memory of the refusals is measured.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/files.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::slurp;
using testing::TempDir;

const std::string kFixtureText = testing::fixture("text/sotu-excerpt.txt");
const std::string kInputsRun =
    "run --model llama --preset tiny --seq 32 --batch 2 --warmup-steps 0 --eval-batches 1 "
    "--quiet --no-db ";

struct Bounded {
  int code = -1;             // exit code, 128 + signal, or -1 when killed at the deadline
  std::string out, err;
  int64_t peak_rss_kb = 0;  // the process's own peak resident memory
};

// Runs `gradscope ARGS` (shell words) under a 4 GiB address space and `seconds` of time.
Bounded run_bounded(const std::string& args, int seconds = 120) {
  TempDir tmp("gradscope-bounded");
  const std::string cmd = fmt::format("exec {} {} >{} 2>{} </dev/null", GRADSCOPE_BINARY, args,
                                      tmp.file("out"), tmp.file("err"));
  const pid_t pid = fork();
  if (pid == 0) {
    const rlimit space{rlim_t{4} << 30, rlim_t{4} << 30};
    setrlimit(RLIMIT_AS, &space);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  Bounded r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  rusage usage{};
  while (wait4(pid, &status, WNOHANG, &usage) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &usage);
      r.err = slurp(tmp.file("err"));
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(tmp.file("out"));
  r.err = slurp(tmp.file("err"));
  r.peak_rss_kb = usage.ru_maxrss;
  return r;
}

// A refusal's peak: LibTorch and the binary take about 130 MiB before anything is read.
constexpr int64_t kRefusalPeakKb = 512 * 1024;

// Weights of the tiny Llama saved by a one-step run: config.json and model.safetensors.
std::string saved_weights(const TempDir& dir) {
  const std::string weights = dir.file("weights");
  const auto r = testing::run_gradscope(kInputsRun + "--steps 1 --json " + dir.file("r.json") +
                                        " --dataset " + kFixtureText + " --save-weights " +
                                        weights);
  EXPECT_EQ(r.code, 0) << r.err;
  return weights;
}

// A copy of the weights folder with `key` of its config.json set to `value`.
std::string with_config(const TempDir& dir, const std::string& weights, const std::string& name,
                        const std::string& key, const nlohmann::json& value) {
  const std::string copy = dir.file(name);
  fs::create_directory(copy);
  fs::copy_file(weights + "/model.safetensors", copy + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(slurp(weights + "/config.json"));
  config[key] = value;
  std::ofstream(copy + "/config.json") << config.dump(2);
  return copy;
}

TEST(HostileInputs, ConfigSizesAreCheckedBeforeTheModelIsBuilt) {
  TempDir dir("gradscope-config-sizes");
  const std::string weights = saved_weights(dir);
  const std::string run = kInputsRun + "--steps 1 --json " + dir.file("r2.json") + " --init-from ";

  // Above the stated limits: refused by key while the config is read.
  const std::string layers =
      with_config(dir, weights, "layers", "num_hidden_layers", int64_t{1'000'000'000});
  Bounded r = run_bounded(run + layers);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, layers + "/config.json: 'num_hidden_layers' is 1000000000, more "
                              "than the 1024 gradscope allows"))
      << r.err;
  EXPECT_LT(r.peak_rss_kb, kRefusalPeakKb);

  const std::string huge = with_config(dir, weights, "huge", "vocab_size", int64_t{12'000'000});
  r = run_bounded(run + huge);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "'vocab_size' is 12000000, more than the 4194304")) << r.err;
  EXPECT_LT(r.peak_rss_kb, kRefusalPeakKb);

  // Within the limits but not what the weights beside it hold: refused from the safetensors
  // header before a model of a 4M-token vocabulary (1 GB of embedding) is built.
  const std::string vocab = with_config(dir, weights, "vocab", "vocab_size", int64_t{4'000'000});
  r = run_bounded(run + vocab);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "tensor 'model.embed_tokens.weight' has shape [320, 64] where the "
                              "architecture has [4000000, 64]"))
      << r.err;
  EXPECT_LT(r.peak_rss_kb, kRefusalPeakKb);
}

TEST(HostileInputs, AnExtraTensorIsRefusedFromTheHeaderBeforeAnyDataIsRead) {
  TempDir dir("gradscope-extra-tensor");
  const std::string weights = saved_weights(dir);
  // The saved tensors, then a 2 GiB tensor the file claims but holds as a hole (sparse).
  const std::string folder = dir.file("extra");
  fs::create_directory(folder);
  fs::copy_file(weights + "/config.json", folder + "/config.json");
  const std::string file = slurp(weights + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  nlohmann::json header = nlohmann::json::parse(file.substr(8, n));
  const std::string data = file.substr(8 + n);
  const int64_t begin = static_cast<int64_t>(data.size()), bytes = int64_t{2} << 30;
  header["extra.weight"] = {
      {"dtype", "F32"}, {"shape", {bytes / 4}}, {"data_offsets", {begin, begin + bytes}}};
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  const std::string path = folder + "/model.safetensors";
  std::ofstream(path, std::ios::binary) << length << text << data;
  fs::resize_file(path, 8 + text.size() + data.size() + bytes);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  ASSERT_LT(st.st_blocks * 512, int64_t{16} << 20) << "the file should be sparse";

  const Bounded r =
      run_bounded(kInputsRun + "--steps 1 --json " + dir.file("r2.json") + " --init-from " + folder);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "holds 1 tensor that llama's published layout does not have: "
                              "'extra.weight'"))
      << r.err;
  EXPECT_LT(r.peak_rss_kb, kRefusalPeakKb);
}

// The tiny tokenizer fixture with one Split pattern.
std::string tokenizer_with(const TempDir& dir, const std::string& pattern) {
  nlohmann::json j =
      nlohmann::json::parse(slurp(testing::fixture("tokenizer/tiny_hf_tokenizer.json")));
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}};
  const std::string path = dir.file("tokenizer.json");
  std::ofstream(path) << j.dump();
  return path;
}

TEST(HostileInputs, ABacktrackingPreTokenizerIsRefusedNamingTheTokenizerAndTheRegex) {
  TempDir dir("gradscope-regex");
  // Polynomial: each search tries every split of a run of letters and spaces five ways; with
  // PCRE2's default limits each stays under them and the text takes hours.
  const std::string polynomial = R"([\p{L}\s]*[\p{L}\s]*[\p{L}\s]*[\p{L}\s]*[\p{L}\s]*Q|[\s\S])";
  std::string tokenizer = tokenizer_with(dir, polynomial);
  const auto start = std::chrono::steady_clock::now();
  Bounded r = run_bounded("tokenize --tokenizer " + tokenizer + " " + kFixtureText, 60);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "tokenizer " + tokenizer + ": pre-tokenizer regex '" + polynomial +
                                  "' passed PCRE2's limits"))
      << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  // Exponential: the limit ends it as bad input (exit 2), and the hint blames the pattern.
  std::ofstream(dir.file("a.txt")) << std::string(40, 'a') << "!";
  tokenizer = tokenizer_with(dir, "(a+)+$");
  r = run_bounded("tokenize --tokenizer " + tokenizer + " " + dir.file("a.txt"), 60);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "pre-tokenizer regex '(a+)+$' passed PCRE2's limits")) << r.err;
  EXPECT_TRUE(contains(r.err, "hint: the pattern backtracks")) << r.err;
}

TEST(HostileInputs, AFifoAsTheTrainingStateIsRefusedNotWaitedFor) {
  TempDir dir("gradscope-fifo-state");
  const std::string state = dir.file("state");
  const std::string run = kInputsRun + "--steps 4 --state-every 2 --json " + dir.file("r.json") +
                          " --dataset " + kFixtureText + " --save-state " + state;
  const auto first = testing::run_gradscope(run);
  ASSERT_EQ(first.code, 0) << first.err;
  ASSERT_TRUE(fs::exists(state + "/model.pt"));
  fs::remove(state + "/model.pt");
  ASSERT_EQ(mkfifo((state + "/model.pt").c_str(), 0600), 0);
  const Bounded r = run_bounded(run + " --resume " + state, 60);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, state + "/model.pt is a FIFO (named pipe), not a regular file"))
      << r.err;
}

TEST(HostileInputs, AConfigJsonThatIsNotAFileIsRefusedNeverIgnored) {
  TempDir dir("gradscope-config-kinds");
  const std::string weights = saved_weights(dir);
  const std::string run = kInputsRun + "--steps 1 --json " + dir.file("r2.json") + " --init-from ";
  const auto folder_with = [&](const std::string& name) {
    const std::string copy = dir.file(name);
    fs::create_directory(copy);
    fs::copy_file(weights + "/model.safetensors", copy + "/model.safetensors");
    return copy;
  };
  const std::string fifo = folder_with("fifo");
  ASSERT_EQ(mkfifo((fifo + "/config.json").c_str(), 0600), 0);
  const std::string folder = folder_with("folder");
  fs::create_directory(folder + "/config.json");
  const std::string dangling = folder_with("dangling");
  fs::create_symlink("nowhere.json", dangling + "/config.json");
  for (const auto& [path, what] :
       {std::pair{fifo, "is a FIFO (named pipe), not a regular file"},
        std::pair{folder, "is a folder, not a regular file"},
        std::pair{dangling, "is a symbolic link to nothing"}}) {
    const Bounded r = run_bounded(run + path, 60);
    EXPECT_EQ(r.code, 2) << path << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "model config " + path + "/config.json " + what)) << r.err;
  }
}

TEST(HostileInputs, RepeatedKeysInConfigsAndRecordsAreRefused) {
  TempDir dir("gradscope-repeated");
  const std::string weights = saved_weights(dir);
  // A parser keeps the last of two equal keys: 2 layers here would silently become 3.
  std::string config = slurp(weights + "/config.json");
  const std::string key = "\"num_hidden_layers\": 2,";
  ASSERT_TRUE(contains(config, key)) << config;
  config.replace(config.find(key), key.size(), key + " \"num_hidden_layers\": 3,");
  std::ofstream(weights + "/config.json") << config;
  const Bounded r = run_bounded(kInputsRun + "--steps 1 --json " + dir.file("r2.json") +
                                " --init-from " + weights);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, weights + "/config.json: key 'num_hidden_layers' appears twice"))
      << r.err;

  // A record read back by collect: its run id twice.
  fs::create_directory(dir.file("results"));
  std::string record = slurp(dir.file("r.json"));
  ASSERT_EQ(record.substr(0, 1), "{");
  record.insert(1, "\"run_id\": \"another\", ");
  std::ofstream(dir.file("results/a.json")) << record;
  const auto c = testing::run_gradscope("collect " + dir.file("results") + " --db " +
                                        dir.file("m.db"));
  EXPECT_EQ(c.code, 2) << c.out << c.err;
  EXPECT_TRUE(contains(c.err, "refused: " + dir.file("results/a.json") +
                                  ": key 'run_id' appears twice"))
      << c.err;
}

}  // namespace
}  // namespace gradscope
