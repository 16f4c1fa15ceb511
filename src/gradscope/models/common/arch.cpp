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

}  // namespace gradscope
