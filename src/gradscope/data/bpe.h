// Byte-level BPE (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword
// Units"; byte-level as in GPT-2, Radford et al. 2019), loaded from GPT-2's encoder.json +
// vocab.bpe or from a Hugging Face tokenizer.json (Llama 3).
//
// Encoding a text:
//   1. pre-tokenize: split the text with the file's regexes (data/regex.h: PCRE2 under a
//      match limit, a depth limit and a time budget); both
//      the matches and the text between them become pieces ("Isolated" in HF terms);
//   2. per piece: if ignore_merges and the piece's bytes are a token, that token; else start
//      from one token per byte and apply merges lowest rank first (leftmost first on ties)
//      until none applies. Pieces are cached, so a corpus costs one BPE run per distinct word.
// Special (added) tokens are never produced by encode(): text is always plain text, so a
// document containing the characters "<|endoftext|>" cannot inject a document boundary.
// decode() writes a special token as its literal text.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gradscope/data/regex.h"
#include "gradscope/data/tokenizer.h"

namespace gradscope {

// GPT-2's pre-tokenizer regex (also HF's ByteLevel pre-tokenizer with use_regex true).
extern const char* const kGpt2Pattern;

// A byte-level BPE vocabulary, whatever file format it came from.
struct BpeSpec {
  std::string name;                 // registry name ("gpt2", "llama3") or a test name
  std::vector<std::string> tokens;  // id -> raw bytes (a special token: its text)
  std::vector<bool> special;        // id -> added/special token (never produced by encode)
  std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order: (left id, right id)
  std::vector<std::string> patterns;  // pre-tokenizer regexes, applied one after the other
  bool ignore_merges = false;         // a piece that is a whole token maps to it without merging
  bool add_prefix_space = false;      // prepend a space to a text that does not start with one
  int32_t eot_id = -1;
  std::string fingerprint;
  std::string source;  // file(s) it was read from, for error messages
};

class BpeTokenizer : public Tokenizer {
 public:
  // Throws a usage error naming spec.source when the spec is inconsistent (a byte without a
  // token, a merge whose result is not a token, a token no merge produces, a bad regex).
  explicit BpeTokenizer(BpeSpec spec);
  ~BpeTokenizer() override;

  std::string name() const override { return spec_.name; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(spec_.tokens.size()); }
  int32_t eot_id() const override { return spec_.eot_id; }
  bool is_special(int32_t id) const override {
    return id < 0 || id >= vocab_size() || spec_.special[static_cast<size_t>(id)];
  }
  std::string fingerprint() const override { return spec_.fingerprint; }

  // The token's raw bytes (a special token: its text). Throws a usage error when out of range.
  const std::string& token_bytes(int32_t id) const;
  // The id of the token whose raw bytes are `bytes` (specials included), or -1.
  int32_t token_id(std::string_view bytes) const;
  // The pre-tokenizer's pieces of `text` (for tests and debugging).
  std::vector<std::string> pre_tokenize(std::string_view text) const;

 private:
  struct MergeRule {
    int32_t rank;
    int32_t id;
  };
  template <typename Fn>
  void split(std::string_view text, size_t stage, const RegexBudget& budget,
             const Fn& emit) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  BpeSpec spec_;
  std::vector<std::unique_ptr<PretokenizerRegex>> regexes_;
  std::unordered_map<uint64_t, MergeRule> merges_;      // (left << 32 | right) -> rule
  std::unordered_map<std::string, int32_t> token_ids_;  // raw bytes -> id, specials excluded
  std::unordered_map<std::string, int32_t> special_ids_;
  int32_t byte_ids_[256];

  // piece -> ids; guarded because encode() is const and may run on several threads.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// Loads a Hugging Face tokenizer.json (model type BPE, byte-level): model.vocab, model.merges
// ("a b" strings or [a, b] pairs), model.ignore_merges, added_tokens, and the pre-tokenizer
// (Sequence / Split with behavior Isolated / ByteLevel). `eot_token` names the end-of-text
// token. Throws a usage error naming the file when it is missing, truncated or unsupported.
// Limits, checked before anything is sized by them: the file has at most 256 MiB and nests
// JSON at most kMaxJsonDepth deep; ids are 0..N-1 for the N entries of model.vocab and
// added_tokens together (an id past that, a negative one or one given twice is refused, so a
// corrupt id never sizes a table), N <= 2^24; pre-tokenizer Sequences nest at most 8 deep
// and give at most 16 regex stages.
std::unique_ptr<BpeTokenizer> load_hf_tokenizer(const std::string& path, const std::string& name,
                                                const std::string& eot_token);
// The same from the file's text; `path` only names it in messages.
std::unique_ptr<BpeTokenizer> parse_hf_tokenizer(const std::string& text, const std::string& path,
                                                 const std::string& name,
                                                 const std::string& eot_token);

// Loads GPT-2's encoder.json (token -> id) and vocab.bpe ("#version" line, then one merge per
// line in rank order), with the GPT-2 regex. Throws a usage error naming the file when it is
// missing, truncated or corrupt. The limits of load_hf_tokenizer hold for each file (ids are
// 0..N-1 for encoder.json's N entries).
std::unique_ptr<BpeTokenizer> load_gpt2_tokenizer(const std::string& encoder_path,
                                                  const std::string& merges_path,
                                                  const std::string& name,
                                                  const std::string& eot_token);
// The same from the files' texts; the paths only name them in messages.
std::unique_ptr<BpeTokenizer> parse_gpt2_tokenizer(const std::string& encoder_text,
                                                   const std::string& merges_text,
                                                   const std::string& encoder_path,
                                                   const std::string& merges_path,
                                                   const std::string& name,
                                                   const std::string& eot_token);

// GPT-2's reversible map from bytes to printable code points, so that every token of a
// byte-level vocabulary file is a printable string: byte -> code point.
const std::vector<uint32_t>& byte_to_unicode();

// A fast 64-bit hash of a byte string (for fingerprints and cache keys; not cryptographic).
uint64_t content_hash(std::string_view bytes, uint64_t seed = 0);

}  // namespace gradscope
