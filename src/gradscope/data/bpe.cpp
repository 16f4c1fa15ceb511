#include "gradscope/data/bpe.h"

#include <cstring>
#include <filesystem>
#include <queue>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/rng.h"

namespace gradscope {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

using json = nlohmann::json;

// Pieces longer than this are rare and unlikely to repeat: not worth caching.
constexpr size_t kMaxCachedPiece = 256;
// Bounds the cache's memory on endless streams of new words (a few hundred MB at worst).
constexpr size_t kMaxCacheEntries = size_t{1} << 21;

// Limits on what a tokenizer file may ask for, checked before anything is sized by it.
// A larger file is not a tokenizer: Llama 3's tokenizer.json has 9 MB, GPT-2's encoder.json
// 1 MB, and a parsed JSON value takes about ten times the memory of its text.
constexpr int64_t kMaxTokenizerFileBytes = int64_t{256} << 20;
// More token entries than this is no vocabulary (Llama 3 has 128,256; the largest in use
// have about a million).
constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
// Pre-tokenizer Sequences nest at most this deep, and at most this many regexes apply one
// after the other; real files have one or two, and each stage is a level of recursion in
// BpeTokenizer::split.
constexpr int kMaxPreTokenizerDepth = 8;
constexpr size_t kMaxPreTokenizerStages = 16;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

std::string printable(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\')
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

// Decodes one UTF-8 code point at s[i]; returns false on a malformed sequence.
bool next_code_point(std::string_view s, size_t& i, uint32_t& cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (len == 0 || i + len > s.size()) return false;
  cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc >> 6) != 0x2) return false;
    cp = (cp << 6) | (cc & 0x3f);
  }
  i += len;
  return true;
}

// A byte-level vocabulary string (printable code points) -> raw bytes; false if it is not one.
bool byte_level_decode(std::string_view s, std::string& out) {
  static const std::vector<int> unicode_to_byte = [] {
    std::vector<int> table(324, -1);
    const auto& b2u = byte_to_unicode();
    for (int b = 0; b < 256; ++b) table[b2u[b]] = b;
    return table;
  }();
  out.clear();
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = 0;
    if (!next_code_point(s, i, cp) || cp >= unicode_to_byte.size() || unicode_to_byte[cp] < 0)
      return false;
    out += static_cast<char>(unicode_to_byte[cp]);
  }
  return true;
}

constexpr char kCorruptHint[] =
    "the file is truncated, corrupt or of another format: pass a whole byte-level BPE "
    "tokenizer file (a Hugging Face tokenizer.json, or GPT-2's encoder.json and vocab.bpe); "
    "the registry's tokenizers are fetched whole by scripts/fetch-data.sh tokenizers (or make "
    "data)";

// Reads a tokenizer file whole, its size checked first (kMaxTokenizerFileBytes).
std::string read_tokenizer_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    fail_usage("cannot read tokenizer file " + path + ": it does not exist",
               "run scripts/fetch-data.sh tokenizers (or make data) to fetch it");
  return read_input_file(path, "tokenizer file", kMaxTokenizerFileBytes);
}

json parse_json(const std::string& text, const std::string& path) {
  return parse_json_input(text, path, kCorruptHint);
}

[[noreturn]] void fail_file(const std::string& path, const std::string& what) {
  fail_usage(path + ": " + what, kCorruptHint);
}

// The number of ids a file with `entries` token entries may use: ids number the entries
// from 0 with none missing (checked once all are read), so an id at or past the count is
// corrupt, and it is refused before any table is sized by it.
int64_t id_limit(size_t entries, const std::string& path) {
  if (entries > static_cast<size_t>(kMaxVocabSize))
    fail_file(path, fmt::format("has {} tokens, more than the {} a vocabulary may have", entries,
                                kMaxVocabSize));
  return static_cast<int64_t>(entries);
}

