// Reading a model's architecture (a JSON object with Hugging Face config names) with errors
// that name the model and the key: a missing or mistyped value is a usage error, not a
// JSON exception deep in a constructor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace gradscope {

class ArchReader {
 public:
  // `model` names the architecture in messages ("vit architecture lacks 'hidden_size'").
  ArchReader(const nlohmann::json& arch, std::string model);

  // An integer; integral floats (64.0) are accepted, 64.5 is not silently truncated.
  int64_t integer(const char* key, std::optional<int64_t> fallback = {}) const;
  // An integer > 0.
  int64_t positive(const char* key, std::optional<int64_t> fallback = {}) const;
  double number(const char* key, std::optional<double> fallback = {}) const;
  // A probability in [0, 1).
  double dropout(const char* key, double fallback = 0.0) const;
  bool flag(const char* key, bool fallback) const;
  std::string text(const char* key, std::optional<std::string> fallback = {}) const;
  // The value at `key`, or nullptr when absent or null.
  const nlohmann::json* find(const char* key) const;

  // Throws a usage error "<model> architecture: <message>" unless `ok`.
  void check(bool ok, const std::string& message) const;
  [[noreturn]] void fail(const std::string& message) const;

 private:
  const nlohmann::json& arch_;
  std::string model_;
};

// The largest size an architecture may give each of its size keys (vocab_size 4,194,304,
// num_hidden_layers 1,024, ...; docs/weights.md, "Limits"), far above any published model's
// and low enough that a model's list of tensors and the loops over its layers stay small.
// check_arch_limit: a usage error naming `source` ("config.json", "--arch") and the key
// (`shown_as` when the source spells it otherwise) when `value` of architecture key `key` is a
// number above the key's limit; other keys and types are left to the model's own reader.
// check_arch_limits checks every key of `arch` so.
void check_arch_limit(const nlohmann::json& value, const std::string& key,
                      const std::string& source, const std::string& shown_as = "");
void check_arch_limits(const nlohmann::json& arch, const std::string& source);

}  // namespace gradscope
