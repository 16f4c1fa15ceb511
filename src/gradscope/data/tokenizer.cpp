#include "gradscope/data/tokenizer.h"

#include <filesystem>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/data/bpe.h"

namespace gradscope {
namespace {

// The UTF-8 bytes of the text, one id each. Needs no files, so tests and the `tiny` presets
// run anywhere. decode() drops BOS/EOS/PAD/MASK: they have no text.
class BytesTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id >= kBytesVocabSize)
        fail_usage("token id " + std::to_string(id) +
                       " is out of range for tokenizer bytes (vocabulary 260)",
                   "decode ids made by the same tokenizer");
      if (id < 256) out += static_cast<char>(id);
    }
    return out;
  }
  int64_t vocab_size() const override { return kBytesVocabSize; }
  int32_t eot_id() const override { return kBytesEosId; }
  bool is_special(int32_t id) const override { return id < 0 || id >= 256; }
  std::string fingerprint() const override { return "bytes-v1"; }
};

std::string require_file(const std::string& name, const std::string& data_dir,
                         const std::string& relative) {
  const std::string path = data_dir + "/" + relative;
  if (!std::filesystem::exists(path))
    fail_usage("tokenizer '" + name + "' needs " + path + ", which is missing",
               "run scripts/fetch-data.sh tokenizers (or make data) to fetch it into " + data_dir +
                   " ($GRADSCOPE_DATA, default ~/.cache/gradscope)");
  return path;
}

// The pinned files have a known size; another size means another (or a damaged) file, and
// models sized from the registry would not fit its ids.
void check_vocab(const Tokenizer& tokenizer, int64_t expected, int32_t expected_eot,
                 const std::string& path) {
  if (tokenizer.vocab_size() != expected || tokenizer.eot_id() != expected_eot)
    fail_usage(path + " gives tokenizer '" + tokenizer.name() + "' a vocabulary of " +
                   std::to_string(tokenizer.vocab_size()) + " with end-of-text id " +
                   std::to_string(tokenizer.eot_id()) + ", expected " + std::to_string(expected) +
                   " and " + std::to_string(expected_eot),
               "delete it and run scripts/fetch-data.sh tokenizers (or make data) to fetch the "
               "pinned version");
}

std::unique_ptr<Tokenizer> make_bytes(const std::string& /*data_dir*/) {
  return std::make_unique<BytesTokenizer>();
}

std::unique_ptr<Tokenizer> make_gpt2(const std::string& data_dir) {
  const std::string encoder = require_file("gpt2", data_dir, "tokenizers/gpt2/encoder.json");
  const std::string merges = require_file("gpt2", data_dir, "tokenizers/gpt2/vocab.bpe");
  auto tokenizer = load_gpt2_tokenizer(encoder, merges, "gpt2", "<|endoftext|>");
  check_vocab(*tokenizer, 50257, 50256, encoder);
  return tokenizer;
}

std::unique_ptr<Tokenizer> make_llama3(const std::string& data_dir) {
  const std::string path = require_file("llama3", data_dir, "tokenizers/llama3/tokenizer.json");
  auto tokenizer = load_hf_tokenizer(path, "llama3", "<|end_of_text|>");
  check_vocab(*tokenizer, 128256, 128001, path);
  return tokenizer;
}

// As bpe.cpp's limit for the files it reads.
constexpr int64_t kMaxModelTokenizerBytes = int64_t{256} << 20;

// A model folder's tokenizer.json: the end-of-text token is the first of the names the
// published byte-level tokenizers use that the file defines.
std::unique_ptr<Tokenizer> make_file_tokenizer(const std::string& path) {
  const std::string text = read_input_file(path, "tokenizer file", kMaxModelTokenizerBytes);
  static const char* const kEndOfText[] = {"<|end_of_text|>", "<|endoftext|>", "</s>", "[SEP]"};
  for (const char* eot : kEndOfText)
    if (text.find(std::string("\"") + eot + "\"") != std::string::npos)
      return parse_hf_tokenizer(text, path, path, eot);
  fail_usage("tokenizer file " + path +
                 " defines none of the end-of-text tokens gradscope knows "
                 "(<|end_of_text|>, <|endoftext|>, </s>, [SEP])",
             "pass --tokenizer with one of `gradscope list`'s tokenizers instead");
}

}  // namespace

bool is_tokenizer_file(const std::string& name) {
  return name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& data_dir) {
  if (is_tokenizer_file(name)) return make_file_tokenizer(name);
  return tokenizer_registry().get(name).make(data_dir);
}

int64_t tokenizer_vocab_size(const std::string& name) {
  if (is_tokenizer_file(name)) return make_file_tokenizer(name)->vocab_size();
  return tokenizer_registry().get(name).vocab_size;
}

std::string tokenizer_json_of(const std::string& name, const std::string& data_dir) {
  if (is_tokenizer_file(name)) return name;
  if (name == "llama3") return data_dir + "/tokenizers/llama3/tokenizer.json";
  return "";
}

const Registry<TokenizerEntry>& tokenizer_registry() {
  static const Registry<TokenizerEntry> registry = [] {
    Registry<TokenizerEntry> r("tokenizer");
    r.add("bytes", "UTF-8 bytes + BOS/EOS/PAD/MASK (no files)", {&make_bytes, kBytesVocabSize});
    r.add("gpt2", "GPT-2 byte-level BPE (encoder.json + vocab.bpe)", {&make_gpt2, 50257});
    r.add("llama3", "Llama 3 byte-level BPE (HF tokenizer.json)", {&make_llama3, 128256});
    return r;
  }();
  return registry;
}

}  // namespace gradscope