// A token id from the file: an integer in [0, limit).
int32_t token_id_in(const json& value, int64_t limit, const std::string& path,
                    const std::string& what) {
  if (!value.is_number_integer()) fail_file(path, what + " has no integer id");
  const int64_t id = value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX}
                         ? INT64_MAX
                         : value.get<int64_t>();
  if (id < 0 || id >= limit)
    fail_file(path, fmt::format("{} has id {}, outside 0..{}: the ids of a vocabulary of {} "
                                "tokens are 0 to {} with none missing",
                                what, id, limit - 1, limit, limit - 1));
  return static_cast<int32_t>(id);
}

// Fills `tokens` (id -> raw bytes) from a JSON object token -> id; ids below `limit`.
void read_vocab(const json& vocab, const std::string& path, const std::string& where, int64_t limit,
                std::vector<std::string>& tokens, std::vector<bool>& filled,
                std::unordered_map<std::string, int32_t>& by_text) {
  if (!vocab.is_object()) fail_file(path, where + " is missing or not an object");
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    max_id = std::max(max_id, token_id_in(it.value(), limit, path,
                                          where + " entry '" + printable(it.key()) + "'"));
  if (static_cast<int64_t>(tokens.size()) < int64_t{max_id} + 1) {
    tokens.resize(max_id + 1);
    filled.resize(max_id + 1, false);
  }
  by_text.reserve(by_text.size() + vocab.size());
  std::string raw;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = it.value().get<int32_t>();
    if (!byte_level_decode(it.key(), raw))
      fail_file(path, fmt::format("{} token {} '{}' is not a byte-level token", where, id,
                                  printable(it.key())));
    if (filled[id]) fail_file(path, fmt::format("{} has two tokens with id {}", where, id));
    tokens[id] = raw;
    filled[id] = true;
    by_text.emplace(it.key(), id);
  }
}

// An optional field of the file's JSON, of a given type: `fallback` when absent or null, a
// usage error naming the file when it holds another type.
bool bool_field(const json& node, const char* key, bool fallback, const std::string& path,
                const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail_file(path, where + "." + key + " is not true or false");
  return it->get<bool>();
}

std::string string_field(const json& node, const char* key, const std::string& fallback,
                         const std::string& path, const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return fallback;
  if (!it->is_string()) fail_file(path, where + "." + key + " is not a string");
  return it->get<std::string>();
}

int32_t merge_side(const std::unordered_map<std::string, int32_t>& by_text, const std::string& side,
                   const std::string& path, const std::string& where) {
  auto it = by_text.find(side);
  if (it == by_text.end())
    fail_file(path, where + ": '" + printable(side) + "' is not in the vocabulary");
  return it->second;
}

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace

const std::vector<uint32_t>& byte_to_unicode() {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256, 0);
    std::vector<bool> printable_byte(256, false);
    for (int b = '!'; b <= '~'; ++b) printable_byte[b] = true;
    for (int b = 0xa1; b <= 0xac; ++b) printable_byte[b] = true;
    for (int b = 0xae; b <= 0xff; ++b) printable_byte[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) t[b] = printable_byte[b] ? b : next++;
    return t;
  }();
  return table;
}

uint64_t content_hash(std::string_view bytes, uint64_t seed) {
  uint64_t h = mix64(seed ^ bytes.size());
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = mix64(h ^ word);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes.data() + i, bytes.size() - i);
  return mix64(h ^ tail ^ (uint64_t{bytes.size() - i} << 56));
}

