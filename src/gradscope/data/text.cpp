#include "gradscope/data/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/log.h"
#include "gradscope/core/rng.h"
#include "gradscope/data/bpe.h"

namespace gradscope {
namespace fs = std::filesystem;

namespace {

// Bumped whenever the cache layout or the way documents are joined changes.
constexpr char kCacheMagic[8] = {'G', 'S', 'T', 'O', 'K', 'v', '1', '\n'};
constexpr uint64_t kPermutationStream = 0x7065726d75746531ULL;  // "permute1"

struct Document {
  std::string name;  // file name, for the content key
  std::string text;
};

std::string fetch_hint(const std::string& data_dir) {
  return "run scripts/fetch-data.sh text (or make data) to fetch it into " + data_dir +
         " ($GRADSCOPE_DATA, default ~/.cache/gradscope)";
}

std::string read_text_file(const fs::path& path) {
  check_input_file(path.string(), "text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_usage("cannot read " + path.string(), "check the file's permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The .txt files of a folder, sorted by name so the stream never depends on directory order.
std::vector<fs::path> text_files(const fs::path& dir) {
  std::vector<fs::path> files;
  // A .txt entry that is not a regular file (a FIFO, a dangling link) is refused when it is
  // read, not skipped: the data set would silently lack it.
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".txt") files.push_back(entry.path());
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  return files;
}

// Resolves a data set name or path to its files; `label` names it in messages and caches.
std::vector<fs::path> resolve_dataset(const std::string& dataset, const std::string& data_dir,
                                      std::string& label) {
  const auto& registry = text_dataset_registry();
  if (registry.contains(dataset)) {
    label = dataset;
    const fs::path dir = fs::path(data_dir) / registry.get(dataset);
    if (!fs::is_directory(dir))
      fail_usage("text data set '" + dataset + "' is missing: " + dir.string() + " does not exist",
                 fetch_hint(data_dir));
    auto files = text_files(dir);
    if (files.empty())
      fail_usage(
          "text data set '" + dataset + "' is missing: " + dir.string() + " holds no .txt files",
          fetch_hint(data_dir));
    return files;
  }
  std::error_code ec;
  const fs::path path(dataset);
  if (fs::is_directory(path, ec)) {
    const fs::path normal = fs::absolute(path).lexically_normal();
    label = (normal.has_filename() ? normal : normal.parent_path()).filename().string();
    auto files = text_files(path);
    if (files.empty())
      fail_usage("text data set folder " + dataset + " holds no .txt files",
                 "point --dataset at a .txt file or a folder of .txt files");
    return files;
  }
  // Anything else there must be a text file: a FIFO or a dangling link is refused by name.
  if (optional_input_file(dataset, "text data file")) {
    label = path.stem().string();
    return {path};
  }
  fail_usage("unknown text data set '" + dataset + "'",
             "valid text data sets: " + registry.names_joined() +
                 ", or a path to a .txt file or a folder of .txt files");
}

// Keeps cache file names readable and safe whatever the data set path was.
std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '_';
  return out.empty() ? "text" : out.substr(0, 40);
}

uint64_t tokens_checksum(const std::vector<int32_t>& tokens) {
  return content_hash(std::string_view(reinterpret_cast<const char*>(tokens.data()),
                                       tokens.size() * sizeof(int32_t)),
                      0x746f6b73);
}

// Layout: magic[8], key u64, count u64, count x int32 tokens, checksum u64 (little-endian,
// native; a cache is not meant to move between machines of different byte order).
constexpr uint64_t kCacheHeaderBytes = 24;
constexpr uint64_t kCacheMaxTokens = uint64_t{1} << 40;

// The cached tokens, or false when there is no usable cache. A damaged one (short, long, a
// count that does not match the file's size, a wrong checksum, an id outside the vocabulary)
// is ignored with a warning and tokenized again; the count is checked against the file's
// size before anything that size is allocated.
bool read_cache(const std::string& path, uint64_t key, int64_t vocab_size,
                std::vector<int32_t>& tokens) {
  std::error_code status_error;
  const fs::file_status status = fs::status(path, status_error);
  if (!fs::exists(status)) return false;
  if (!fs::is_regular_file(status)) {  // never opened: a FIFO would block the read
    log_warn("ignoring the token cache {}: it is not a regular file; tokenizing again", path);
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  const auto damaged = [&](const char* why) {
    log_warn("ignoring the damaged token cache {} ({}); tokenizing again", path, why);
    tokens.clear();
    return false;
  };
  char magic[8];
  uint64_t stored_key = 0, count = 0, checksum = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&stored_key), 8);
  in.read(reinterpret_cast<char*>(&count), 8);
  if (!in || std::memcmp(magic, kCacheMagic, 8) != 0) return damaged("bad header");
  if (stored_key != key) return damaged("made for other text or another tokenizer");
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || count > kCacheMaxTokens || size != kCacheHeaderBytes + 4 * count + 8)
    return damaged("its size does not match its token count");
  tokens.resize(count);
  in.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(4 * count));
  in.read(reinterpret_cast<char*>(&checksum), 8);
  if (!in || checksum != tokens_checksum(tokens)) return damaged("wrong checksum");
  for (int32_t id : tokens)
    if (id < 0 || id >= vocab_size) return damaged("a token id outside the vocabulary");
  return true;
}

