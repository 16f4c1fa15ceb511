// Text data: a corpus tokenized once (cached), split into train and validation, cut into
// windows of seq_len + 1 tokens.
//
// Semantics (docs/metrics.md, "Steps, samples, tokens"):
// - documents are joined with the tokenizer's eot id, in a fixed order (sorted file names);
// - the last 2% of tokens are the validation split; --lr auto's search split
//   (DataSplit::kLrSearch) is the same number of tokens just before them, and a
//   corpus made for the search trains on the tokens before that and evaluates on it;
// - the training tokens are cut into W = floor((N_train - 1) / seq_len) windows, window w
//   covering tokens [w*seq_len, w*seq_len + seq_len + 1);
// - sample index i (global, counting from 0 over the whole run) maps to epoch e = i / W and
//   window perm_e(i % W), where perm_e is a permutation that depends on (seed, e) alone;
// so a sample depends on (seed, i) only, whatever the batch split.
// Documents are the data set's files; the eot id stands between consecutive documents.
// perm_e is a Fisher-Yates shuffle driven by hash3(seed, stream of e, position) (core/rng.h).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include "gradscope/data/split.h"
#include "gradscope/data/tokenizer.h"

namespace gradscope {

// The permutation of [0, n) used for epoch `epoch` (Fisher-Yates driven by hash3).
std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n);

// The order in which training samples visit n items (windows of a corpus, images of a set):
// sample i reads item perm_e(i mod n) of epoch e = i / n, perm_e = epoch_permutation(seed, e,
// n). The current epoch's permutation is cached; copies share the cache and its mutex, so
// item() is safe to call from a prefetch thread.
class EpochOrder {
 public:
  EpochOrder(uint64_t seed, int64_t n);
  // Throws a usage error if sample < 0.
  int64_t item(int64_t sample) const;
  // Items of samples [first, first + count). (count) int64
  torch::Tensor items(int64_t first, int64_t count) const;

 private:
  struct Cache {
    std::mutex mutex;
    std::vector<int64_t> perm;
    int64_t epoch = -1;
  };
  uint64_t seed_;
  int64_t n_;
  std::shared_ptr<Cache> cache_ = std::make_shared<Cache>();
};

struct TextBatch {
  torch::Tensor input_ids;  // (B, T) int64
  torch::Tensor targets;    // (B, T) int64, next tokens
};

class TextCorpus {
 public:
  // Loads the named data set ("sotu", "moby-dick", "brown", or a path to a .txt file or a
  // directory of .txt files), tokenizes it with a cache under data_dir/cache, and splits it.
  // Throws a usage error when the data is missing (the hint names the fetch command) or
  // yields fewer tokens than one window. With kLrSearch the held-out tokens are the
  // search split and the validation tokens are never read (see the top of this file).
  TextCorpus(const std::string& dataset, const Tokenizer& tokenizer, const std::string& data_dir,
             int64_t seq_len, uint64_t seed, DataSplit split = DataSplit::kRun);

  // Samples [first, first + count) of the training stream.
  TextBatch train_batch(int64_t first, int64_t count) const;
  // Held-out windows [first, first + count) (non-overlapping, in order, wrapping around): the
  // validation split's, or the search split's.
  TextBatch val_batch(int64_t first, int64_t count) const;

  int64_t train_tokens() const;
  int64_t val_tokens() const;
  int64_t train_windows() const;
  int64_t val_windows() const;
  int64_t seq_len() const { return seq_len_; }
  // Token ids of the whole stream: the training split [0, split_index()), then the held-out
  // tokens [split_index(), held_out_end()), then (search split only) the validation tokens
  // (for unigram statistics use unigram_entropy_nats(tokens(), 0, split_index())).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t split_index() const { return split_; }      // first held-out token
  int64_t held_out_end() const { return held_end_; }  // one past the last held-out token

  // The training window sample i reads: perm_{i / W}(i % W). Throws a usage error if i < 0.
  int64_t train_window(int64_t sample) const;
  // Where the token cache lives, and whether this corpus was read from it (else tokenized).
  const std::string& cache_path() const { return cache_path_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  std::vector<int32_t> tokens_;
  int64_t split_ = 0;
  int64_t held_end_ = 0;
  int64_t seq_len_ = 0;
  uint64_t seed_ = 0;
  std::string cache_path_;
  bool loaded_from_cache_ = false;
  // Which window each training sample reads (set once the windows are counted).
  std::optional<EpochOrder> order_;
};

// Data sets this family knows ("sotu", "moby-dick", "brown") and their source folders,
// relative to the data directory ("text/sotu", ...).
const Registry<std::string>& text_dataset_registry();

// Unigram entropy (nats per token) of the training split: the loss of the best model that
// ignores context. A model that learns context gets below it.
double unigram_entropy_nats(const std::vector<int32_t>& tokens, int64_t begin, int64_t end);

}  // namespace gradscope