namespace {

size_t utf8_length(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// BpeTokenizer

BpeTokenizer::BpeTokenizer(BpeSpec spec) : spec_(std::move(spec)) {
  const std::string& src = spec_.source;
  const auto n = static_cast<int32_t>(spec_.tokens.size());
  spec_.special.resize(n, false);
  auto fail = [&](const std::string& what) { fail_file(src, what); };
  token_ids_.reserve(n);

  for (int32_t id = 0; id < n; ++id) {
    if (spec_.special[id])
      special_ids_.emplace(spec_.tokens[id], id);
    else
      token_ids_.emplace(spec_.tokens[id], id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = token_ids_.find(std::string(1, static_cast<char>(b)));
    if (it == token_ids_.end())
      fail(fmt::format("no token for byte 0x{:02x}: not a byte-level BPE vocabulary", b));
    byte_ids_[b] = it->second;
  }

  std::vector<bool> produced(n, false);
  merges_.reserve(spec_.merges.size() * 2);
  for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
    const auto [left, right] = spec_.merges[rank];
    if (left < 0 || left >= n || right < 0 || right >= n || spec_.special[left] ||
        spec_.special[right])
      fail(fmt::format("merge {} uses an id out of range or a special token", rank));
    const std::string joined = spec_.tokens[left] + spec_.tokens[right];
    auto it = token_ids_.find(joined);
    if (it == token_ids_.end())
      fail(fmt::format("merge {} ('{}' + '{}') makes '{}', which is not a token", rank,
                       printable(spec_.tokens[left]), printable(spec_.tokens[right]),
                       printable(joined)));
    // A repeated pair keeps its first (lowest) rank, as in the reference implementations.
    merges_.emplace(pair_key(left, right), MergeRule{static_cast<int32_t>(rank), it->second});
    produced[it->second] = true;
  }
  // Every multi-byte token of a BPE vocabulary is some merge's result; one that is not means
  // the merges were cut short (a truncated download), and encode() would silently differ.
  int64_t orphans = 0;
  int32_t first_orphan = -1;
  for (int32_t id = 0; id < n; ++id) {
    if (spec_.special[id] || spec_.tokens[id].size() <= 1 || produced[id]) continue;
    if (token_ids_.at(spec_.tokens[id]) != id) continue;  // a duplicate of another token
    if (orphans++ == 0) first_orphan = id;
  }
  if (orphans > 0)
    fail(fmt::format(
        "{} of {} tokens are produced by no merge (the first is id {} '{}'): the merges are "
        "truncated or belong to another vocabulary",
        orphans, n, first_orphan, printable(spec_.tokens[first_orphan])));
  if (spec_.eot_id < 0 || spec_.eot_id >= n) fail("no end-of-text token");

  for (const std::string& pattern : spec_.patterns)
    regexes_.push_back(std::make_unique<PretokenizerRegex>(pattern, src));
}

BpeTokenizer::~BpeTokenizer() = default;

template <typename Fn>
void BpeTokenizer::split(std::string_view text, size_t stage, const RegexBudget& budget,
                         const Fn& emit) const {
  if (text.empty()) return;
  if (stage == regexes_.size()) {
    emit(text);
    return;
  }
  const PretokenizerRegex& regex = *regexes_[stage];
  size_t gap = 0;  // start of text not yet emitted
  size_t pos = 0;  // where the next search starts
  size_t start = 0, end = 0;
  while (pos < text.size()) {
    if (!regex.find(text, pos, &start, &end)) break;
    budget.check(regex.pattern());
    if (end == start) {  // an empty match: search on from the next character
      if (start >= text.size()) break;
      pos = start + utf8_length(static_cast<unsigned char>(text[start]));
      continue;
    }
    // Isolated: the text between matches is a piece of its own, as is each match.
    if (start > gap) split(text.substr(gap, start - gap), stage + 1, budget, emit);
    split(text.substr(start, end - start), stage + 1, budget, emit);
    gap = pos = end;
  }
  if (gap < text.size()) split(text.substr(gap), stage + 1, budget, emit);
}

std::vector<std::string> BpeTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  std::string prefixed;
  if (spec_.add_prefix_space && !text.empty() && text[0] != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  const RegexBudget budget(text.size(), spec_.source);
  split(text, 0, budget, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  std::string prefixed;
  if (spec_.add_prefix_space && !text.empty() && text[0] != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  const RegexBudget budget(text.size(), spec_.source);
  split(text, 0, budget, [&](std::string_view piece) { encode_piece(piece, out); });
  return out;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (piece.size() > kMaxCachedPiece) {
    bpe(piece, out);
    return;
  }
  std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out.size();
  bpe(piece, out);
  std::vector<int32_t> ids(out.begin() + before, out.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::move(key), std::move(ids));
}

void BpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (spec_.ignore_merges) {
    auto it = token_ids_.find(std::string(piece));
    if (it != token_ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols form a linked list over the piece's bytes; a merge absorbs the right symbol into
  // the left one. Candidates are (rank, position): lowest rank first, leftmost on ties, as in
  // HF tokenizers' BPE (GPT-2's "merge every occurrence of the best pair" gives the same).
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, left, right, id;
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i)
    symbols[i] = {byte_ids_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1,
                  true};
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> queue(worse);
  auto consider = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(pair_key(symbols[pos].id, symbols[next].id));
    if (it != merges_.end())
      queue.push({it->second.rank, pos, symbols[pos].id, symbols[next].id, it->second.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& s = symbols[c.pos];
    // Stale candidates (a side merged since) no longer match their pair.
    if (!s.alive || s.id != c.left || s.next < 0 || symbols[s.next].id != c.right) continue;
    Symbol& right = symbols[s.next];
    s.id = c.id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) symbols[s.next].prev = c.pos;
    if (s.prev >= 0) consider(s.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(spec_.tokens.size()))
    fail_usage(fmt::format("token id {} is out of range for tokenizer {} (vocabulary {})", id,
                           spec_.name, spec_.tokens.size()),
               "decode ids made by the same tokenizer");
  return spec_.tokens[id];
}

int32_t BpeTokenizer::token_id(std::string_view bytes) const {
  const std::string key(bytes);
  if (auto it = token_ids_.find(key); it != token_ids_.end()) return it->second;
  if (auto it = special_ids_.find(key); it != special_ids_.end()) return it->second;
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Loaders

namespace {

// HF pre-tokenizers we support, flattened to a list of regex stages. `depth` counts the
// Sequences around `node`: a file that nests them deeper, or adds more stages than
// kMaxPreTokenizerStages, is refused rather than followed.
void read_pre_tokenizer(const json& node, const std::string& path, BpeSpec& spec, int depth) {
  if (node.is_null()) return;
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string())
    fail_file(path, "pre_tokenizer has no type");
  const std::string type = node["type"].get<std::string>();
  const std::string where = "pre_tokenizer " + type;
  if (type == "Sequence") {
    if (depth >= kMaxPreTokenizerDepth)
      fail_usage(fmt::format("{}: pre_tokenizer Sequences nest deeper than {} levels", path,
                             kMaxPreTokenizerDepth),
                 "gradscope supports GPT-2 style pre-tokenizers: a Sequence of Split and "
                 "ByteLevel");
    if (!node.contains("pretokenizers") || !node["pretokenizers"].is_array())
      fail_file(path, "pre_tokenizer Sequence has no pretokenizers list");
    for (const auto& child : node["pretokenizers"])
      read_pre_tokenizer(child, path, spec, depth + 1);
  } else if (type == "Split") {
    const std::string behavior = string_field(node, "behavior", "Isolated", path, where);
    if (behavior != "Isolated" || bool_field(node, "invert", false, path, where))
      fail_usage(path + ": pre_tokenizer Split with behavior '" + printable(behavior) +
                     "' (or invert) is not supported",
                 "gradscope supports the Isolated behavior used by GPT-2 style tokenizers");
    if (!node.contains("pattern") || !node["pattern"].is_object())
      fail_file(path, "pre_tokenizer Split has no pattern");
    const json& pattern = node["pattern"];
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      spec.patterns.push_back(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      // A literal string: quote it for PCRE2.
      spec.patterns.push_back("\\Q" + pattern["String"].get<std::string>() + "\\E");
    } else {
      fail_file(path, "pre_tokenizer Split pattern has neither Regex nor String");
    }
  } else if (type == "ByteLevel") {
    if (bool_field(node, "use_regex", true, path, where)) spec.patterns.push_back(kGpt2Pattern);
    if (bool_field(node, "add_prefix_space", false, path, where)) spec.add_prefix_space = true;
  } else {
    fail_usage(path + ": pre_tokenizer type '" + printable(type) + "' is not supported",
               "gradscope supports Sequence, Split (Isolated) and ByteLevel pre-tokenizers");
  }
  if (spec.patterns.size() > kMaxPreTokenizerStages)
    fail_usage(fmt::format("{}: the pre_tokenizer has more than {} regex stages", path,
                           kMaxPreTokenizerStages),
               "gradscope supports GPT-2 style pre-tokenizers: a Sequence of Split and "
               "ByteLevel");
}

void finish_special(BpeSpec& spec, const std::string& path, const std::string& eot_token,
                    const std::unordered_map<std::string, int32_t>& by_text) {
  spec.eot_id = -1;
  for (size_t id = 0; id < spec.tokens.size(); ++id)
    if (spec.special[id] && spec.tokens[id] == eot_token) spec.eot_id = static_cast<int32_t>(id);
  if (spec.eot_id < 0) {
    auto it = by_text.find(eot_token);
    if (it == by_text.end()) fail_file(path, "has no end-of-text token '" + eot_token + "'");
    spec.eot_id = it->second;
    spec.special[it->second] = true;
  }
}

void check_all_filled(const std::vector<bool>& filled, const std::string& path) {
  for (size_t id = 0; id < filled.size(); ++id)
    if (!filled[id])
      fail_file(path,
                fmt::format("no token has id {} (the vocabulary has {} ids)", id, filled.size()));
}

}  // namespace

std::unique_ptr<BpeTokenizer> load_hf_tokenizer(const std::string& path, const std::string& name,
                                                const std::string& eot_token) {
  return parse_hf_tokenizer(read_tokenizer_file(path), path, name, eot_token);
}

std::unique_ptr<BpeTokenizer> parse_hf_tokenizer(const std::string& text, const std::string& path,
                                                 const std::string& name,
                                                 const std::string& eot_token) {
  const json root = parse_json(text, path);
  if (!root.is_object()) fail_file(path, "is not a tokenizer.json (not a JSON object)");
  if (!root.contains("model") || !root["model"].is_object()) fail_file(path, "has no model object");
  const json& model = root["model"];
  if (model.contains("type") && model["type"] != "BPE")
    fail_usage(path + ": model type " + model["type"].dump() + " is not supported",
               "gradscope loads byte-level BPE tokenizers only");
  if (bool_field(model, "byte_fallback", false, path, "model"))
    fail_usage(path + ": byte_fallback BPE is not supported",
               "gradscope loads byte-level BPE tokenizers only");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!string_field(model, key, "", path, "model").empty())
      fail_usage(path + ": model." + key + " is not supported",
                 "gradscope loads byte-level BPE tokenizers only");
  if (root.contains("normalizer") && !root["normalizer"].is_null())
    fail_usage(path + ": normalizers are not supported",
               "gradscope loads byte-level BPE tokenizers without a normalizer");

  BpeSpec spec;
  spec.name = name;
  spec.source = path;
  static const json kAbsent;
  static const json kNoTokens = json::array();
  const json& vocab = model.contains("vocab") ? model["vocab"] : kAbsent;
  const json& added = root.contains("added_tokens") ? root["added_tokens"] : kNoTokens;
  if (!added.is_array()) fail_file(path, "added_tokens is not a list");
  // An added token may repeat a vocabulary entry's id (GPT-2's <|endoftext|> does), so the
  // ids are below the count of both together.
  const int64_t limit = id_limit(vocab.size() + added.size(), path);
  std::vector<bool> filled;
  std::unordered_map<std::string, int32_t> by_text;
  read_vocab(vocab, path, "model.vocab", limit, spec.tokens, filled, by_text);
  spec.special.assign(spec.tokens.size(), false);

  std::vector<bool> added_ids;
  for (size_t i = 0; i < added.size(); ++i) {
    const json& token = added[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    if (!token.is_object() || !token.contains("id") || !token.contains("content") ||
        !token["content"].is_string())
      fail_file(path, where + " lacks an integer id or a content string");
    const int32_t id = token_id_in(token["id"], limit, path, where);
    if (id >= static_cast<int32_t>(spec.tokens.size())) {
      spec.tokens.resize(id + 1);
      spec.special.resize(id + 1, false);
      filled.resize(id + 1, false);
    }
    if (id >= static_cast<int32_t>(added_ids.size())) added_ids.resize(id + 1, false);
    if (added_ids[id]) fail_file(path, fmt::format("added_tokens has two tokens with id {}", id));
    added_ids[id] = true;
    // Added tokens (special or not) are written as their text and never produced by encode().
    spec.tokens[id] = token["content"].get<std::string>();
    spec.special[id] = true;
    filled[id] = true;
  }
  check_all_filled(filled, path);

  if (!model.contains("merges") || !model["merges"].is_array())
    fail_file(path, "model.merges is missing or not a list");
  const json& merges = model["merges"];
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    const std::string where = fmt::format("model.merges[{}]", i);
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail_file(path, where + " '" + printable(s) + "' is not two tokens separated by a space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      fail_file(path, where + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    spec.merges.emplace_back(merge_side(by_text, left, path, where),
                             merge_side(by_text, right, path, where));
  }
  spec.ignore_merges = bool_field(model, "ignore_merges", false, path, "model");
  read_pre_tokenizer(root.contains("pre_tokenizer") ? root["pre_tokenizer"] : json(), path, spec,
                     0);
  finish_special(spec, path, eot_token, by_text);
  spec.fingerprint = name + "-hf-bpe1-" + hex64(content_hash(text, 0x6870));
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

std::unique_ptr<BpeTokenizer> load_gpt2_tokenizer(const std::string& encoder_path,
                                                  const std::string& merges_path,
                                                  const std::string& name,
                                                  const std::string& eot_token) {
  const std::string encoder_text = read_tokenizer_file(encoder_path);
  const std::string merges_text = read_tokenizer_file(merges_path);
  return parse_gpt2_tokenizer(encoder_text, merges_text, encoder_path, merges_path, name,
                              eot_token);
}

std::unique_ptr<BpeTokenizer> parse_gpt2_tokenizer(const std::string& encoder_text,
                                                   const std::string& merges_text,
                                                   const std::string& encoder_path,
                                                   const std::string& merges_path,
                                                   const std::string& name,
                                                   const std::string& eot_token) {
  const json encoder = parse_json(encoder_text, encoder_path);

  BpeSpec spec;
  spec.name = name;
  spec.source = encoder_path + " and " + merges_path;
  std::vector<bool> filled;
  std::unordered_map<std::string, int32_t> by_text;
  read_vocab(encoder, encoder_path, "encoder.json", id_limit(encoder.size(), encoder_path),
             spec.tokens, filled, by_text);
  check_all_filled(filled, encoder_path);
  spec.special.assign(spec.tokens.size(), false);

  size_t line_no = 0;
  size_t begin = 0;
  while (begin < merges_text.size()) {
    size_t end = merges_text.find('\n', begin);
    if (end == std::string::npos) end = merges_text.size();
    std::string line = merges_text.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      fail_file(merges_path, fmt::format("line {} '{}' is not two tokens separated by a space",
                                         line_no, printable(line)));
    const std::string where = fmt::format("line {}", line_no);
    spec.merges.emplace_back(merge_side(by_text, line.substr(0, space), merges_path, where),
                             merge_side(by_text, line.substr(space + 1), merges_path, where));
  }
  spec.patterns.push_back(kGpt2Pattern);
  finish_special(spec, encoder_path, eot_token, by_text);
  spec.fingerprint =
      name + "-gpt2-bpe1-" + hex64(content_hash(merges_text, content_hash(encoder_text, 0x6770)));
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace gradscope
