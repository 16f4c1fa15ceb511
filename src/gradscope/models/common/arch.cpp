#include "gradscope/models/common/arch.h"

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {

using nlohmann::json;

ArchReader::ArchReader(const json& arch, std::string model)
    : arch_(arch), model_(std::move(model)) {
  check(arch_.is_object(), "must be a JSON object, got " + arch_.dump());
}

const json* ArchReader::find(const char* key) const {
  auto it = arch_.find(key);
  if (it == arch_.end() || it->is_null()) return nullptr;
  return &*it;
}

void ArchReader::fail(const std::string& message) const {
  fail_usage(fmt::format("{} architecture: {}", model_, message),
             fmt::format("the architecture uses Hugging Face config names; start from a preset "
                         "(gradscope list shows {}'s) and change keys with --arch NAME=VALUE",
                         model_));
}

void ArchReader::check(bool ok, const std::string& message) const {
  if (!ok) fail(message);
}

int64_t ArchReader::integer(const char* key, std::optional<int64_t> fallback) const {
  const json* v = find(key);
  if (!v) {
    if (fallback) return *fallback;
    fail(fmt::format("lacks '{}'", key));
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
  }
  fail(fmt::format("'{}' must be an integer, got {}", key, v->dump()));
}

int64_t ArchReader::positive(const char* key, std::optional<int64_t> fallback) const {
  const int64_t value = integer(key, fallback);
  check(value > 0, fmt::format("'{}' must be positive, got {}", key, value));
  return value;
}

double ArchReader::number(const char* key, std::optional<double> fallback) const {
  const json* v = find(key);
  if (!v) {
    if (fallback) return *fallback;
    fail(fmt::format("lacks '{}'", key));
  }
  check(v->is_number(), fmt::format("'{}' must be a number, got {}", key, v->dump()));
  return v->get<double>();
}

double ArchReader::dropout(const char* key, double fallback) const {
  const double p = number(key, fallback);
  check(p >= 0 && p < 1, fmt::format("'{}' must lie in [0, 1), got {}", key, p));
  return p;
}

bool ArchReader::flag(const char* key, bool fallback) const {
  const json* v = find(key);
  if (!v) return fallback;
  check(v->is_boolean(), fmt::format("'{}' must be true or false, got {}", key, v->dump()));
  return v->get<bool>();
}

std::string ArchReader::text(const char* key, std::optional<std::string> fallback) const {
  const json* v = find(key);
  if (!v) {
    if (fallback) return *fallback;
    fail(fmt::format("lacks '{}'", key));
  }
  check(v->is_string(), fmt::format("'{}' must be a string, got {}", key, v->dump()));
  return v->get<std::string>();
}

namespace {

struct SizeLimit {
  const char* key;
  int64_t max;
};

// Published models use vocabularies up to about 262k tokens, hidden sizes up to 16k and up to
// 126 layers; each limit is a factor of 8 to 16 above the largest.
constexpr SizeLimit kSizeLimits[] = {
    {"vocab_size", int64_t{1} << 22},
    {"hidden_size", int64_t{1} << 16},
    {"vision_hidden_size", int64_t{1} << 16},
    {"intermediate_size", int64_t{1} << 18},
    {"vision_intermediate_size", int64_t{1} << 18},
    {"num_hidden_layers", 1024},
    {"vision_num_hidden_layers", 1024},
    {"num_attention_heads", 1024},
    {"num_key_value_heads", 1024},
    {"vision_num_attention_heads", 1024},
    {"head_dim", 4096},
    {"global_attn_every_n_layers", 1024},
    {"local_attention", int64_t{1} << 20},
    {"image_size", 8192},
    {"patch_size", 8192},
    {"num_channels", 64},
    {"num_labels", int64_t{1} << 20},
    {"pixel_shuffle_factor", 64},
    {"seq_len", int64_t{1} << 20},
};

const SizeLimit* limit_of(const std::string& key) {
  for (const SizeLimit& limit : kSizeLimits)
    if (key == limit.key) return &limit;
  return nullptr;
}

}  // namespace

void check_arch_limit(const json& value, const std::string& key, const std::string& source,
                      const std::string& shown_as) {
  const SizeLimit* limit = limit_of(key);
  if (!limit) return;
  bool over = false;
  if (value.is_number_unsigned())
    over = value.get<uint64_t>() > static_cast<uint64_t>(limit->max);
  else if (value.is_number_integer())
    over = value.get<int64_t>() > limit->max;
  else if (value.is_number_float())
    over = !(value.get<double>() <= static_cast<double>(limit->max));
  if (over)
    fail_usage(fmt::format("{}: '{}' is {}, more than the {} gradscope allows", source,
                           shown_as.empty() ? key : shown_as, value.dump(), limit->max),
               "check the value: it is far larger than any published model's (docs/weights.md, "
               "\"Limits\")");
}

void check_arch_limits(const json& arch, const std::string& source) {
  if (!arch.is_object()) return;
  for (const auto& [key, value] : arch.items()) check_arch_limit(value, key, source);
}

}  // namespace gradscope
