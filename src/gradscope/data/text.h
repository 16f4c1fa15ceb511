// Text data: a corpus tokenized once (cached), split into train and validation, cut into
// windows of seq_len + 1 tokens.
//
// Semantics (DESIGN.md, "Data, randomness, exactness"):
// - documents are joined with the tokenizer's eot id, in a fixed order (sorted file names);
// - the last 2% of tokens are the validation split;
// - the training tokens are cut into W = floor((N_train - 1) / seq_len) windows, window w
//   covering tokens [w*seq_len, w*seq_len + seq_len + 1);
// - sample index i (global, counting from 0 over the whole run) maps to epoch e = i / W and
//   window perm_e(i % W), where perm_e is a permutation that depends on (seed, e) alone;
// so a sample depends on (seed, i) only, whatever the batch split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradscope/data/tokenizer.h"
#include <torch/torch.h>

namespace gradscope {

struct TextBatch {
  torch::Tensor input_ids;  // (B, T) int64
  torch::Tensor targets;    // (B, T) int64, next tokens
};

class TextCorpus {
 public:
  // Loads the named data set ("sotu", "moby-dick", "brown", or a path to a .txt file or a
  // directory of .txt files), tokenizes it with a cache under data_dir/cache, and splits it.
  // Throws a usage error when the data is missing (the hint names the fetch command) or
  // yields fewer tokens than one window.
  TextCorpus(const std::string& dataset, const Tokenizer& tokenizer, const std::string& data_dir,
             int64_t seq_len, uint64_t seed);

  // Samples [first, first + count) of the training stream.
  TextBatch train_batch(int64_t first, int64_t count) const;
  // Validation windows [first, first + count) (non-overlapping, in order, wrapping around).
  TextBatch val_batch(int64_t first, int64_t count) const;

  int64_t train_tokens() const;
  int64_t val_tokens() const;
  int64_t train_windows() const;
  int64_t val_windows() const;
  int64_t seq_len() const { return seq_len_; }
  // Token ids of the whole training split (for unigram statistics).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t split_index() const { return split_; }  // first validation token

 private:
  std::vector<int32_t> tokens_;
  int64_t split_ = 0;
  int64_t seq_len_ = 0;
  uint64_t seed_ = 0;
  mutable std::vector<int64_t> perm_;  // permutation of the current epoch
  mutable int64_t perm_epoch_ = -1;
};

// Data sets this family knows ("sotu", "moby-dick", "brown") and their source folders.
const Registry<std::string>& text_dataset_registry();

// Unigram entropy (nats per token) of the training split: the loss of the best model that
// ignores context. A model that learns context gets below it.
double unigram_entropy_nats(const std::vector<int32_t>& tokens, int64_t begin, int64_t end);

}  // namespace gradscope
