// Tokenizers: byte-level BPE in the GPT-2 and Llama 3 formats, and raw UTF-8 bytes.
// encode() adds no BOS/EOS; callers join documents with eot_id(). encode() treats its input as
// plain text: a special token written literally ("<|endoftext|>") is encoded as its characters,
// so no document can forge a boundary; decode() writes special tokens as their text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gradscope/core/registry.h"

namespace gradscope {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // Ids are in [0, vocab_size()); models pad this up (see models/).
  virtual int64_t vocab_size() const = 0;
  // Separates documents in a stream (GPT-2 <|endoftext|>, Llama 3 <|end_of_text|>, bytes EOS).
  virtual int32_t eot_id() const = 0;
  // Whether `id` is a special token: one that stands for no text (BOS, EOS, PAD, MASK, GPT-2's
  // <|endoftext|>, Llama 3's added tokens). encode() never produces one; ids outside
  // [0, vocab_size()) (a model's padding of the vocabulary) count as special too.
  virtual bool is_special(int32_t id) const = 0;
  // A stable fingerprint of the vocabulary and merges (for token caches).
  virtual std::string fingerprint() const = 0;
};

// Special ids of the `bytes` tokenizer: ids 0-255 are the UTF-8 bytes themselves.
constexpr int32_t kBytesBosId = 256;
constexpr int32_t kBytesEosId = 257;  // its eot_id()
constexpr int32_t kBytesPadId = 258;
constexpr int32_t kBytesMaskId = 259;
constexpr int64_t kBytesVocabSize = 260;

// Creates a tokenizer by registry name ("bytes", "gpt2", "llama3") from files under
// data_dir (see scripts/fetch-data.sh). Throws a usage error whose hint names the fetch
// command when files are missing, or names the file when it is truncated or corrupt.
// A name ending in ".json" is the path of a Hugging Face tokenizer.json instead (a model
// folder's, from --init-from): byte-level BPE whose end-of-text token is the first it defines
// of <|end_of_text|>, <|endoftext|>, </s> and [SEP].
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& data_dir);
bool is_tokenizer_file(const std::string& name);
// The vocabulary of a registry name (known without files) or of a tokenizer file (read).
int64_t tokenizer_vocab_size(const std::string& name);
// The tokenizer.json a tokenizer is read from ("" for those that have none: bytes, gpt2), for
// --save-weights to copy beside the weights.
std::string tokenizer_json_of(const std::string& name, const std::string& data_dir);

struct TokenizerEntry {
  std::unique_ptr<Tokenizer> (*make)(const std::string& data_dir);
  int64_t vocab_size;  // known without loading files, so configs resolve without data
};
const Registry<TokenizerEntry>& tokenizer_registry();

}  // namespace gradscope