// Written whole (core/files.h), so a reader never sees half a cache and two runs that
// tokenize at once both leave a whole one. A cache that cannot be written costs only time.
void write_cache(const std::string& path, uint64_t key, const std::vector<int32_t>& tokens) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  const uint64_t count = tokens.size();
  const uint64_t checksum = tokens_checksum(tokens);
  std::string bytes;
  bytes.reserve(kCacheHeaderBytes + 4 * count + 8);
  bytes.append(kCacheMagic, 8);
  bytes.append(reinterpret_cast<const char*>(&key), 8);
  bytes.append(reinterpret_cast<const char*>(&count), 8);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), 4 * count);
  bytes.append(reinterpret_cast<const char*>(&checksum), 8);
  try {
    write_file_atomically(path, bytes);
  } catch (const Error& e) {
    log_warn("cannot write the token cache {} (continuing without it): {}", path, e.what());
  }
}

}  // namespace

const Registry<std::string>& text_dataset_registry() {
  static const Registry<std::string> registry = [] {
    Registry<std::string> r("text data set");
    r.add("sotu", "US State of the Union addresses 1790-2021 (10.8 MB)", "text/sotu");
    r.add("moby-dick", "Herman Melville, Moby-Dick (1.2 MB)", "text/moby-dick");
    r.add("brown", "Brown corpus, 500 samples of American English, tags stripped (6 MB)",
          "text/brown");
    return r;
  }();
  return registry;
}

std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> perm(std::max<int64_t>(n, 0));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  const uint64_t stream = kPermutationStream ^ mix64(static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    // Lemire's multiply-shift maps the hash to [0, i] without a modulo's bias.
    const uint64_t h = hash3(seed, stream, static_cast<uint64_t>(i));
    const auto j = static_cast<int64_t>(
        (static_cast<unsigned __int128>(h) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

TextCorpus::TextCorpus(const std::string& dataset, const Tokenizer& tokenizer,
                       const std::string& data_dir, int64_t seq_len, uint64_t seed, DataSplit split)
    : seq_len_(seq_len), seed_(seed) {
  check_usage(seq_len >= 1, fmt::format("sequence length {} must be at least 1", seq_len),
              "pass --seq with a positive length");
  std::string label;
  const auto files = resolve_dataset(dataset, data_dir, label);

  std::vector<Document> documents;
  uint64_t content_key = mix64(files.size());
  for (const auto& file : files) {
    Document doc{file.filename().string(), read_text_file(file)};
    content_key = content_hash(doc.text, content_hash(doc.name, content_key));
    documents.push_back(std::move(doc));
  }
  const std::string fingerprint = tokenizer.fingerprint();
  const uint64_t key =
      content_hash(fingerprint, content_hash(std::string(kCacheMagic, 8), content_key));
  cache_path_ =
      (fs::path(data_dir) / "cache" /
       fmt::format("{}.{}.{:016x}.tokens", sanitize(label), sanitize(tokenizer.name()), key))
          .string();

  loaded_from_cache_ = read_cache(cache_path_, key, tokenizer.vocab_size(), tokens_);
  if (!loaded_from_cache_) {
    const auto start = std::chrono::steady_clock::now();
    size_t bytes = 0;
    for (const auto& doc : documents) bytes += doc.text.size();
    tokens_.clear();
    tokens_.reserve(bytes / 3);
    for (size_t d = 0; d < documents.size(); ++d) {
      if (d > 0) tokens_.push_back(tokenizer.eot_id());
      const auto ids = tokenizer.encode(documents[d].text);
      tokens_.insert(tokens_.end(), ids.begin(), ids.end());
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    log_info("tokenized {} ({} files, {} bytes) with {}: {} tokens in {:.2f} s", label,
             documents.size(), bytes, tokenizer.name(), tokens_.size(), seconds);
    write_cache(cache_path_, key, tokens_);
  }

  const auto n = static_cast<int64_t>(tokens_.size());
  // The last 2% (rounded down) is validation; the search split is as long, just before it.
  const bool search = split == DataSplit::kLrSearch;
  held_end_ = search ? n - n / 50 : n;
  split_ = held_end_ - n / 50;
  if (split == DataSplit::kAll) {
    // Every token is held out; there is nothing to train on.
    split_ = 0;
    check_usage(val_windows() >= 1,
                fmt::format("text data set '{}' is too small for --seq {}: tokenizer {} gives {} "
                            "tokens, and a window needs seq + 1 = {}",
                            dataset, seq_len, tokenizer.name(), n, seq_len + 1),
                "use a shorter --seq or a longer text");
    return;
  }
  if (train_windows() < 1 || val_windows() < 1)
    fail_usage(fmt::format("text data set '{}' is too small for --seq {}: tokenizer {} gives {} "
                           "tokens, {} for training and {} for {}, and each split needs at "
                           "least seq + 1 = {} tokens",
                           dataset, seq_len, tokenizer.name(), n, train_tokens(), val_tokens(),
                           search ? "--lr auto's search (the 2% before the last 2%)"
                                  : "validation (the last 2%)",
                           seq_len + 1),
               fmt::format("use a shorter --seq, or a data set of at least {} tokens",
                           (search ? 100 : 50) * (seq_len + 1)));
  order_.emplace(seed_, train_windows());
}

int64_t TextCorpus::train_tokens() const { return split_; }
int64_t TextCorpus::val_tokens() const { return held_end_ - split_; }
int64_t TextCorpus::train_windows() const {
  return train_tokens() >= 1 ? (train_tokens() - 1) / seq_len_ : 0;
}
int64_t TextCorpus::val_windows() const {
  return val_tokens() >= 1 ? (val_tokens() - 1) / seq_len_ : 0;
}

int64_t TextCorpus::train_window(int64_t sample) const { return order_->item(sample); }

EpochOrder::EpochOrder(uint64_t seed, int64_t n) : seed_(seed), n_(n) {
  check_usage(n > 0, fmt::format("cannot order {} items", n));
}

int64_t EpochOrder::item(int64_t sample) const {
  check_usage(sample >= 0, fmt::format("sample index {} is negative", sample));
  const int64_t epoch = sample / n_;
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (epoch != cache_->epoch) {
    cache_->perm = epoch_permutation(seed_, epoch, n_);
    cache_->epoch = epoch;
  }
  return cache_->perm[sample % n_];
}

torch::Tensor EpochOrder::items(int64_t first, int64_t count) const {
  auto out = torch::empty({count}, torch::kInt64);
  int64_t* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) p[i] = item(first + i);
  return out;
}

namespace {

// Copies window starts into (B, T) inputs and their next tokens as targets.
TextBatch make_batch(const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts,
                     int64_t seq_len) {
  const auto batch = static_cast<int64_t>(starts.size());
  TextBatch out;
  out.input_ids = torch::empty({batch, seq_len}, torch::kInt64);  // (B, T)
  out.targets = torch::empty({batch, seq_len}, torch::kInt64);    // (B, T)
  int64_t* inputs = out.input_ids.data_ptr<int64_t>();
  int64_t* targets = out.targets.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* window = tokens.data() + starts[b];
    for (int64_t t = 0; t < seq_len; ++t) {
      inputs[b * seq_len + t] = window[t];
      targets[b * seq_len + t] = window[t + 1];
    }
  }
  return out;
}

}  // namespace

TextBatch TextCorpus::train_batch(int64_t first, int64_t count) const {
  check_usage(first >= 0 && count >= 0,
              fmt::format("bad training batch: first {} count {}", first, count));
  check_usage(order_.has_value(), "this text data set was loaded for evaluation only");
  std::vector<int64_t> starts(count);
  for (int64_t j = 0; j < count; ++j) starts[j] = train_window(first + j) * seq_len_;
  return make_batch(tokens_, starts, seq_len_);
}

TextBatch TextCorpus::val_batch(int64_t first, int64_t count) const {
  check_usage(first >= 0 && count >= 0,
              fmt::format("bad validation batch: first {} count {}", first, count));
  const int64_t windows = val_windows();
  std::vector<int64_t> starts(count);
  for (int64_t j = 0; j < count; ++j) starts[j] = split_ + ((first + j) % windows) * seq_len_;
  return make_batch(tokens_, starts, seq_len_);
}

double unigram_entropy_nats(const std::vector<int32_t>& tokens, int64_t begin, int64_t end) {
  check_usage(0 <= begin && begin <= end && end <= static_cast<int64_t>(tokens.size()),
              fmt::format("token range [{}, {}) is outside [0, {})", begin, end, tokens.size()));
  if (begin == end) return 0.0;
  int32_t max_id = 0;
  for (int64_t i = begin; i < end; ++i) {
    check_usage(tokens[i] >= 0, fmt::format("negative token id {} at {}", tokens[i], i));
    max_id = std::max(max_id, tokens[i]);
  }
  std::vector<int64_t> counts(static_cast<size_t>(max_id) + 1, 0);
  for (int64_t i = begin; i < end; ++i) ++counts[tokens[i]];
  // H = -sum p ln p with p = c / n, written as ln n - (1/n) sum c ln c.
  const double n = static_cast<double>(end - begin);
  double sum = 0.0;
  for (int64_t c : counts)
    if (c > 0) sum += static_cast<double>(c) * std::log(static_cast<double>(c));
  return std::log(n) - sum / n;
}

}  // namespace gradscope
